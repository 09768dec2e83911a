"""A restarted coordinator keeps the promise guard (issue 49, item 3).

A real coordinator (`perseus serve` in a subprocess) runs `Perseus` with a given profile; a
simulated 2-stage job on emulated GPUs (`server_fixtures.SimulatedJob`) measures its all-max
rounds, gets its plan and the guard's first check. The coordinator is then killed with
SIGKILL after the deployment and started again on the same port and dump dir: it reads the
guard's state back from ``guard.json``, the guard checks the plan again against the all-max
rounds measured before the restart, reference rounds go on, and the job ends ``finished``.
Before issue 49 a resumed plan ran unwatched (``guarded = False``).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from server_fixtures import F_MAX, GroundTruth, SimulatedJob, stage_freqs, write_truth_profile

from perseus.demo import Coordinator
from perseus.io.jobdir import JobDir
from perseus.protocol import FINISH_URL

M = 3
TRUTH = GroundTruth([0.010, 0.016])
"""Two stages, the second the slower: the first has slack the plan turns into savings."""
BEFORE = 14
"""Rounds before the kill: a warm-up and 4 all-max rounds, the plan from round 5, the
guard's first check at round 10 (one settling round, a window of 4)."""
AFTER = 12
"""Rounds after the restart: one settling round, a window of 4, and a reference round."""


def _events(job_dir: JobDir) -> list[dict]:
    return [json.loads(line) for line in job_dir.promise.read_text().splitlines()]


def test_the_guard_checks_the_plan_again_after_kill_9_and_the_job_finishes(
    tmp_path: Path,
) -> None:
    profile = write_truth_profile(TRUTH, 2, tmp_path / "truth.csv")
    coordinator = Coordinator(
        scheduler="Perseus",
        scheduler_args={
            "num_microbatches": M,
            "max_slowdown": 0.02,
            "profile_path": str(profile),
            "p2p_power": TRUTH.p2p_power_w,
        },
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "1"},
    )
    with coordinator:
        job = SimulatedJob(coordinator.url, TRUTH, pp=2, num_microbatches=M)
        job.run_sync(BEFORE)
        job_dir = JobDir.of(tmp_path / "dump", job.job_id or "")
        before = _events(job_dir)
        assert [e["event"] for e in before][:2] == ["deployed", "check"], before
        assert "keeps the plan" in before[1]["reason"]
        saved = json.loads(job_dir.guard.read_text())
        assert saved["guard"]["state"] == "kept" and len(saved["guard"]["baseline"]) >= 4
        plan = job.history[-1]
        assert any(set(stage_freqs(plan, r)) != {F_MAX} for r in plan), "a plan, not all-max"

        coordinator.kill()  # after the deployment: nothing flushed
        coordinator.start()  # same port, same dump dir
        job.base_url = coordinator.url
        job.run_sync(AFTER)  # the same ranks of the same job keep asking
        finished = httpx.post(
            coordinator.url + FINISH_URL.format(job_id=job.job_id), headers=job.headers
        )
        assert finished.status_code == 200, finished.text
    after = _events(job_dir)[len(before) :]
    assert after[0]["event"] == "resumed", after
    assert "checks the plan again" in after[0]["reason"], after[0]
    checks = [e for e in after if e["event"] == "check"]
    assert checks and "keeps the plan" in checks[0]["reason"], after
    assert checks[0]["round"] > BEFORE  # round numbers went on from the dump's
    assert not [e for e in after if e["event"] in ("move", "fallback", "held")], after
    # The restored coordinator ran the plan, with the guard's all-max reference rounds.
    ran = job.history[BEFORE:]
    top = [h for h in ran if all(set(stage_freqs(h, r)) == {F_MAX} for r in h)]
    assert top and len(top) <= 2, "reference rounds go on (every 10th round)"
    assert all(h == plan for h in ran if h not in top)
    assert job_dir.finished.is_file() and not job_dir.failed.exists()
