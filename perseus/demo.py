"""`perseus demo`: the whole loop on emulated GPUs, and the building blocks the e2e tests use.

The demo starts a coordinator (a real server process on loopback), runs a real `torchrun`
pipeline job (4 ranks, gloo, emulated GPUs, an uneven layer split) under
`AllMaxFrequency`, then under `Perseus` (which profiles every instruction online, solves
the time–energy frontier and deploys a plan), and compares the two.

Building blocks:

- `Coordinator`: a coordinator subprocess (``python -m perseus serve``) for one scheduler,
  started on a free loopback port and stopped on exit.
- `DemoJob` / `run_training`: a ``torchrun --standalone -m perseus.train`` job.
- `read_traces` / `summarize`: the per-rank JSONL traces the hook writes
  (``PERSEUS_TRACE_DIR``), reduced to per-step iteration time (slowest rank) and energy
  (sum over ranks).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from perseus.errors import ConfigurationError, PerseusError
from perseus.io.jobdir import JobDir
from perseus.io.plan_file import load_plan, save_plan
from perseus.io.profile_csv import load_profile

__all__ = [
    "Coordinator",
    "DemoJob",
    "DemoResult",
    "RunSummary",
    "free_port",
    "read_traces",
    "require_torch",
    "run_demo",
    "run_training",
    "summarize",
]

TORCH_INSTALL_HINT = (
    "pip install 'perseus-energy[torch]' (or: pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu)"
)


def require_torch() -> None:
    """Raise a `ConfigurationError` with install instructions when PyTorch is missing."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigurationError(
            f"The Perseus training job needs PyTorch, which is not installed: {TORCH_INSTALL_HINT}"
        )


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _rank_errors(path: Path) -> str:
    """The one-line errors the ranks of a failed job printed (``perseus.train rank R: error:
    ...``), which torchrun's failure summary at the end of the log pushes out of view."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = list(dict.fromkeys(line for line in lines if ": error: " in line))[:4]
    return "".join(f"\n  {line}" for line in errors)


class Coordinator:
    """A Perseus coordinator subprocess on a free loopback port (a context manager).

    Args:
        scheduler: Scheduler name (``PERSEUS_SCHEDULER``).
        scheduler_args: ``PERSEUS_SCHEDULER_ARGS``.
        dump_dir: The coordinator's dump directory (profiles, frontiers land here).
        log_path: Where the server's stdout/stderr go.
        round_timeout_s: How long a round's barrier waits for every rank.
        env: Extra environment variables for the server process.
        startup_timeout_s: How long to wait for ``GET /info`` to answer.
    """

    def __init__(
        self,
        *,
        scheduler: str,
        scheduler_args: Mapping[str, Any] | None = None,
        dump_dir: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        round_timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.scheduler = scheduler
        self.scheduler_args = dict(scheduler_args or {})
        self.dump_dir = Path(dump_dir)
        self.log_path = Path(log_path)
        self.round_timeout_s = round_timeout_s
        self.extra_env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Coordinator:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "ZEUS_"))}
        env.update(
            {
                "PERSEUS_SCHEDULER": self.scheduler,
                "PERSEUS_SCHEDULER_ARGS": json.dumps(self.scheduler_args),
                "PERSEUS_DUMP_DIR": str(self.dump_dir),
                "PERSEUS_LOG_LEVEL": "warning",
                **self.extra_env,
            }
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "perseus",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--round-timeout",
            str(self.round_timeout_s),
        ]
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise PerseusError(
                    f"The coordinator ({self.scheduler}) exited with status "
                    f"{self._proc.returncode} while starting; its log ({self.log_path}):\n"
                    f"{_tail(self.log_path)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/info", timeout=2.0).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise PerseusError(
                    f"The coordinator did not answer at {self.url} within "
                    f"{self.startup_timeout_s:g} s; its log ({self.log_path}):\n{_tail(self.log_path)}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def job_dirs(self) -> list[Path]:
        """The per-job directories the coordinator created under its dump dir."""
        return sorted(p for p in self.dump_dir.iterdir() if p.is_dir())

    def __enter__(self) -> Coordinator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True, kw_only=True)
class DemoJob:
    """A `perseus.train` job: layout, model size and emulation mode.

    `nominal`: emulate nominal instruction times (``PERSEUS_EMULATE_NOMINAL``), each
    layer's forward taking `nominal_ms_per_layer` at the max clock (backward: twice that);
    otherwise the measured CPU time is stretched.
    """

    nproc: int = 4
    layers: str = "2,4,3,1"
    microbatches: int = 4
    steps: int = 10
    hidden: int = 64
    seq_len: int = 32
    microbatch_size: int = 2
    nominal: bool = True
    nominal_ms_per_layer: float = 4.0
    stretch: bool = True
    round_timeout_s: float = 90.0
    pg_timeout_s: float = 60.0
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def train_args(self, server_url: str | None) -> list[str]:
        args = [
            "--steps",
            str(self.steps),
            "--microbatches",
            str(self.microbatches),
            "--layers",
            self.layers,
            "--hidden",
            str(self.hidden),
            "--seq-len",
            str(self.seq_len),
            "--microbatch-size",
            str(self.microbatch_size),
            "--nominal-ms-per-layer",
            str(self.nominal_ms_per_layer),
            "--round-timeout",
            str(self.round_timeout_s),
            "--pg-timeout",
            str(self.pg_timeout_s),
        ]
        args += ["--server-url", server_url] if server_url else ["--no-hook"]
        return args + list(self.extra_args)

    def environment(self, trace_dir: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PERSEUS_", "ZEUS_"))}
        env.update(
            {
                "ZEUS_GPU_BACKEND": "emulated",
                "PERSEUS_EMULATE_NOMINAL": "1" if self.nominal else "0",
                "PERSEUS_EMULATE_STRETCH": "1" if self.stretch else "0",
                "OMP_NUM_THREADS": "1",
            }
        )
        if trace_dir is not None:
            env["PERSEUS_TRACE_DIR"] = str(trace_dir)
        env.update(self.env)
        return env


def torchrun_command(nproc: int, args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m perseus.train ...``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "-m",
        "perseus.train",
        *args,
    ]


def run_training(
    spec: DemoJob,
    server_url: str | None,
    *,
    trace_dir: str | os.PathLike[str] | None,
    log_path: str | os.PathLike[str],
    timeout_s: float = 600.0,
    on_poll: Callable[[], None] | None = None,
) -> int:
    """Run the job under torchrun to completion; returns its exit status.

    `on_poll` is called about every 0.25 s while it runs (progress display).
    """
    require_torch()
    trace = Path(trace_dir) if trace_dir is not None else None
    if trace is not None:
        shutil.rmtree(trace, ignore_errors=True)
        trace.mkdir(parents=True)
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(spec.nproc, spec.train_args(server_url))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=spec.environment(trace), stdout=out, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise PerseusError(
                    f"The training job did not finish within {timeout_s:g} s; log: {log}"
                )
            if on_poll is not None:
                on_poll()
            time.sleep(0.25)
    return proc.returncode


def read_traces(trace_dir: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """Every rank's trace records, by rank."""
    traces: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(trace_dir).glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        traces[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return traces


def count_steps(trace_dir: str | os.PathLike[str], rank: int = 0) -> int:
    """Steps rank `rank` has finished so far (for progress display)."""
    path = Path(trace_dir) / f"rank{rank}.jsonl"
    try:
        with path.open() as f:
            return sum(1 for line in f if '"kind": "step"' in line)
    except OSError:
        return 0


@dataclass(frozen=True)
class RunSummary:
    """Per-step numbers of a job: iteration time (slowest rank) and energy (all ranks)."""

    iter_time_s: list[float]
    iter_energy_j: list[float]

    @classmethod
    def from_traces(cls, traces: Mapping[int, list[dict[str, Any]]]) -> RunSummary:
        per_rank = {
            rank: {r["step"]: r for r in records if r["kind"] == "step"}
            for rank, records in traces.items()
        }
        steps = sorted(set.intersection(*(set(s) for s in per_rank.values()))) if per_rank else []
        return cls(
            iter_time_s=[max(per_rank[r][s]["iter_time_s"] for r in per_rank) for s in steps],
            iter_energy_j=[sum(per_rank[r][s]["iter_energy_j"] for r in per_rank) for s in steps],
        )

    def steady(self, last: int) -> tuple[float, float]:
        """Median iteration time and energy over the last `last` steps."""
        if len(self.iter_time_s) < last:
            raise PerseusError(f"Only {len(self.iter_time_s)} step(s) were traced, need {last}")
        return (
            statistics.median(self.iter_time_s[-last:]),
            statistics.median(self.iter_energy_j[-last:]),
        )


def summarize(trace_dir: str | os.PathLike[str], last: int) -> tuple[float, float]:
    """Median (iteration time, energy) over the last `last` steps of a traced job."""
    return RunSummary.from_traces(read_traces(trace_dir)).steady(last)


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
            f"The {name} training job failed with exit status {status}{_rank_errors(log_path)}"
            f"; its log ({log_path}):\n{_tail(log_path)}\n"
            f"coordinator log ({coordinator.log_path}):\n{_tail(coordinator.log_path)}"
        )
    progress.update(task, completed=spec.steps, description=f"{name}: done")


