"""`JobDir` owns the file names under ``dump_dir/<job_id>/``; the seed helpers use them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from perseus.io.jobdir import JobDir
from perseus.protocol import RankInfo, save_ranks


def test_job_dir_names_every_file(tmp_path: Path) -> None:
    d = JobDir.of(tmp_path, "job-1")
    assert d.path == tmp_path / "job-1" and d.name == "job-1"
    assert [p.name for p in (d.job, d.scheduler, d.ranks, d.deployed_plan, d.evicted)] == [
        "job.json",
        "scheduler.json",
        "ranks.json",
        "deployed_plan.json",
        "evicted",
    ]
    assert (d.profile.name, d.frontier.name) == ("instruction_profile.csv", "frontier")
    assert (d.schedules(3).name, d.results(3).name) == ("3.sched.json", "3.prof.json")


def test_rounds_and_restorable(tmp_path: Path) -> None:
    a, b, c = (JobDir.of(tmp_path, n) for n in ("a", "b", "c"))
    assert a.rounds() == [] and JobDir.restorable(tmp_path / "missing") == []
    for d in (a, b, c):
        d.path.mkdir()
    for n in (0, 2, 10):
        a.schedules(n).write_text("[]")
    a.results(0).write_text("[]")
    assert a.rounds() == [0, 2, 10]
    a.job.write_text("{}")
    b.job.write_text("{}")
    b.evicted.write_text("idle\n")
    c.job.write_text("{}")
    c.failed.write_text("409 Round 3 timed out\n")
    assert b.ended and c.ended and not a.ended
    assert JobDir.restorable(tmp_path) == [a], "evicted and failed jobs stay down"
    a.finished.write_text("finished\n")
    assert a.ended and JobDir.restorable(tmp_path) == [], "a finished job stays down too"


def test_prune_rounds_keeps_the_last_n_rounds(tmp_path: Path) -> None:
    d = JobDir.of(tmp_path, "job")
    assert d.prune_rounds(3) == []  # no directory yet
    d.path.mkdir()
    for n in (0, 1, 2, 5, 9, 10):
        d.schedules(n).write_text("[]")
        d.results(n).write_text("[]")
    d.job.write_text("{}")
    d.deployed_plan.write_text("{}")
    assert d.prune_rounds(0) == [] and d.rounds() == [0, 1, 2, 5, 9, 10]  # 0 keeps all
    deleted = d.prune_rounds(3)
    assert sorted(p.name for p in deleted) == sorted(
        f"{n}.{kind}.json" for n in (0, 1, 2) for kind in ("sched", "prof")
    )
    assert d.rounds() == [5, 9, 10] and d.results(5).is_file()
    assert d.job.is_file() and d.deployed_plan.is_file()
    assert d.prune_rounds(3) == [] and d.prune_rounds(10) == []


def test_prune_rounds_never_deletes_the_protected_rounds(tmp_path: Path) -> None:
    d = JobDir.of(tmp_path, "job")
    d.path.mkdir()
    for n in range(12):
        d.schedules(n).write_text("[]")
        d.results(n).write_text("[]")
    deleted = d.prune_rounds(2, protect={1, 2, 7})
    assert d.rounds() == [1, 2, 7, 10, 11]
    assert all(d.results(n).is_file() for n in (1, 2, 7, 10, 11))
    assert len(deleted) == 2 * 7


def test_seed_helpers_write_job_dir_names(tmp_path: Path) -> None:
    ranks = [RankInfo(rank=0, dp_rank=0, pp_rank=0, tp_rank=0, available_frequencies=[1])]
    asyncio.run(save_ranks(ranks, tmp_path))
    assert JobDir(tmp_path).ranks.is_file()
