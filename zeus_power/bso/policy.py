"""The batch-size exploration policy, as pure functions of a job's trial records.

The server keeps no exploration state besides the trials themselves: every decision is
recomputed from the job's config and its trials inside one database transaction, so
concurrent clients can never see (or leave) a half-updated state.

Exploration has two stages.

**Pruning** (`num_pruning_rounds` rounds). Round 1 starts at the default batch size, then
tries smaller batch sizes in descending order, then larger ones in ascending order; a
failure (not converged, or early-stopped) ends that direction. The batch sizes that
converged survive. Round r > 1 repeats over the survivors of round r − 1, starting at the
cheapest of them. While the trial the walk waits on is still running, concurrent
requests get a *filler* trial: the best converged batch size so far (or the current
pivot); fillers never steer pruning but their costs count as observations.

**Thompson sampling** over the surviving arms with a Gaussian model of the reward −cost:
arms with fewer than `mab_num_explorations` observations (counting those in flight) are
tried first; then one posterior sample per arm, the largest wins. The generator is seeded
by (job seed, trial number), so a decision is reproducible.

Only converged trials can become the best; `cost_ub` = β × best cost.

**After each epoch** (`epoch_verdict`) a trial stops as converged when its validation metric
reaches the target, else fails when it has run `max_epochs` or its cost so far passed
`cost_ub`; otherwise it goes on. Our client (`zeus_power.bso.client`) and the Zeus-compatible
routes (`/zeus/report`) both ask this function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zeus_power.bso.models import JobConfig, JobStage, JobState, TrialRecord, TrialStage
from zeus_power.errors import ZeusBSOConflictError, ZeusBSORuntimeError
from zeus_power.metric import zeus_cost

__all__ = [
    "Decision",
    "EpochVerdict",
    "PruningOutcome",
    "best_trial",
    "cost_bound",
    "decide",
    "epoch_verdict",
    "job_state",
    "pruning_outcome",
    "stage_of",
]


@dataclass(frozen=True)
class Decision:
    """The next trial to hand out."""

    batch_size: int
    stage: TrialStage
    round: int | None = None


@dataclass(frozen=True)
class PruningOutcome:
    """Where the pruning walk stands.

    Exactly one of: `next` (a batch size to try in `round`), `waiting` (the walk waits on
    a trial in flight), `survivors` (pruning is over), `infeasible` (nothing converged).
    """

    round: int | None = None
    next: int | None = None
    waiting: bool = False
    pivot: int | None = None
    survivors: list[int] | None = None
    infeasible: bool = False


@dataclass(frozen=True)
class EpochVerdict:
    """Whether a trial goes on after an epoch, and if not, how it ended."""

    stop: bool
    converged: bool
    reason: str
    """Why it stopped (or "keep training")."""


def cost_bound(config: JobConfig, trials: Sequence[TrialRecord]) -> float | None:
    """The early-stop bound β × best cost (None: no converged trial yet, or β is None)."""
    best = best_trial(trials)
    if best is None or best.cost is None or config.beta_knob is None:
        return None
    return config.beta_knob * best.cost


def epoch_verdict(
    config: JobConfig,
    *,
    epochs: int,
    metric: float,
    time_s: float,
    energy_j: float,
    cost_ub: float | None,
) -> EpochVerdict:
    """Decide after epoch `epochs` (1-based) with `time_s` and `energy_j` spent so far."""
    if config.converged(metric):
        return EpochVerdict(
            stop=True, converged=True, reason=f"reached the target metric at epoch {epochs}"
        )
    if epochs >= config.max_epochs:
        return EpochVerdict(
            stop=True,
            converged=False,
            reason=f"max_epochs={config.max_epochs} reached with metric {metric}",
        )
    cost = zeus_cost(energy_j, time_s, config.eta_knob, config.total_max_power_w)
    if cost_ub is not None and cost > cost_ub:
        return EpochVerdict(
            stop=True,
            converged=False,
            reason=(
                f"cost {cost:.1f} passed the early-stop bound {cost_ub:.1f} "
                f"(beta_knob={config.beta_knob} x best cost)"
            ),
        )
    return EpochVerdict(stop=False, converged=False, reason="keep training")


def best_trial(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The cheapest converged trial (earliest on ties), or None."""
    done = [t for t in trials if t.converged and t.cost is not None]
    if not done:
        return None
    return min(done, key=lambda t: (t.cost, t.trial_number))


def pruning_outcome(config: JobConfig, trials: Sequence[TrialRecord]) -> PruningOutcome:
    """Walk the pruning rounds over the recorded pruning trials."""
    candidates = list(config.batch_sizes)
    pivot = config.default_batch_size
    for rnd in range(1, config.num_pruning_rounds + 1):
        results = {
            t.batch_size: t
            for t in trials
            if t.stage == "pruning" and t.round == rnd and t.status != "timed_out"
        }
        smaller = [b for b in reversed(candidates) if b < pivot]
        larger = [b for b in candidates if b > pivot]
        for direction in ([pivot], smaller, larger):
            for bs in direction:
                trial = results.get(bs)
                if trial is None:
                    return PruningOutcome(round=rnd, next=bs, pivot=pivot)
                if trial.status == "dispatched":
                    return PruningOutcome(round=rnd, waiting=True, pivot=pivot)
                if not trial.converged and bs != pivot:
                    break
        converged = [t for t in results.values() if t.converged and t.cost is not None]
        if not converged:
            if rnd == 1:
                return PruningOutcome(infeasible=True)
            break  # A noisy later round keeps the previous survivors.
        candidates = sorted(t.batch_size for t in converged)
        pivot = min(converged, key=lambda t: (t.cost, t.batch_size)).batch_size
    return PruningOutcome(survivors=candidates)


