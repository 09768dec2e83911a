"""Trace-driven simulation of the batch-size + power-limit policy over recurrences.

Replays a recurring job from tables instead of training it:

- per (batch size, power limit): the time and average power of one training iteration
  (hence of an epoch, with the iterations per epoch of that batch size);
- per (batch size, seed): the epochs needed to reach the target metric (None: never
  within `max_epochs`).

Each recurrence draws one seed (shared by every batch size, so the policy and the
oracle see the same luck). The policy is the real one: batch sizes come from the
batch-size optimizer (`LocalBatchSizeOptimizer`: pruning + Thompson sampling, early stop
at β × best cost), and the power limit of a batch size is chosen by the
`GlobalPowerLimitOptimizer`'s `ZeusCost` selector from profiling windows computed from the
table. Profiling costs what it would: the first run of a batch size spends
`warmup_iters + profile_iters` iterations at every candidate power limit (approximation:
windows are not cut by epoch ends) before running at the optimum; later runs load the
profile and start at the optimum.

The oracle is the best fixed (batch size, power limit) known in hindsight: the cheapest
pair that reaches the target in every recurrence. `make_emulator_tables` builds tables
from the emulated GPU's DVFS model and a convergence model; tables are JSON data
(`TraceTables.model_dump_json` / `model_validate_json`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from zeus_power.bso.local import LocalBatchSizeOptimizer
from zeus_power.bso.models import JobConfig, TrialResult
from zeus_power.errors import ZeusConfigError
from zeus_power.job import HistoryEntry
from zeus_power.metric import check_eta_knob, zeus_cost
from zeus_power.power_limit.selectors import PowerLimitMeasurement, ZeusCost

__all__ = [
    "IterationRow",
    "OracleChoice",
    "SimulationResult",
    "TargetRow",
    "TraceTables",
    "make_emulator_tables",
    "oracle",
    "simulate",
]


class IterationRow(BaseModel):
    """One training iteration of a batch size at a power limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(gt=0)
    power_limit_w: int = Field(gt=0)
    iter_time_s: float = Field(gt=0.0)
    iter_power_w: float = Field(gt=0.0)


class TargetRow(BaseModel):
    """Epochs a batch size needs to reach the target with one seed (None: never)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: int = Field(gt=0)
    seed: int = Field(ge=0)
    epochs: int | None = Field(default=None, ge=1)


class TraceTables(BaseModel):
    """Everything the simulator replays; validated on load."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    description: str = ""
    max_power_w: float = Field(gt=0.0)
    """Max power limit of the GPU (the `max_power` of the cost)."""
    default_batch_size: int
    max_epochs: int = Field(ge=1)
    iters_per_epoch: dict[int, int]
    """Iterations per epoch of each batch size."""
    iterations: list[IterationRow] = Field(min_length=1)
    targets: list[TargetRow] = Field(min_length=1)
    emulated: bool = Field(default=False, exclude_if=lambda emulated: not emulated)
    """The iterations come from the emulated GPU's model (`make_emulator_tables`), not traces
    of a real GPU; the simulated history says so."""

    @model_validator(mode="after")
    def _check_complete(self) -> TraceTables:
        sizes = self.batch_sizes
        limits = self.power_limits_w
        have = {(r.batch_size, r.power_limit_w) for r in self.iterations}
        missing = [(b, p) for b in sizes for p in limits if (b, p) not in have]
        if missing:
            raise ValueError(f"iteration rows missing for (batch size, power limit) {missing}")
        if len(have) != len(self.iterations):
            raise ValueError("duplicate (batch size, power limit) iteration rows")
        if self.default_batch_size not in sizes:
            raise ValueError(f"default_batch_size={self.default_batch_size} not in {sizes}")
        seeds = {b: sorted(r.seed for r in self.targets if r.batch_size == b) for b in sizes}
        reference = seeds[sizes[0]]
        if any(s != reference for s in seeds.values()) or len(set(reference)) != len(reference):
            raise ValueError(f"every batch size needs the same distinct seeds, got {seeds}")
        bad = [b for b in sizes if self.iters_per_epoch.get(b, 0) < 1]
        if bad:
            raise ValueError(f"iters_per_epoch missing or < 1 for batch sizes {bad}")
        for r in self.targets:
            if r.epochs is not None and r.epochs > self.max_epochs:
                raise ValueError(f"{r} needs more than max_epochs={self.max_epochs}; use None")
        return self

    @property
    def batch_sizes(self) -> list[int]:
        return sorted({r.batch_size for r in self.iterations})

    @property
    def power_limits_w(self) -> list[int]:
        """Power limits, descending (the profiling order)."""
        return sorted({r.power_limit_w for r in self.iterations}, reverse=True)

    @property
    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.targets if r.batch_size == self.default_batch_size})

    def iteration(self, batch_size: int, power_limit_w: int) -> IterationRow:
        for row in self.iterations:
            if row.batch_size == batch_size and row.power_limit_w == power_limit_w:
                return row
        raise ZeusConfigError(f"No iteration row for batch size {batch_size} at {power_limit_w} W.")

    def epochs_to_target(self, batch_size: int, seed: int) -> int | None:
        for row in self.targets:
            if row.batch_size == batch_size and row.seed == seed:
                return row.epochs
        raise ZeusConfigError(f"No target row for batch size {batch_size}, seed {seed}.")

    def epoch(self, batch_size: int, power_limit_w: int) -> tuple[float, float]:
        """(time s, energy J) of one epoch at a power limit."""
        row = self.iteration(batch_size, power_limit_w)
        time_s = row.iter_time_s * self.iters_per_epoch[batch_size]
        return time_s, time_s * row.iter_power_w


