"""Pictures: the time–energy frontier and a per-stage Gantt chart of a plan.

Figures are drawn with matplotlib's object API on an Agg canvas, so no display and no
global backend state are needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.errors import PerseusError
from perseus.io.frontier_dir import read_frontier_table
from perseus.planning import timeline

__all__ = ["PlotPoint", "plot_energy_report", "plot_frontier", "plot_timeline"]

_HATCH = {"forward": None, "backward": "//", "backward_input": "\\\\", "backward_weight": "xx"}
"""How each instruction kind is drawn on a timeline."""

_MAX_LABELS = 400
"""Above this many instructions a timeline writes no per-instruction text (it would be
unreadable, and text is the costliest artist to draw)."""

_LABEL_PT_PER_CHAR = 4.5
"""A microbatch label is written only in a box at least this many points wide per digit."""

_CHUNK_COLOURS = ("black", "tab:orange", "tab:red", "tab:cyan", "tab:pink", "tab:olive")
"""The strip along the top of a box: which of its rank's stages (chunks) it belongs to."""

PlotPoint = tuple[float, float]
"""(iteration time in s, energy per iteration in J) of one plan."""


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
    baseline: PlotPoint | None = None,
    no_slowdown: PlotPoint | None = None,
    chosen: PlotPoint | None = None,
    chosen_label: str = "chosen plan",
    title: str | None = None,
) -> Path:
    """Energy vs iteration time of every frontier plan, with the LP lower bound.

    Marks, each when given as (time_s, energy_j): `baseline` (all SM clocks at their
    maximum), `no_slowdown` (the cheapest plan no slower than the baseline) and `chosen`
    (the deployed or chosen plan, named by `chosen_label`). The legend sits right of the
    axes, off the data. Returns the PNG path (default ``DIR/frontier.png``).
    """
    fig = _frontier_figure(
        frontier_dir,
        baseline=baseline,
        no_slowdown=no_slowdown,
        chosen=chosen,
        chosen_label=chosen_label,
        title=title,
    )
    return _save(fig, out_png or Path(frontier_dir) / "frontier.png")


