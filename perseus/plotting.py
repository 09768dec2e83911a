"""Pictures: the time–energy frontier and a per-stage Gantt chart of a plan.

Figures are drawn with matplotlib's object API on an Agg canvas, so no display and no
global backend state are needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.errors import PerseusError
from perseus.io.frontier_dir import read_frontier_table
from perseus.planning import timeline

__all__ = ["plot_frontier", "plot_timeline"]

_HATCH = {"forward": None, "backward": "//", "backward_input": "\\\\", "backward_weight": "xx"}
"""How each instruction kind is drawn on a timeline."""


def _save(fig: Figure, out_png: str | os.PathLike[str]) -> Path:
    out = Path(out_png)
    if out.is_dir():
        raise PerseusError(f"{str(out)!r} is a directory; give the image file's path")
    if not out.suffix:  # matplotlib would add .png itself; return the path it writes
        out = out.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out


def plot_frontier(
    frontier_dir: str | os.PathLike[str],
    out_png: str | os.PathLike[str] | None = None,
    *,
    baseline: tuple[float, float] | None = None,
    title: str | None = None,
) -> Path:
    """Energy vs iteration time of every frontier plan, with the LP lower bound.

    `baseline` marks a reference point (e.g. all-max frequency) as (time_s, energy_j).
    Returns the PNG path (default ``DIR/frontier.png``).
    """
    table = read_frontier_table(frontier_dir)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    ax.plot(
        table.iteration_time, table.lower_bound, "--", color="0.6", lw=1, label="LP lower bound"
    )
    ax.plot(
        table.iteration_time,
        table.energy,
        "-o",
        ms=2.5,
        lw=1.2,
        color="tab:blue",
        label="Perseus plans",
    )
    if baseline is not None:
        ax.plot(*baseline, "*", ms=12, color="tab:red", label="all max frequency")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title(title or f"Time–energy frontier ({len(table.plan)} plans)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out_png or Path(frontier_dir) / "frontier.png")


def plot_timeline(
    profile: InstructionProfile,
    plan: Plan,
    out_png: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """A per-rank Gantt chart of one iteration under `plan`, coloured by SM frequency.

    One row per pipeline rank (an interleaved rank's stages share its row); forwards are
    drawn plain, each backward kind with its own hatch (`_HATCH`); each box is labelled by
    its microbatch.
    """
    return _save(_timeline_figure(profile, plan, title=title), out_png)


def _timeline_figure(profile: InstructionProfile, plan: Plan, *, title: str | None) -> Figure:
    schedule = plan.pipeline_schedule()
    placed = timeline(profile, schedule, plan.stage_frequencies())
    freqs = [p.freq_mhz for p in placed]
    norm = Normalize(
        vmin=min(freqs), vmax=max(freqs) if max(freqs) > min(freqs) else min(freqs) + 1
    )
    cmap = colormaps["viridis"]
    fig = Figure(
        figsize=(
            min(24, 6 + 0.12 * len(placed) / max(1, schedule.num_stages)),
            1.2 + 0.55 * schedule.num_stages,
        )
    )
    ax = fig.add_subplot()
    end = max(p.finish_s for p in placed)
    for p in placed:
        instr = p.instruction
        ax.barh(
            instr.rank,
            p.finish_s - p.start_s,
            left=p.start_s,
            height=0.8,
            color=(color := cmap(norm(p.freq_mhz))),
            edgecolor="black",
            linewidth=0.3,
            hatch=_HATCH[instr.kind],
        )
        if (p.finish_s - p.start_s) / end > 0.012:
            r, g, b, _ = cmap(norm(p.freq_mhz))
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"
            ax.text(
                (p.start_s + p.finish_s) / 2,
                instr.rank,
                str(instr.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color=ink,
                bbox={"boxstyle": "square,pad=0.05", "fc": color, "ec": "none"}
                if instr.kind != "forward"
                else None,
            )
    ax.set_yticks(range(schedule.num_stages), [f"rank {s}" for s in range(schedule.num_stages)])
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel("time (s)")
    ax.set_title(
        title
        or f"{schedule.name} S={schedule.num_stages} M={schedule.num_microbatches}: "
        f"T={plan.iteration_time:.4g} s, E={plan.energy:.5g} J"
    )
    sm = fig.colorbar(
        ScalarMappable(norm=norm, cmap=cmap),
        ax=ax,
        pad=0.01,
    )
    sm.set_label("SM frequency (MHz)")
    ax.legend(
        handles=[
            Patch(facecolor="white", edgecolor="black", hatch=_HATCH[kind], label=kind)
            for kind in schedule.instruction_kinds()
        ],
        loc="upper right",
        fontsize=7,
        framealpha=0.8,
    )
    return fig