@dataclass(frozen=True)
class OracleChoice:
    """The best fixed choice in hindsight, and its total cost."""

    batch_size: int
    power_limit_w: int
    total_cost: float


@dataclass(frozen=True)
class SimulationResult:
    """What a simulation produced."""

    history: list[HistoryEntry]
    total_cost: float
    """Cost of every trial of the policy, summed."""
    oracle: OracleChoice
    default_cost: float | None
    """Total cost of the default batch size at the max power limit (None if it fails)."""
    seeds: list[int]
    """The seed drawn for each recurrence."""

    @property
    def ratio_to_oracle(self) -> float:
        return self.total_cost / self.oracle.total_cost


def _fixed_cost(
    tables: TraceTables, batch_size: int, power_limit_w: int, seeds: Sequence[int], eta: float
) -> float | None:
    time_s, energy_j = tables.epoch(batch_size, power_limit_w)
    epoch_cost = zeus_cost(energy_j, time_s, eta, tables.max_power_w)
    total = 0.0
    for seed in seeds:
        epochs = tables.epochs_to_target(batch_size, seed)
        if epochs is None:
            return None
        total += epochs * epoch_cost
    return total


def oracle(tables: TraceTables, seeds: Sequence[int], eta_knob: float) -> OracleChoice:
    """The cheapest fixed (batch size, power limit) reaching the target in every recurrence."""
    best: OracleChoice | None = None
    for bs in tables.batch_sizes:
        for pl in tables.power_limits_w:
            cost = _fixed_cost(tables, bs, pl, seeds, eta_knob)
            if cost is not None and (best is None or cost < best.total_cost):
                best = OracleChoice(batch_size=bs, power_limit_w=pl, total_cost=cost)
    if best is None:
        raise ZeusConfigError("No batch size reaches the target in every recurrence.")
    return best


def _profile_choice(tables: TraceTables, batch_size: int, profile_iters: int, eta: float) -> int:
    measurements = []
    for pl in tables.power_limits_w:
        row = tables.iteration(batch_size, pl)
        time_s = row.iter_time_s * profile_iters
        measurements.append(
            PowerLimitMeasurement(
                power_limit_w=pl, time_s=time_s, energy_j=time_s * row.iter_power_w
            )
        )
    return ZeusCost(eta).select(measurements)


def simulate(
    tables: TraceTables,
    *,
    num_recurrences: int,
    eta_knob: float = 0.5,
    beta_knob: float | None = 2.0,
    num_pruning_rounds: int = 2,
    window_size: int = 10,
    warmup_iters: int = 10,
    profile_iters: int = 40,
    seed: int = 0,
    max_tries: int = 20,
) -> SimulationResult:
    """Replay `num_recurrences` recurrences of the job under the policy (see the module)."""
    eta = check_eta_knob(eta_knob)
    if num_recurrences < 1:
        raise ZeusConfigError(f"num_recurrences={num_recurrences} must be >= 1.")
    rng = np.random.default_rng(seed)
    seeds = [int(s) for s in rng.choice(tables.seeds, size=num_recurrences)]
    config = JobConfig(
        job_id="simulated",
        batch_sizes=tables.batch_sizes,
        default_batch_size=tables.default_batch_size,
        eta_knob=eta,
        beta_knob=beta_knob,
        max_epochs=tables.max_epochs,
        num_pruning_rounds=num_pruning_rounds,
        window_size=window_size,
        mab_seed=seed,
        max_power_w=tables.max_power_w,
    )
    bso = LocalBatchSizeOptimizer()
    bso.register_job(config)
    optimum: dict[int, int] = {}
    history: list[HistoryEntry] = []
    max_pl = tables.power_limits_w[0]

    for rec_i, rec_seed in enumerate(seeds, start=1):
        for try_i in range(1, max_tries + 1):
            trial = bso.next_trial(config.job_id)
            bs = trial.batch_size
            needed = tables.epochs_to_target(bs, rec_seed)
            # Iterations still to spend profiling, as (power limit, iterations) in order.
            profiling: list[tuple[int, int]] = []
            if bs not in optimum:
                optimum[bs] = _profile_choice(tables, bs, profile_iters, eta)
                profiling = [(pl, warmup_iters + profile_iters) for pl in tables.power_limits_w]
            pl_opt = optimum[bs]
            time_s = energy_j = 0.0
            reached = False
            epochs = 0
            for epochs in range(1, tables.max_epochs + 1):
                left = tables.iters_per_epoch[bs]
                while profiling and left > 0:
                    pl, iters = profiling[0]
                    used = min(iters, left)
                    row = tables.iteration(bs, pl)
                    time_s += used * row.iter_time_s
                    energy_j += used * row.iter_time_s * row.iter_power_w
                    left -= used
                    profiling[0] = (pl, iters - used)
                    if profiling[0][1] == 0:
                        profiling.pop(0)
                row = tables.iteration(bs, pl_opt)
                time_s += left * row.iter_time_s
                energy_j += left * row.iter_time_s * row.iter_power_w
                if needed is not None and epochs >= needed:
                    reached = True
                    break
                cost = zeus_cost(energy_j, time_s, eta, tables.max_power_w)
                if trial.cost_ub is not None and cost > trial.cost_ub:
                    break
            record = bso.report(
                config.job_id,
                trial.trial_number,
                TrialResult(energy_j=energy_j, time_s=time_s, converged=reached, epochs=epochs),
            )
            history.append(
                HistoryEntry(
                    rec_i=rec_i,
                    try_i=try_i,
                    batch_size=bs,
                    energy_j=energy_j,
                    time_s=time_s,
                    reached=reached,
                    cost=record.cost
                    if record.cost is not None
                    else zeus_cost(energy_j, time_s, eta, tables.max_power_w),
                    power_limit_w=pl_opt,
                    stage=trial.stage,
                    emulated=tables.emulated,
                )
            )
            if reached:
                break
        else:
            raise ZeusConfigError(
                f"Recurrence {rec_i} did not reach the target in {max_tries} tries."
            )

    return SimulationResult(
        history=history,
        total_cost=float(sum(h.cost for h in history)),
        oracle=oracle(tables, seeds, eta),
        default_cost=_fixed_cost(tables, tables.default_batch_size, max_pl, seeds, eta),
        seeds=seeds,
    )


