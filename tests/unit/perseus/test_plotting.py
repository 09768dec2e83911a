"""Timelines draw every instruction kind, one row per pipeline rank, whatever the schedule."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.planning import make_plan, max_frequencies, solve_frontier
from perseus.plotting import (
    _HATCH,
    _MAX_LABELS,
    _frontier_figure,
    _timeline_figure,
    plot_frontier,
    plot_timeline,
)

PNG = b"\x89PNG\r\n\x1a\n"


def _profile(num_stages: int) -> InstructionProfile:
    """Two clocks per (stage, kind); F, B and the split backward's I and W."""
    rows = [
        (s, kind, f, t * (1 + s / 10) * (1000 / f), t * (1 + s / 10) * (f / 100))
        for s in range(num_stages)
        for kind, t in (
            ("forward", 1.0),
            ("backward", 2.0),
            ("backward_input", 1.0),
            ("backward_weight", 1.0),
        )
        for f in (1000, 800)
    ]
    frame = pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
    return InstructionProfile.from_frame(frame, source="plot-test")


def _zbv(S: int, M: int) -> PipelineSchedule:
    """A V-shaped split-backward order (rank r holds stages r and 2S-1-r), GPipe-like."""
    orders = []
    for r in range(S):
        down, up = r, 2 * S - 1 - r
        order = [(down, "forward", j) for j in range(M)] + [(up, "forward", j) for j in range(M)]
        for stage in (up, down):
            for j in range(M):
                order += [(stage, "backward_input", j), (stage, "backward_weight", j)]
        orders.append(order)
    return PipelineSchedule.from_orders("zbv-like", orders, M)


@pytest.mark.parametrize(
    "schedule",
    [
        make_schedule("zb", 3, 4),
        make_schedule("interleaved", 2, 2, num_chunks=2),
        _zbv(2, 2),
    ],
    ids=["zb", "interleaved", "zbv-like"],
)
def test_timeline_draws_each_kind_on_its_rank(schedule: PipelineSchedule, tmp_path: Path) -> None:
    profile = _profile(schedule.num_stages)  # one stage per rank: split over its stages
    plan = make_plan(profile, schedule, max_frequencies(profile, schedule), 50.0)
    fig = _timeline_figure(profile, plan, title=None)
    ax = fig.axes[0]
    drawn: Counter[tuple[int, str | None]] = Counter()
    for coll in ax.collections:
        if coll.get_hatch() is None and coll.get_array() is None:
            continue  # a chunk strip, not an instruction box
        for path in coll.get_paths():
            ys = path.vertices[:, 1]
            drawn[(round((ys.min() + ys.max()) / 2), coll.get_hatch())] += 1
    expected = Counter(
        (instr.rank, _HATCH[instr.kind]) for order in schedule.orders for instr in order
    )
    assert drawn == expected
    chunked = schedule.num_chunks > 1
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert [t.splitlines()[0] for t in ticks] == [f"rank {r}" for r in range(schedule.num_stages)]
    if chunked:  # the row names the rank's stages, in chunk order
        for r, tick in enumerate(ticks):
            stages = [s for s, rank in enumerate(schedule.stage_ranks) if rank == r]
            assert tick.splitlines()[1] == f"stages {', '.join(map(str, stages))}"
    legend = ax.get_legend()
    assert legend is not None
    chunks = [f"chunk {c}" for c in range(schedule.num_chunks)] if chunked else []
    assert [t.get_text() for t in legend.get_texts()] == schedule.instruction_kinds() + chunks
    # The legend sits below the axes, off the data.
    assert legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).y1 < 0
    # Kinds are told apart: no two share a hatch.
    assert len(set(_HATCH.values())) == len(_HATCH)
    out = plot_timeline(profile, plan, tmp_path / "timeline.png")
    assert out.read_bytes()[:8] == PNG


@pytest.mark.parametrize("num_microbatches", [4, 48])
def test_timeline_draws_a_collection_per_kind_not_an_artist_per_instruction(
    num_microbatches: int,
) -> None:
    schedule = make_schedule("interleaved", 4, num_microbatches, num_chunks=2)
    profile = _profile(schedule.num_stages)
    plan = make_plan(profile, schedule, max_frequencies(profile, schedule), 50.0)
    n = sum(len(order) for order in schedule.orders)
    ax = _timeline_figure(profile, plan, title=None).axes[0]
    kinds = len(schedule.instruction_kinds())
    # One collection per kind and one per chunk strip, whatever the instruction count.
    assert len(ax.collections) == kinds + schedule.num_chunks
    assert sum(len(c.get_paths()) for c in ax.collections) == n * 2  # boxes and strips
    assert not ax.patches
    assert len(ax.texts) <= (n if n <= _MAX_LABELS else 0)


def test_frontier_marks_all_max_no_slowdown_and_chosen(tmp_path: Path) -> None:
    schedule = make_schedule("1f1b", 2, 3)
    solve_frontier(_profile(2), schedule, p2p_power_w=50.0).write(tmp_path)
    marks = {
        "baseline": (2.0, 30.0),
        "no_slowdown": (1.9, 29.0),
        "chosen": (2.1, 28.0),
    }
    ax = _frontier_figure(tmp_path, **marks, chosen_label="deployed plan", title=None).axes[0]
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:2] == ["LP lower bound", "Perseus plans"]
    assert [label.split(":")[0] for label in labels[2:]] == [
        "all max frequency",
        "no slowdown",
        "deployed plan",
    ]
    drawn = {line.get_label().split(":")[0]: line.get_xydata().tolist() for line in ax.lines}
    assert drawn["all max frequency"] == [[2.0, 30.0]]
    assert drawn["no slowdown"] == [[1.9, 29.0]]
    assert drawn["deployed plan"] == [[2.1, 28.0]]
    # The legend sits right of the axes, off the data.
    assert legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).x0 > 1
    out = plot_frontier(tmp_path, **marks)
    assert out == tmp_path / "frontier.png"
    assert out.read_bytes()[:8] == PNG
    # Without marks: only the two curves.
    plain = _frontier_figure(
        tmp_path, baseline=None, no_slowdown=None, chosen=None, chosen_label="", title=None
    ).axes[0]
    assert len(plain.lines) == 2
