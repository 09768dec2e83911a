"""`JobDir`: the one owner of every file name under ``dump_dir/<job_id>/``.

```
dump_dir/<job_id>/
├── job.json                 the job's record (its id included)        coordinator, dump_data
├── scheduler.json           the scheduler's name and arguments         coordinator, dump_data
├── ranks.json               every rank's RankInfo                      coordinator, dump_data
├── N.sched.json             round N's FrequencySchedules               coordinator, dump_data
├── N.prof.json              round N's ProfilingResults                 coordinator, dump_data
├── deployed_plan.json       the plan the scheduler deployed            coordinator, dump_data
├── evicted                  marker: the job was evicted (not restored) coordinator, dump_data
├── instruction_profile.csv  the profile a sweep measured               scheduler, always
└── frontier/                the solved time–energy frontier            scheduler, always
```

There is one job directory, ``dump_dir/<job_id>``. `dump_data` decides whether the
coordinator dumps its state there; the schedulers' products (profile, frontier) are
written there whether or not it is on.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["JobDir"]

_ROUND_FILE = re.compile(r"(\d+)\.sched\.json")


class JobDir:
    """The paths of one job's files (nothing is created until something is written)."""

    JOB = "job.json"
    SCHEDULER = "scheduler.json"
    RANKS = "ranks.json"
    DEPLOYED_PLAN = "deployed_plan.json"
    EVICTED = "evicted"
    PROFILE = "instruction_profile.csv"
    FRONTIER = "frontier"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, dump_dir: str | os.PathLike[str], job_id: str) -> JobDir:
        """The directory of job `job_id` under `dump_dir`."""
        return cls(Path(dump_dir) / job_id)

    @classmethod
    def restorable(cls, dump_dir: str | os.PathLike[str]) -> list[JobDir]:
        """The job directories under `dump_dir` a restarted coordinator restores, by name:
        those with a job record and not evicted."""
        root = Path(dump_dir)
        if not root.is_dir():
            return []
        dirs = (cls(p) for p in sorted(root.iterdir()))
        return [d for d in dirs if d.job.is_file() and not d.evicted.exists()]

    def __repr__(self) -> str:
        return f"JobDir({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    @property
    def name(self) -> str:
        """The directory's name: the job id."""
        return self.path.name

    @property
    def job(self) -> Path:
        return self.path / self.JOB

    @property
    def scheduler(self) -> Path:
        return self.path / self.SCHEDULER

    @property
    def ranks(self) -> Path:
        return self.path / self.RANKS

    @property
    def deployed_plan(self) -> Path:
        return self.path / self.DEPLOYED_PLAN

    @property
    def evicted(self) -> Path:
        return self.path / self.EVICTED

    @property
    def profile(self) -> Path:
        return self.path / self.PROFILE

    @property
    def frontier(self) -> Path:
        return self.path / self.FRONTIER

    def schedules(self, round_number: int) -> Path:
        """Round `round_number`'s schedules (``N.sched.json``)."""
        return self.path / f"{round_number}.sched.json"

    def results(self, round_number: int) -> Path:
        """Round `round_number`'s profiling results (``N.prof.json``)."""
        return self.path / f"{round_number}.prof.json"

    def rounds(self) -> list[int]:
        """The round numbers whose schedules were dumped, ascending."""
        if not self.path.is_dir():
            return []
        found = (_ROUND_FILE.fullmatch(p.name) for p in self.path.iterdir())
        return sorted(int(m.group(1)) for m in found if m)
