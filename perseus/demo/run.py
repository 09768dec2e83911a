"""`run_demo`: all-max, then Perseus, on the same job; the comparison and its files."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perseus.demo.processes import (
    Coordinator,
    DemoJob,
    log_tail,
    rank_errors,
    require_torch,
    run_training,
)
from perseus.demo.traces import count_steps
from perseus.errors import ConfigurationError, PerseusError
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.io.plan_file import load_plan, save_plan
from perseus.io.profile_csv import load_profile

__all__ = ["DemoResult", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    """What `run_demo` measured and wrote: the job's own energy report (its all-max rounds
    against the rounds of the plan deployed at the end, medians) and its files."""

    baseline_time_s: float
    baseline_energy_j: float
    perseus_time_s: float
    perseus_energy_j: float
    profile_csv: Path
    frontier_png: Path
    timeline_png: Path
    planned_energy_saved: float
    """What the plan's model (profile, switching, hops) predicts against all-max."""
    planned_slowdown: float
    promise: tuple[str, ...] = ()
    """The deployments, holds and moves of the plan, "round N: event: reason"."""
    emulated: bool = True
    """The numbers come from emulated GPUs (the profile's and the plan's own marks)."""

    @property
    def energy_saved(self) -> float:
        return 1.0 - self.perseus_energy_j / self.baseline_energy_j

    @property
    def slowdown(self) -> float:
        return self.perseus_time_s / self.baseline_time_s - 1.0


def _run_phase(
    name: str,
    coordinator: Coordinator,
    spec: DemoJob,
    trace_dir: Path,
    log_path: Path,
    progress: Any,
) -> None:
    task = progress.add_task(f"{name}: starting the coordinator", total=spec.steps)
    with coordinator:
        progress.update(task, description=f"{name}: starting {spec.nproc} ranks (torchrun)")

        def poll() -> None:
            done = count_steps(trace_dir)
            if done:
                progress.update(task, completed=done, description=f"{name}: training")

        status = run_training(
            spec, coordinator.url, trace_dir=trace_dir, log_path=log_path, on_poll=poll
        )
    if status != 0:
        raise PerseusError(
            f"The {name} training job failed with exit status {status}{rank_errors(log_path)}"
            f"; its log ({log_path}):\n{log_tail(log_path)}\n"
            f"coordinator log ({coordinator.log_path}):\n{log_tail(coordinator.log_path)}"
        )
    progress.update(task, completed=spec.steps, description=f"{name}: done")