def _frontier_figure(
    frontier_dir: str | os.PathLike[str],
    *,
    baseline: PlotPoint | None,
    no_slowdown: PlotPoint | None,
    chosen: PlotPoint | None,
    chosen_label: str,
    title: str | None,
) -> Figure:
    table = read_frontier_table(frontier_dir)
    fig = Figure(figsize=(9, 4.5))
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
    marks = (
        (baseline, "*", 13, "tab:red", "all max frequency"),
        (no_slowdown, "D", 8, "tab:green", "no slowdown"),
        (chosen, "X", 10, "tab:purple", chosen_label),
    )
    for point, marker, size, colour, label in marks:
        if point is not None:
            t, e = point
            ax.plot(
                t,
                e,
                marker,
                ms=size,
                color=colour,
                markeredgecolor="black",
                markeredgewidth=0.6,
                linestyle="none",
                label=f"{label}: {t:.4g} s, {e:.5g} J",
                zorder=3,
            )
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title(title or f"Time–energy frontier ({len(table.plan)} plans)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    return fig


def plot_timeline(
    profile: InstructionProfile,
    plan: Plan,
    out_png: str | os.PathLike[str],
    *,
    title: str | None = None,
) -> Path:
    """A per-rank Gantt chart of one iteration under `plan`, coloured by SM frequency.

    One row per pipeline rank (an interleaved rank's stages share its row; a strip along
    each box's top tells them apart, and the row's label lists them in strip colours'
    order); forwards are drawn plain, each backward kind with its own hatch (`_HATCH`).
    Boxes are drawn as one collection per kind (and one per chunk strip), not one artist
    per instruction; a box is labelled by its microbatch where it is wide enough, and no
    box is above `_MAX_LABELS` instructions.
    """
    return _save(_timeline_figure(profile, plan, title=title), out_png)


def _box(x0: float, x1: float, y0: float, y1: float) -> list[tuple[float, float]]:
    return [(x0, y0), (x0, y1), (x1, y1), (x1, y0)]


def _timeline_figure(profile: InstructionProfile, plan: Plan, *, title: str | None) -> Figure:
    schedule = plan.pipeline_schedule()
    placed = timeline(profile, schedule, plan.stage_frequencies(), hop_latency_s=plan.hop_latency)
    num_ranks = schedule.num_stages
    freqs = [p.freq_mhz for p in placed]
    norm = Normalize(
        vmin=min(freqs), vmax=max(freqs) if max(freqs) > min(freqs) else min(freqs) + 1
    )
    cmap = colormaps["viridis"]
    width_in = min(24, 6 + 0.12 * len(placed) / max(1, num_ranks))
    fig = Figure(figsize=(width_in, 1.6 + 0.55 * num_ranks))
    ax = fig.add_subplot()
    end = max(p.finish_s for p in placed)
    half = 0.4
    kinds = schedule.instruction_kinds()
    # The stages each rank holds, in stage order: a box's chunk is its stage's place there.
    rank_stages: list[list[int]] = [[] for _ in range(num_ranks)]
    for stage, rank in enumerate(schedule.stage_ranks):
        rank_stages[rank].append(stage)
    chunked = schedule.num_chunks > 1
    boxes: dict[str, list[list[tuple[float, float]]]] = {k: [] for k in kinds}
    box_freqs: dict[str, list[float]] = {k: [] for k in kinds}
    strips: dict[int, list[list[tuple[float, float]]]] = {}
    for p in placed:
        instr = p.instruction
        y = instr.rank
        boxes[instr.kind].append(_box(p.start_s, p.finish_s, y - half, y + half))
        box_freqs[instr.kind].append(p.freq_mhz)
        if chunked:
            chunk = rank_stages[y].index(instr.stage)
            strips.setdefault(chunk, []).append(
                _box(p.start_s, p.finish_s, y - half, y - half + 0.14)
            )
    mappable = None
    for kind in kinds:
        if not boxes[kind]:
            continue
        coll = PolyCollection(
            boxes[kind],
            array=box_freqs[kind],
            cmap=cmap,
            norm=norm,
            edgecolors="black",
            linewidths=0.3,
            hatch=_HATCH[kind],
        )
        ax.add_collection(coll)
        mappable = mappable or coll
    for chunk, polys in sorted(strips.items()):
        ax.add_collection(
            PolyCollection(
                polys,
                facecolors=_CHUNK_COLOURS[chunk % len(_CHUNK_COLOURS)],
                edgecolors="none",
            )
        )
    ax.set_xlim(0, end * 1.01)
    ax.set_ylim(num_ranks - 0.5, -0.5)  # rank 0 on top
    if len(placed) <= _MAX_LABELS:
        pt_per_s = 72 * width_in * 0.8 / (end * 1.01)  # about 80 % of the width is axes
        for p in placed:
            instr = p.instruction
            label = str(instr.microbatch)
            if (p.finish_s - p.start_s) * pt_per_s < _LABEL_PT_PER_CHAR * (len(label) + 1):
                continue
            r, g, b, _ = cmap(norm(p.freq_mhz))
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"
            ax.text(
                (p.start_s + p.finish_s) / 2,
                instr.rank + 0.05,
                label,
                ha="center",
                va="center",
                fontsize=6,
                color=ink,
                bbox={"boxstyle": "square,pad=0.05", "fc": (r, g, b), "ec": "none"}
                if instr.kind != "forward"
                else None,
            )
    ax.set_yticks(
        range(num_ranks),
        [
            f"rank {r}" + (f"\nstages {', '.join(map(str, rank_stages[r]))}" if chunked else "")
            for r in range(num_ranks)
        ],
    )
    ax.set_xlabel("time (s)")
    ax.set_title(
        title
        or f"{schedule.name} S={num_ranks} M={schedule.num_microbatches}: "
        f"T={plan.iteration_time:.4g} s, E={plan.energy:.5g} J"
    )
    if mappable is not None:
        fig.colorbar(mappable, ax=ax, pad=0.01).set_label("SM frequency (MHz)")
    handles: list[Patch | Line2D] = [
        Patch(facecolor="white", edgecolor="black", hatch=_HATCH[kind], label=kind)
        for kind in kinds
    ]
    if chunked:
        handles += [
            Line2D([], [], color=_CHUNK_COLOURS[c % len(_CHUNK_COLOURS)], lw=4, label=f"chunk {c}")
            for c in sorted(strips)
        ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 if not chunked else -0.16),
        ncol=len(handles),
        fontsize=7,
        frameon=False,
    )
    return fig


def plot_energy_report(
    rounds: list[tuple[int, str, float, float]],
    predicted: dict[str, PlotPoint],
    out_png: str | os.PathLike[str],
    *,
    title: str = "",
) -> Path:
    """A job's measured energy and time per iteration, round by round, with the predicted
    all-max and deployed figures as lines.

    Args:
        rounds: (round, kind, iteration time s, energy J) of every measured round; kind is
            "all-max", "deployed" or "other".
        predicted: kind → (iteration time, energy) predicted for it.
        out_png: Where to write the image.
    """
    colours = {"all-max": "tab:red", "deployed": "tab:green", "other": "tab:gray"}
    fig = Figure(figsize=(8, 5.5))
    ax_e, ax_t = fig.subplots(2, 1, sharex=True)
    for kind, colour in colours.items():
        pts = [r for r in rounds if r[1] == kind]
        if pts:
            xs = [r[0] for r in pts]
            ax_e.scatter(xs, [r[3] for r in pts], color=colour, label=f"measured, {kind}", s=18)
            ax_t.scatter(xs, [r[2] for r in pts], color=colour, s=18)
    for kind, (t, e) in predicted.items():
        colour = colours.get(kind, "black")
        ax_e.axhline(e, color=colour, linestyle="--", linewidth=1, label=f"predicted, {kind}")
        ax_t.axhline(t, color=colour, linestyle="--", linewidth=1)
    ax_e.set_ylabel("energy / iteration (J)")
    ax_t.set_ylabel("time / iteration (s)")
    ax_t.set_xlabel("round")
    ax_t.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_e.legend(loc="best", fontsize="small")
    if title:
        ax_e.set_title(title, fontsize="small")
    return _save(fig, out_png)
