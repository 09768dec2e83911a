"""`perseus demo`: AllMaxFrequency vs Perseus on a real 4-rank torchrun job, emulated GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from perseus.cli._common import cli_errors, console
from perseus.errors import ConfigurationError

__all__ = ["demo"]


@cli_errors
def demo(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output directory (profile, plots, logs).")
    ] = Path("perseus-demo"),
    layers: Annotated[
        str, typer.Option(help="Layers per pipeline stage (uneven on purpose).")
    ] = "2,4,3,1",
    microbatches: Annotated[int, typer.Option(help="Microbatches per iteration.")] = 4,
    baseline_steps: Annotated[int, typer.Option(help="Iterations under AllMaxFrequency.")] = 12,
    perseus_steps: Annotated[
        int, typer.Option(help="Iterations under Perseus (profiling, then the plan).")
    ] = 36,
    measure_steps: Annotated[
        int, typer.Option(help="Last iterations of each run that are compared.")
    ] = 8,
    freq_step: Annotated[
        int, typer.Option(help="Profile every n-th SM frequency (1: all; more: faster).")
    ] = 6,
    max_slowdown: Annotated[
        float, typer.Option(help="Slowdown Perseus may trade for energy (0.01 = 1 %).")
    ] = 0.01,
    ms_per_layer: Annotated[
        float,
        typer.Option(
            help="Emulated forward time of one layer at the max clock, ms (backward: twice). "
            "Longer instructions make the unmodelled P2P latency of the CPU job matter less."
        ),
    ] = 8.0,
    nominal: Annotated[
        bool,
        typer.Option(
            help="Emulate nominal instruction times (reproducible on a busy CPU) instead of "
            "stretching the measured CPU time."
        ),
    ] = True,
) -> None:
    """Run the whole Perseus loop on emulated GPUs and compare it with all-max frequency.

    Starts a coordinator, trains a small GPT split into len(LAYERS) pipeline stages with 1F1B
    under torchrun (gloo, one process per stage), first at maximum SM frequency, then under
    the Perseus scheduler (online profiling → frontier → deployed plan), and prints the
    iteration time and energy of both.
    """
    from perseus.demo import DemoJob, require_torch, run_demo

    require_torch()
    from perseus.train.model import parse_layers

    n_stages = len(parse_layers(layers))  # checked here, not seconds later inside torchrun
    if not ms_per_layer > 0:
        raise ConfigurationError(f"--ms-per-layer must be positive, got {ms_per_layer}")
    spec = DemoJob(
        nproc=n_stages,
        layers=layers,
        microbatches=microbatches,
        nominal=nominal,
        nominal_ms_per_layer=ms_per_layer,
    )
    console.print(
        f"[bold]Perseus demo[/]: {n_stages}-stage GPT (layers {layers}), {microbatches} "
        f"microbatches, 1F1B over gloo, emulated A100 GPUs "
        f"({'nominal' if nominal else 'measured, stretched'} instruction times)"
    )
    result = run_demo(
        out,
        spec=spec,
        baseline_steps=baseline_steps,
        perseus_steps=perseus_steps,
        measure_steps=measure_steps,
        freq_step=freq_step,
        max_slowdown=max_slowdown,
        console=console,
    )
    table = Table(title=f"Per iteration, median of the last {measure_steps} iterations")
    table.add_column("scheduler")
    table.add_column("iteration time (s)", justify="right")
    table.add_column("energy (J)", justify="right")
    table.add_column("energy saved", justify="right")
    table.add_column("slowdown", justify="right")
    table.add_row(
        "AllMaxFrequency",
        f"{result.baseline_time_s:.4f}",
        f"{result.baseline_energy_j:.1f}",
        "—",
        "—",
    )
    table.add_row(
        "Perseus",
        f"{result.perseus_time_s:.4f}",
        f"{result.perseus_energy_j:.1f}",
        f"{100 * result.energy_saved:.1f} %",
        f"{100 * result.slowdown:+.2f} %",
    )
    console.print(table)
    console.print(
        f"The profile predicted {100 * result.planned_energy_saved:.1f} % saved at "
        f"{100 * result.planned_slowdown:+.2f} % for this plan; the measured figures also "
        "hold what the profile leaves out (P2P and host latency, ranks sharing the CPU)."
    )
    console.print(f"profile:  {result.profile_csv}")
    console.print(f"frontier: {result.frontier_png}")
    console.print(f"timeline: {result.timeline_png}")