def run_demo(
    out_dir: str | os.PathLike[str],
    *,
    spec: DemoJob | None = None,
    steps: int = 150,
    freq_step: int = 6,
    max_slowdown: float = 0.01,
    console: Any = None,
) -> DemoResult:
    """Run the demo: one emulated 4-rank job under the `Perseus` scheduler (default: the
    zero-bubble schedule `zb` on an uneven split), `steps` iterations.

    The job first runs all-max rounds (its measured baseline), then profiles every
    instruction, solves the frontier with the costs it measured (each rank's clock switch,
    the P2P hop latency) and deploys the least-energy plan at most `max_slowdown` slower
    than all-max, whose measured rounds its guard compares with the all-max ones. The
    figures are the job's own report (`perseus.planning.dump.read_dump`, as ``perseus
    report`` prints them): measured, medians of its all-max rounds and of the rounds of the
    plan running at the end; predicted, the plan's and the all-max plan's numbers from one
    model. The ranks run on emulated GPUs: the demo opts in (``ZEUS_GPU_BACKEND=emulated`` in
    their environment, `DemoJob.environment`) and every file it writes says so.
    Writes under `out_dir`: ``profile.csv``, ``frontier/`` and ``frontier.png`` (the
    time–energy frontier, all-max and the deployed plan marked by the same model),
    ``timeline.png`` (the deployed plan's per-stage Gantt chart), ``plan.json``,
    ``summary.json``, and the logs, traces and dump of the run.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    require_torch()
    from perseus.planning.dump import read_dump
    from perseus.plotting import plot_frontier, plot_timeline

    spec = spec or DemoJob(layers="4,8,6,2", schedule="zb", nominal_ms_per_layer=8.0)
    if steps < 1:
        raise ConfigurationError(f"steps must be at least 1, got {steps}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    args = {
        "num_microbatches": spec.microbatches,
        "freq_step": freq_step,
        "max_slowdown": max_slowdown,
    }
    job = DemoJob(**{**spec.__dict__, "steps": steps})
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        phase_dir = out / "Perseus"
        shutil.rmtree(phase_dir, ignore_errors=True)
        coordinator = Coordinator(
            scheduler="Perseus",
            scheduler_args=args,
            dump_dir=phase_dir / "dump",
            log_path=phase_dir / "coordinator.log",
            env={"PERSEUS_DUMP_DATA": "true"},
        )
        _run_phase(
            "Perseus", coordinator, job, phase_dir / "trace", phase_dir / "train.log", progress
        )
    job_dirs = [p for p in (phase_dir / "dump").iterdir() if p.is_dir()]
    if len(job_dirs) != 1:
        raise PerseusError(f"Expected one Perseus job directory, found {job_dirs}")
    job_dir = JobDir(job_dirs[0])
    dump = read_dump(job_dir.path)
    rep = dump.report
    if rep.measured_all_max is None or rep.measured_deployed is None:
        raise PerseusError(
            f"The job ended before its plan was measured against all-max: raise steps (now "
            f"{steps}) or freq_step (now {freq_step}); its record: {job_dir.path}"
        )
    if rep.predicted_all_max is None or rep.predicted_deployed is None:
        raise PerseusError(f"The job's dump holds no plan and baseline: {job_dir.path}")
    profile_csv = out / "profile.csv"
    shutil.copyfile(job_dir.profile, profile_csv)
    plan = load_plan(job_dir.deployed_plan)
    save_plan(plan, out / "plan.json")
    frontier_png = out / "frontier.png"
    frontier_dir = out / "frontier"
    shutil.rmtree(frontier_dir, ignore_errors=True)
    if job_dir.frontier.is_dir():
        shutil.copytree(job_dir.frontier, frontier_dir)
        # All-max and the deployed plan by the model every frontier point was scored with
        # (the coordinator's baseline_plan.json and the plan file: switching and hops in).
        base = load_plan(job_dir.baseline_plan)
        frontier_png = plot_frontier(
            frontier_dir,
            frontier_png,
            baseline=(base.iteration_time, base.energy),
            chosen=(plan.iteration_time, plan.energy),
            chosen_label="deployed plan",
            title="Time–energy frontier of the profiled job (emulated A100)",
        )
    profile = load_profile(profile_csv)
    timeline_png = plot_timeline(profile, plan, out / "timeline.png", title="Deployed Perseus plan")
    result = DemoResult(
        baseline_time_s=rep.measured_all_max.iteration_time_s,
        baseline_energy_j=rep.measured_all_max.energy_j,
        perseus_time_s=rep.measured_deployed.iteration_time_s,
        perseus_energy_j=rep.measured_deployed.energy_j,
        profile_csv=profile_csv,
        frontier_png=frontier_png,
        timeline_png=timeline_png,
        planned_energy_saved=rep.predicted_saving or 0.0,
        planned_slowdown=rep.predicted_slowdown or 0.0,
        promise=tuple(
            f"round {e.get('round')}: {e['event']}: {e.get('reason', '')}"
            for e in dump.promise
            if e["event"] != "check"
        ),
        emulated=profile.emulated or plan.emulated,
    )
    atomic_write_text(
        out / "summary.json",
        json.dumps(
            {
                "measured": {
                    "all_max": rep.measured_all_max.model_dump(),
                    "deployed": rep.measured_deployed.model_dump(),
                    "energy_saved": result.energy_saved,
                    "slowdown": result.slowdown,
                },
                "predicted": {
                    "energy_saved": result.planned_energy_saved,
                    "slowdown": result.planned_slowdown,
                },
                "promise": list(result.promise),
                "job": {k: v for k, v in spec.__dict__.items() if k != "env"},
                # Every figure above is the emulator's model, not a GPU's measurement.
                "emulated": result.emulated,
            },
            indent=2,
        )
        + "\n",
    )
    return result