def stage_of(config: JobConfig, trials: Sequence[TrialRecord]) -> tuple[JobStage, list[int] | None]:
    """The job's stage and, once pruning is over, the surviving batch sizes."""
    outcome = pruning_outcome(config, trials)
    if outcome.infeasible:
        return "infeasible", None
    if outcome.survivors is not None:
        return "mab", outcome.survivors
    return "pruning", None


def decide(config: JobConfig, trials: Sequence[TrialRecord]) -> Decision:
    """The next trial for a job, given all its trials so far (ordered by trial number).

    Raises:
        ZeusBSOConflictError: No batch size reached the target metric in pruning round 1.
    """
    outcome = pruning_outcome(config, trials)
    if outcome.infeasible:
        raise ZeusBSOConflictError(
            f"Job {config.job_id!r}: no batch size of {config.batch_sizes} reached the target "
            f"metric {config.target_metric} in the first pruning round; relax target_metric "
            f"or raise max_epochs (currently {config.max_epochs}) and register a new job id."
        )
    if outcome.next is not None:
        return Decision(batch_size=outcome.next, stage="pruning", round=outcome.round)
    if outcome.waiting:
        best = best_trial(trials)
        filler = best.batch_size if best is not None else outcome.pivot
        return Decision(batch_size=filler or config.default_batch_size, stage="filler")
    if outcome.survivors is None:  # PruningOutcome holds exactly one of its answers
        raise ZeusBSORuntimeError(f"Job {config.job_id!r}: pruning ended without survivors")
    return Decision(batch_size=_thompson(config, trials, outcome.survivors), stage="mab")


def _thompson(config: JobConfig, trials: Sequence[TrialRecord], arms: list[int]) -> int:
    costs: dict[int, list[float]] = {arm: [] for arm in arms}
    in_flight: dict[int, int] = dict.fromkeys(arms, 0)
    for t in trials:
        if t.batch_size not in costs:
            continue
        if t.status == "dispatched":
            in_flight[t.batch_size] += 1
        elif t.cost is not None:
            costs[t.batch_size].append(t.cost)
    if config.window_size > 0:
        costs = {arm: c[-config.window_size :] for arm, c in costs.items()}

    # Exploration: arms that have not been observed often enough go first.
    seen = {arm: len(costs[arm]) + in_flight[arm] for arm in arms}
    unexplored = [arm for arm in arms if seen[arm] < config.mab_num_explorations]
    if unexplored:
        return min(unexplored, key=lambda arm: (seen[arm], arm))

    # Reward precision: the arm's own variance, else the pooled variance of the others.
    variances = [float(np.var(c)) for c in costs.values() if len(c) >= 2]
    pooled_var = float(np.mean(variances)) if variances else 0.0
    rng = np.random.default_rng([config.seed, len(trials) + 1])
    samples: dict[int, float] = {}
    for arm in arms:
        rewards = -np.asarray(costs[arm], dtype=float)
        var = float(np.var(rewards)) if len(rewards) >= 2 else pooled_var
        samples[arm] = _posterior_sample(
            rewards, var, config.mab_prior_mean, config.mab_prior_precision, rng
        )
    return max(arms, key=lambda arm: (samples[arm], -arm))


def _posterior_sample(
    rewards: np.ndarray,
    reward_var: float,
    prior_mean: float,
    prior_precision: float,
    rng: np.random.Generator,
) -> float:
    """One sample of the arm's mean reward from its Gaussian posterior (known variance)."""
    if len(rewards) == 0:
        if prior_precision == 0.0:
            return math.inf  # An arm never observed is worth a try.
        return float(rng.normal(prior_mean, 1.0 / math.sqrt(prior_precision)))
    if reward_var <= 0.0:
        return float(np.mean(rewards))  # Noise-free observations: the mean is known.
    reward_precision = 1.0 / reward_var
    precision = prior_precision + len(rewards) * reward_precision
    mean = (prior_precision * prior_mean + reward_precision * float(np.sum(rewards))) / precision
    return float(rng.normal(mean, 1.0 / math.sqrt(precision)))


def job_state(config: JobConfig, trials: Sequence[TrialRecord]) -> JobState:
    """The job's state as the API reports it (shared by the server and the local optimizer)."""
    stage, survivors = stage_of(config, trials)
    best = best_trial(trials)
    return JobState(
        config=config,
        stage=stage,
        survivors=survivors,
        best_batch_size=best.batch_size if best else None,
        best_cost=best.cost if best else None,
        num_trials=len(trials),
    )