def _last_step_frequencies(traces: Mapping[int, list[dict[str, Any]]]) -> dict[int, list[int]]:
    """Per rank, the frequencies its last step ran at (what the GPU was locked to)."""
    out = {}
    for rank, records in traces.items():
        instrs = [r for r in records if r["kind"] == "instruction"]
        last = instrs[-1]["step"]
        out[rank] = [r["freq_mhz"] for r in instrs if r["step"] == last]
    return out


def run_demo(
    out_dir: str | os.PathLike[str],
    *,
    spec: DemoJob | None = None,
    baseline_steps: int = 12,
    perseus_steps: int = 36,
    measure_steps: int = 8,
    freq_step: int = 6,
    max_slowdown: float = 0.01,
    console: Any = None,
) -> DemoResult:
    """Run the demo: AllMaxFrequency, then Perseus, on the same emulated 4-rank job.

    Perseus picks the least-energy frontier plan at most `max_slowdown` slower than the
    fastest one. Writes under `out_dir`: ``profile.csv`` (the online instruction profile),
    ``frontier/`` and ``frontier.png`` (the time–energy frontier, the all-max point marked),
    ``timeline.png`` (the deployed plan's per-stage Gantt chart), ``plan.json`` (the
    deployed plan), ``summary.json``, and the logs and traces of both runs.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    require_torch()
    from perseus.planning import evaluate, max_frequencies
    from perseus.plotting import plot_frontier, plot_timeline

    spec = spec or DemoJob(nominal_ms_per_layer=8.0)
    if measure_steps < 1 or baseline_steps <= measure_steps or perseus_steps <= measure_steps:
        raise ConfigurationError(
            f"Need more steps than measured ones: baseline_steps={baseline_steps}, "
            f"perseus_steps={perseus_steps}, measure_steps={measure_steps}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    args = {"num_microbatches": spec.microbatches}
    runs = {
        "AllMaxFrequency": (
            {**args},
            DemoJob(**{**spec.__dict__, "steps": baseline_steps}),
        ),
        "Perseus": (
            {**args, "freq_step": freq_step, "max_slowdown": max_slowdown},
            DemoJob(**{**spec.__dict__, "steps": perseus_steps}),
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
    ran = _last_step_frequencies(read_traces(out / "Perseus" / "trace"))
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
    )
    (out / "summary.json").write_text(
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
            },
            indent=2,
        )
        + "\n"
    )
    return result
