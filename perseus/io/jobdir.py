"""`JobDir`: the one owner of every file name under ``dump_dir/<job_id>/``.

```
dump_dir/<job_id>/
├── job.json                 the job's record (its id included)        coordinator, dump_data
├── scheduler.json           the scheduler's name and arguments         coordinator, dump_data
├── ranks.json               every rank's RankInfo                      coordinator, dump_data
├── ranks.partial.jsonl      RankInfos so far, one a line (registering) coordinator, dump_data
├── N.sched.json             round N's FrequencySchedules               coordinator, dump_data
├── N.prof.json              round N's ProfilingResults                 coordinator, dump_data
├── deployed_plan.json       the plan the scheduler deployed            coordinator, dump_data
├── baseline_plan.json       all-max, scored by the same model          coordinator, dump_data
├── evicted                  marker: the job was evicted (not restored) coordinator, dump_data
├── failed                   marker + reason: the job failed (not restored) coordinator, dump_data
├── finished                 marker: the job ended normally (not restored) coordinator, dump_data
├── instruction_profile.csv  the profile a sweep measured               scheduler, always
├── profiling.json           what the sweep cost and how sure it is     scheduler, always
├── frontier/                the solved time–energy frontier            scheduler, always
├── promise.jsonl            deployments and the guard's checks/moves   scheduler, always
├── promise.1.jsonl          the record before, once it was rotated     scheduler, always
└── guard.json               the guard's all-max rounds and state       scheduler, dump_data
```

There is one job directory, ``dump_dir/<job_id>``. `dump_data` decides whether the
coordinator dumps its state there; the schedulers' products (profile, frontier) are
written there whether or not it is on. Only the last `dump_keep_rounds` rounds' ``N.sched.json``
and ``N.prof.json`` are kept, and the rounds the job's energy report is made from, which the
coordinator names (`prune_rounds`'s `protect`: its latest all-max and deployed rounds); a
restarted coordinator needs only the last round's number, the ranks and the deployed plan,
and (`Perseus`) ``guard.json``, so that its guard goes on watching the plan.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from pathlib import Path

__all__ = ["JobDir"]

_ROUND_FILE = re.compile(r"(\d+)\.sched\.json")
_ROUND_DATA = re.compile(r"(\d+)\.(?:sched|prof)\.json")


class JobDir:
    """The paths of one job's files (nothing is created until something is written)."""

    JOB = "job.json"
    SCHEDULER = "scheduler.json"
    RANKS = "ranks.json"
    REGISTERING = "ranks.partial.jsonl"
    DEPLOYED_PLAN = "deployed_plan.json"
    BASELINE_PLAN = "baseline_plan.json"
    EVICTED = "evicted"
    FAILED = "failed"
    FINISHED = "finished"
    PROFILE = "instruction_profile.csv"
    PROFILING = "profiling.json"
    FRONTIER = "frontier"
    PROMISE = "promise.jsonl"
    PROMISE_BEFORE = "promise.1.jsonl"
    GUARD = "guard.json"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, dump_dir: str | os.PathLike[str], job_id: str) -> JobDir:
        """The directory of job `job_id` under `dump_dir`."""
        return cls(Path(dump_dir) / job_id)

    @classmethod
    def restorable(cls, dump_dir: str | os.PathLike[str]) -> list[JobDir]:
        """The job directories under `dump_dir` a restarted coordinator restores, by name:
        those with a job record, neither evicted nor failed (those stay down)."""
        root = Path(dump_dir)
        if not root.is_dir():
            return []
        dirs = (cls(p) for p in sorted(root.iterdir()))
        return [d for d in dirs if d.job.is_file() and not d.ended]

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
    def registering(self) -> Path:
        """The ranks registered so far, one JSON line each, until ``ranks.json`` is written."""
        return self.path / self.REGISTERING

    def append_registration(self, line: str) -> None:
        """Append one rank's registration (a JSON line) to `registering`: a single
        ``write(2)`` with ``O_APPEND``, so concurrent appends never interleave."""
        self.path.mkdir(parents=True, exist_ok=True)
        data = (line if line.endswith("\n") else line + "\n").encode()
        fd = os.open(self.registering, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    @property
    def deployed_plan(self) -> Path:
        return self.path / self.DEPLOYED_PLAN

    @property
    def baseline_plan(self) -> Path:
        """The all-max plan scored by the model that scored the deployed plan (the report's
        predicted baseline)."""
        return self.path / self.BASELINE_PLAN

    @property
    def evicted(self) -> Path:
        return self.path / self.EVICTED

    @property
    def failed(self) -> Path:
        return self.path / self.FAILED

    @property
    def finished(self) -> Path:
        return self.path / self.FINISHED

    @property
    def ended(self) -> bool:
        """The job was evicted, failed or finished: a restarted coordinator leaves it down."""
        return self.evicted.exists() or self.failed.exists() or self.finished.exists()

    @property
    def profile(self) -> Path:
        return self.path / self.PROFILE

    @property
    def profiling(self) -> Path:
        """What the profiling sweep cost (rounds, seconds, energy) and how sure its
        estimates are (`perseus.schedulers.sweep.instruction_sweep.InstructionSweep.report`)."""
        return self.path / self.PROFILING

    @property
    def promise(self) -> Path:
        """The `Perseus` scheduler's deployments, checks and moves, one JSON object a line."""
        return self.path / self.PROMISE

    @property
    def promise_before(self) -> Path:
        """The events before those of `promise`, once it grew past its bound and was
        rotated (`perseus.schedulers.perseus_scheduler.story.MAX_RECORD_BYTES`)."""
        return self.path / self.PROMISE_BEFORE

    @property
    def guard(self) -> Path:
        """What the `Perseus` scheduler's guard needs after a restart (bounded: its newest
        all-max rounds, its state and back-off), written atomically."""
        return self.path / self.GUARD

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

    def prune_rounds(self, keep: int, protect: Collection[int] = ()) -> list[Path]:
        """Delete the schedules and results of every round but the last `keep` (the
        newest ``N.sched.json``'s N and the `keep` - 1 before it) and the rounds in
        `protect` (those a report is made from); 0 keeps everything. Returns the deleted
        paths; a file that vanished meanwhile is skipped."""
        if keep <= 0 or not self.path.is_dir():
            return []
        rounds = self.rounds()
        if len(rounds) <= keep:
            return []
        oldest_kept = rounds[-keep]
        kept = frozenset(protect)
        deleted = []
        for p in self.path.iterdir():
            m = _ROUND_DATA.fullmatch(p.name)
            if m and int(m.group(1)) < oldest_kept and int(m.group(1)) not in kept:
                try:
                    p.unlink()
                except FileNotFoundError:
                    continue
                deleted.append(p)
        return sorted(deleted)
