"""Compact frontier directories (`perseus.io.frontier_dir`: every point's clocks in one
``plans.npz``) and the job's frontier store (`perseus.schedulers.perseus_scheduler.plan_model.store_frontier`: a new
directory renamed over the old one, `perseus.io.atomic.replace_dir`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from paths import REPO
from typer.testing import CliRunner

from perseus.cli import app
from perseus.domain.schedule import make_schedule
from perseus.errors import PlanError
from perseus.io.atomic import replace_dir
from perseus.io.frontier_dir import (
    COMPACT_PLANS,
    frontier_plan_file,
    read_frontier_dir,
    read_frontier_table,
)
from perseus.io.plan_file import load_plan
from perseus.io.profile_csv import load_profile
from perseus.planning import Frontier, FrontierPoint, solve_frontier
from perseus.schedulers.perseus_scheduler.plan_model import store_frontier

PROFILE = REPO / "perseus" / "profiles" / "bloom_a40_8stage.csv"


@pytest.fixture(scope="module")
def frontiers() -> tuple[Frontier, Frontier]:
    """Two different frontiers of one 8-stage pipeline (another blocking power)."""
    profile = load_profile(PROFILE)
    schedule = make_schedule("1f1b", 8, 4)
    return tuple(  # type: ignore[return-value]
        solve_frontier(profile, schedule, p2p_power_w=w, max_points=12, switch_latency_s=0.002)
        for w in (60.0, 90.0)
    )


def _same(a: Frontier, b: Frontier) -> bool:
    return (
        a.points == b.points
        and a.all_max is not None
        and b.all_max is not None
        and a.all_max.frequencies == b.all_max.frequencies
        and (a.p2p_power_w, a.switch_latency_s, a.hop_latency_s)
        == (b.p2p_power_w, b.switch_latency_s, b.hop_latency_s)
    )


def test_a_compact_directory_reads_back_the_same_frontier_and_plans(frontiers, tmp_path):
    frontier = frontiers[0]
    frontier.write(tmp_path / "files")
    frontier.write(tmp_path / "compact", compact=True)
    assert not (tmp_path / "compact" / "plans").exists()
    assert (tmp_path / "compact" / COMPACT_PLANS).is_file()
    assert _same(Frontier.read(tmp_path / "compact"), frontier)
    assert _same(Frontier.read(tmp_path / "files"), frontier)  # the plan-file layout reads too
    # Every point's plan, built from the archive, is the plan file the other layout holds.
    assert [r.plan for r in read_frontier_dir(tmp_path / "compact")] == [
        r.plan for r in read_frontier_dir(tmp_path / "files")
    ]
    assert read_frontier_table(tmp_path / "compact") == read_frontier_table(tmp_path / "files")


def test_perseus_choose_writes_the_chosen_plan_of_a_compact_directory(frontiers, tmp_path):
    frontiers[0].write(tmp_path / "files")
    frontiers[0].write(tmp_path / "compact", compact=True)
    result = CliRunner().invoke(app, ["choose", str(tmp_path / "compact"), "--max-slowdown", "0.1"])
    assert result.exit_code == 0, result.output
    path = Path(result.stdout.strip())
    assert path.is_file() and path.parent == tmp_path / "compact" / "plans"
    assert load_plan(path) == load_plan(tmp_path / "files" / "plans" / path.name)
    table = read_frontier_table(tmp_path / "compact")
    assert (
        frontier_plan_file(tmp_path / "compact", table, 0) == tmp_path / "compact" / table.plan[0]
    )


def test_each_layout_written_over_the_other_is_the_one_read(frontiers, tmp_path):
    a, b = frontiers
    a.write(tmp_path, compact=True)
    b.write(tmp_path)  # plan files: the archive, which would win, is removed
    assert not (tmp_path / COMPACT_PLANS).exists() and _same(Frontier.read(tmp_path), b)
    a.write(tmp_path, compact=True)  # the archive: the plan files are removed
    assert not list((tmp_path / "plans").glob("plan_*.json"))
    assert _same(Frontier.read(tmp_path), a)


def test_an_archive_that_does_not_match_its_table_is_refused(frontiers, tmp_path):
    frontiers[0].write(tmp_path, compact=True)
    path = tmp_path / COMPACT_PLANS
    with np.load(path) as data:
        arrays = dict(data)
    short = {k: arrays[k][:2] for k in ("frequencies", "compute_energy")}
    np.savez_compressed(path, **{**arrays, **short})
    with pytest.raises(PlanError, match="holds 2 point"):
        Frontier.read(tmp_path)
    path.write_bytes(b"not an archive")
    with pytest.raises(PlanError, match="not a frontier's clock archive"):
        Frontier.read(tmp_path)


def test_a_frontier_of_16_stages_x_256_microbatches_is_stored_in_a_few_mb(tmp_path):
    """500 points of 8,192 instructions (random clocks: the worst case for compression) in
    a plan file each took ~0.5 GB; the archive holds them in a few MB."""
    schedule = make_schedule("1f1b", 16, 256)
    rng = np.random.default_rng(0)
    clocks = np.arange(210, 1411, 15)
    points = [
        FrontierPoint(1.0 + k, 100.0 - k / 10, 90.0, list(rng.choice(clocks, size=(16, 512))))
        for k in range(500)
    ]
    all_max = FrontierPoint(1.0, 100.0, 90.0, [[1410] * 512] * 16)
    frontier = Frontier(points, schedule=schedule, p2p_power_w=70.0, all_max=all_max)
    frontier.write(tmp_path, compact=True)
    size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    assert size < 50 * 2**20
    assert Frontier.read(tmp_path).points[499] == points[499]


def test_a_failed_store_leaves_the_job_s_frontier_whole(frontiers, tmp_path):
    """The job's frontier is rewritten into a new directory and renamed over the old one: a
    write that fails half-way (here: a point that is not a plan of this pipeline) leaves
    the old frontier as it was, and nothing beside it."""
    a, b = frontiers
    out = tmp_path / "frontier"
    store_frontier(a, out)
    assert _same(Frontier.read(out), a)
    broken = Frontier(
        [*b.points[:3], FrontierPoint(9.0, 1.0, 1.0, [[1410]] * 8)],
        schedule=b.schedule,
        p2p_power_w=b.p2p_power_w,
        all_max=b.all_max,
    )
    with pytest.raises(Exception):  # noqa: B017 - whatever the write raises
        store_frontier(broken, out)
    assert _same(Frontier.read(out), a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frontier"]
    store_frontier(b, out)
    assert _same(Frontier.read(out), b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frontier"]


def test_replace_dir_puts_the_new_directory_in_place(tmp_path):
    new, path = tmp_path / "new", tmp_path / "path"
    new.mkdir()
    (new / "a").write_text("new")
    replace_dir(new, path)  # nothing there before: one rename
    assert (path / "a").read_text() == "new" and not new.exists()
    new.mkdir()
    (new / "b").write_text("newer")
    replace_dir(new, path)
    assert sorted(p.name for p in path.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["path"]
