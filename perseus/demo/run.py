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
from perseus.demo.traces import count_steps, last_step_frequencies, read_traces, summarize
from perseus.errors import ConfigurationError, PerseusError
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.io.plan_file import load_plan, save_plan
from perseus.io.profile_csv import load_profile

__all__ = ["DemoResult", "run_demo"]


@dataclass(frozen=True)
class DemoResult:
    """What `run_demo` measured and wrote."""

    baseline_time_s: float
    baseline_energy_j: float
    perseus_time_s: float
    perseus_energy_j: float
    profile_csv: Path
    frontier_png: Path
    timeline_png: Path
    planned_energy_saved: float
    """What the profile's accounting predicts for the deployed plan against all-max."""
    planned_slowdown: float
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
    baseline_steps: int = 12,
    perseus_steps: int = 70,
    measure_steps: int = 8,
    freq_step: int = 6,
    max_slowdown: float = 0.01,
    console: Any = None,
) -> DemoResult:
    """Run the demo: AllMaxFrequency, then Perseus, on the same emulated 4-rank job
    (default: the zero-bubble schedule `zb` on an uneven split).

    Perseus picks the least-energy frontier plan at most `max_slowdown` slower than the
    fastest one. The ranks run on emulated GPUs: the demo opts in (``ZEUS_GPU_BACKEND=emulated``
    in their environment, `DemoJob.environment`) and every file it writes says so (the
    profile's ``emulated`` column, the plan's and the summary's ``"emulated": true``).
    Writes under `out_dir`: ``profile.csv`` (the online instruction profile),
    ``frontier/`` and ``frontier.png`` (the time–energy frontier, the all-max point marked),
    ``timeline.png`` (the deployed plan's per-stage Gantt chart), ``plan.json`` (the
    deployed plan), ``summary.json``, and the logs and traces of both runs.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    require_torch()
    from perseus.planning import evaluate, max_frequencies
    from perseus.plotting import plot_frontier, plot_timeline

    spec = spec or DemoJob(layers="4,8,6,2", schedule="zb", nominal_ms_per_layer=8.0)
    if measure_steps < 1 or baseline_steps <= measure_steps or perseus_steps <= measure_steps:
        raise ConfigurationError(
            f"Need more steps than measured ones: baseline_steps={baseline_steps}, "
            f"perseus_steps={perseus_steps}, measure_steps={measure_steps}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    args = {"num_microbatches": spec.microbatches}
    # The emulated GPUs take ZEUS_EMULATED_SWITCH_LATENCY_MS (default 15 ms) to switch
    # clocks; the ranks get it explicitly and Perseus plans with it.
    from zeus_power.device import DeviceSettings

    try:
        latency_ms = DeviceSettings().emulated_switch_latency_ms
    except ValueError:  # pydantic's ValidationError: the variable names itself
        raise ConfigurationError(
            "ZEUS_EMULATED_SWITCH_LATENCY_MS must be a number of ms from 0 to 10000"
        ) from None
    job_env = {**spec.env, "ZEUS_EMULATED_SWITCH_LATENCY_MS": f"{latency_ms:g}"}
    runs = {
        "AllMaxFrequency": (
            {**args},
            DemoJob(**{**spec.__dict__, "steps": baseline_steps, "env": job_env}),
        ),
        "Perseus": (
            {
                **args,
                "freq_step": freq_step,
                "max_slowdown": max_slowdown,
                "switch_latency_ms": latency_ms,
            },
            DemoJob(**{**spec.__dict__, "steps": perseus_steps, "env": job_env}),
        ),
    }
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        for name, (scheduler_args, job) in runs.items():
            phase_dir = out / name
            shutil.rmtree(phase_dir, ignore_errors=True)
            coordinator = Coordinator(
                scheduler=name,
                scheduler_args=scheduler_args,
                dump_dir=phase_dir / "dump",
                log_path=phase_dir / "coordinator.log",
                env={"PERSEUS_DUMP_DATA": "true"},
            )
            _run_phase(
                name, coordinator, job, phase_dir / "trace", phase_dir / "train.log", progress
            )
    base_t, base_e = summarize(out / "AllMaxFrequency" / "trace", measure_steps)
    pers_t, pers_e = summarize(out / "Perseus" / "trace", measure_steps)

    job_dirs = [p for p in (out / "Perseus" / "dump").iterdir() if p.is_dir()]
    if len(job_dirs) != 1:
        raise PerseusError(f"Expected one Perseus job directory, found {job_dirs}")
    job_dir = JobDir(job_dirs[0])
    profile_csv = out / "profile.csv"
    shutil.copyfile(job_dir.profile, profile_csv)
    frontier_dir = out / "frontier"
    shutil.rmtree(frontier_dir, ignore_errors=True)
    shutil.copytree(job_dir.frontier, frontier_dir)
    plan = load_plan(job_dir.deployed_plan)
    save_plan(plan, out / "plan.json")
    ran = last_step_frequencies(read_traces(out / "Perseus" / "trace"))
    if any(ran[r] != [f for _, f in plan.frequencies[r % plan.num_stages]] for r in ran):
        raise PerseusError(
            f"The Perseus run ended before its plan was deployed: raise perseus_steps "
            f"(now {perseus_steps}) or freq_step (now {freq_step})"
        )
    profile = load_profile(profile_csv)
    # The all-max point by the same accounting as the frontier (measured numbers, which
    # also hold P2P and host latencies the model leaves out, are in the summary).
    schedule = plan.pipeline_schedule()
    all_max = evaluate(profile, schedule, max_frequencies(profile, schedule), plan.p2p_power)
    planned = evaluate(profile, schedule, plan.stage_frequencies(), plan.p2p_power)
    frontier_png = plot_frontier(
        frontier_dir,
        out / "frontier.png",
        baseline=(all_max.iteration_time_s, all_max.energy_j),
        chosen=(planned.iteration_time_s, planned.energy_j),
        chosen_label="deployed plan",
        title="Time–energy frontier of the profiled job (emulated A100)",
    )
    timeline_png = plot_timeline(profile, plan, out / "timeline.png", title="Deployed Perseus plan")
    result = DemoResult(
        baseline_time_s=base_t,
        baseline_energy_j=base_e,
        perseus_time_s=pers_t,
        perseus_energy_j=pers_e,
        profile_csv=profile_csv,
        frontier_png=frontier_png,
        timeline_png=timeline_png,
        planned_energy_saved=1.0 - planned.energy_j / all_max.energy_j,
        planned_slowdown=planned.iteration_time_s / all_max.iteration_time_s - 1.0,
        emulated=profile.emulated or plan.emulated,
    )
    atomic_write_text(
        out / "summary.json",
        json.dumps(
            {
                "baseline": {"iteration_time_s": base_t, "energy_j": base_e},
                "perseus": {"iteration_time_s": pers_t, "energy_j": pers_e},
                "energy_saved": result.energy_saved,
                "slowdown": result.slowdown,
                "planned": {
                    "energy_saved": result.planned_energy_saved,
                    "slowdown": result.planned_slowdown,
                },
                "job": {k: v for k, v in spec.__dict__.items() if k != "env"},
                # Every figure above is the emulator's model, not a GPU's measurement.
                "emulated": result.emulated,
            },
            indent=2,
        )
        + "\n",
    )
    return result
