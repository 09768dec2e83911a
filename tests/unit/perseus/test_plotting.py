"""Timelines draw every instruction kind, one row per pipeline rank, whatever the schedule."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import PipelineSchedule, make_schedule
from perseus.planning import make_plan, max_frequencies
from perseus.plotting import _HATCH, _timeline_figure, plot_timeline

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
    drawn = Counter(
        (round(bar.get_y() + bar.get_height() / 2), bar.get_hatch()) for bar in ax.patches
    )
    expected = Counter(
        (instr.rank, _HATCH[instr.kind]) for order in schedule.orders for instr in order
    )
    assert drawn == expected
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        f"rank {r}" for r in range(schedule.num_stages)
    ]
    legend = ax.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == schedule.instruction_kinds()
    # Kinds are told apart: no two share a hatch.
    assert len(set(_HATCH.values())) == len(_HATCH)
    out = plot_timeline(profile, plan, tmp_path / "timeline.png")
    assert out.read_bytes()[:8] == PNG