def make_emulator_tables(
    *,
    gpu_type: str = "A40",
    batch_sizes: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048),
    default_batch_size: int = 512,
    dataset_size: int = 200_000,
    pl_step_w: int = 25,
    num_seeds: int = 8,
    max_epochs: int = 100,
    base_epochs: float = 12.0,
    critical_batch_size: float = 512.0,
    epoch_noise: float = 0.08,
    seed: int = 0,
) -> TraceTables:
    """Tables from the emulated GPU's DVFS model and a convergence model.

    Iteration: a fixed overhead plus work proportional to the batch size, with the
    activity (utilisation) rising with the batch size; its time and power at each power
    limit come from `DVFSModel.run` at the max clock. Convergence: epochs to target grow
    as base · (1 + (bs / critical)²) with small batches paying a mild noise penalty, times
    log-normal noise per seed; runs beyond `max_epochs` never reach the target.
    """
    from zeus_power.device.dvfs import DVFSModel, Workload

    model = DVFSModel(gpu_type)
    spec = model.spec
    max_clock = spec.max_sm_clock_mhz
    top = int(spec.max_power_limit_w)
    low = math.ceil(spec.min_power_limit_w)
    limits = list(range(top, low - 1, -pl_step_w))
    if limits[-1] != low:
        limits.append(low)
    rng = np.random.default_rng(seed)
    iterations: list[IterationRow] = []
    targets: list[TargetRow] = []
    iters_per_epoch: dict[int, int] = {}
    for bs in sorted(batch_sizes):
        iters_per_epoch[bs] = math.ceil(dataset_size / bs)
        activity = min(0.95, 0.5 + 0.07 * math.log2(bs / 16))
        work = Workload(
            compute_s_at_max=0.004 + 1.6e-4 * bs, memory_s=0.002 + 2.5e-5 * bs, activity=activity
        )
        for pl in limits:
            run = model.run(work, max_clock, float(pl))
            iterations.append(
                IterationRow(
                    batch_size=bs,
                    power_limit_w=pl,
                    iter_time_s=run.time_s,
                    iter_power_w=run.power_w,
                )
            )
        mean_epochs = (
            base_epochs * (1 + (bs / critical_batch_size) ** 2) * (1 + 0.15 * (64 / bs) ** 0.5)
        )
        for s in range(num_seeds):
            epochs = math.ceil(mean_epochs * float(np.exp(rng.normal(0.0, epoch_noise))))
            targets.append(
                TargetRow(batch_size=bs, seed=s, epochs=epochs if epochs <= max_epochs else None)
            )
    return TraceTables(
        description=(
            f"Emulated {spec.product_name}: iterations from the DVFS model, epochs to target "
            f"from base={base_epochs}, critical batch size={critical_batch_size}, "
            f"noise={epoch_noise}, seed={seed}."
        ),
        max_power_w=spec.max_power_limit_w,
        default_batch_size=default_batch_size,
        max_epochs=max_epochs,
        iters_per_epoch=iters_per_epoch,
        iterations=iterations,
        targets=targets,
        emulated=True,
    )
