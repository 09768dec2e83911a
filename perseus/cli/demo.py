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
        str,
        typer.Option(
            help="Layers per pipeline rank (uneven on purpose; one process per rank), split "
            "over the rank's stages by the multi-stage schedules."
        ),
    ] = "4,8,6,2",
    schedule: Annotated[
        str,
        typer.Option(
            help="Pipeline schedule (torch.distributed.pipelining): 1f1b, gpipe, interleaved "
            "(2 stages per rank), looped, zb (interleaved zero bubble, 2 stages per rank) or "
            "zbv. Default zb: its weight-gradient halves (W) sit off the critical path and "
            "can run at low clocks."
        ),
    ] = "zb",
    microbatches: Annotated[int, typer.Option(help="Microbatches per iteration.")] = 4,
    steps: Annotated[
        int,
        typer.Option(
            help="Iterations of the job: all-max rounds, profiling (rounds of about 1.2 s, "
            "ten refreshes of the energy counter), then the plan and its checks."
        ),
    ] = 150,
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
    """Run the whole Perseus loop on emulated GPUs and report what it saved.

    Starts a coordinator, trains a small GPT on len(LAYERS) pipeline ranks with SCHEDULE
    (torch.distributed.pipelining, Perseus attached) under torchrun (gloo, one process per
    rank) under the Perseus scheduler: all-max rounds (the baseline), online profiling, the
    frontier, the deployed plan and its checks; prints the job's own report (measured
    against its all-max rounds, and predicted).
    """
    from perseus.demo import DemoJob, require_torch, run_demo
    from perseus.domain.units import max_slowdown_problem

    problem = max_slowdown_problem(max_slowdown, name="--max-slowdown")
    if problem:  # before torch and the coordinator start
        raise ConfigurationError(problem)
    require_torch()
    from perseus.train.layout import PipelineLayout
    from perseus.train.model import parse_layers

    # Checked here, not seconds later inside torchrun.
    split = parse_layers(layers)
    layout = PipelineLayout.build(schedule, split, pp_degree=len(split))
    n_ranks = layout.pp_degree
    if not ms_per_layer > 0:
        raise ConfigurationError(f"--ms-per-layer must be positive, got {ms_per_layer}")
    spec = DemoJob(
        nproc=n_ranks,
        layers=layers,
        schedule=schedule,
        microbatches=microbatches,
        nominal=nominal,
        nominal_ms_per_layer=ms_per_layer,
    )
    console.print(
        f"[bold]Perseus demo[/]: GPT on {n_ranks} ranks (layers {layers}, "
        f"{layout.num_stages} stages), {microbatches} microbatches, {schedule} "
        f"(torch.distributed.pipelining) over gloo, emulated A100 GPUs "
        f"({'nominal' if nominal else 'measured, stretched'} instruction times)"
    )
    console.print(
        "[yellow]Emulated GPUs[/]: the demo sets ZEUS_GPU_BACKEND=emulated for its ranks; every "
        "time and energy below is the emulator's model, not a measurement, and the profile, "
        "plan and summary it writes are marked emulated.",
        highlight=False,
    )
    result = run_demo(
        out,
        spec=spec,
        steps=steps,
        freq_step=freq_step,
        max_slowdown=max_slowdown,
        console=console,
    )
    emulated = " (emulated GPUs)" if result.emulated else ""
    table = Table(title=f"Per iteration, the job's own rounds (medians){emulated}")
    table.add_column("rounds")
    table.add_column("iteration time (s)", justify="right")
    table.add_column("energy (J)", justify="right")
    table.add_column("energy saved", justify="right")
    table.add_column("slowdown", justify="right")
    table.add_row(
        "all-max", f"{result.baseline_time_s:.4f}", f"{result.baseline_energy_j:.1f}", "—", "—"
    )
    table.add_row(
        "Perseus plan",
        f"{result.perseus_time_s:.4f}",
        f"{result.perseus_energy_j:.1f}",
        f"{100 * result.energy_saved:.1f} %",
        f"{100 * result.slowdown:+.2f} %",
    )
    console.print(table)
    console.print(
        f"Predicted for this plan (profile, measured clock switch and hop latency): "
        f"{100 * result.planned_energy_saved:.1f} % saved at "
        f"{100 * result.planned_slowdown:+.2f} %."
    )
    for line in result.promise:
        console.print(line, highlight=False)
    console.print(f"profile:  {result.profile_csv}")
    console.print(f"frontier: {result.frontier_png}")
    console.print(f"timeline: {result.timeline_png}")
