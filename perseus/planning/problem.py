"""The adapter between the domain (profile, schedule, plans) and the generic solver.

`PipelineProblem` lays one (profile, schedule, blocking power) out as a
`perseus.solver.SolverProblem`: the instructions are the nodes (numbered in the
schedule's topological order), the DAG's edges are the edges, every (rank, stage, kind)
is an option type whose options are the profiled frequencies (label = MHz), and the
stages are the resources. Every edge between two pipeline ranks carries the P2P hop
latency as its lag (an activation or gradient takes that long to arrive; 0 by default).
It maps per-stage frequency lists to option indices and back.

Every number a plan is reported with comes from the solver's exact scoring
(`SolverProblem.account`), the project's one accounting implementation:

- iteration time ``T`` = the longest path of the instruction DAG, each instruction taking
  its profiled time at its planned frequency and each hop between ranks the hop latency;
- energy of one pipeline ``E = Σ eᵢ + P_block · (S·T − Σ tᵢ)``: the profiled energy of every
  instruction, plus the power ``P_block`` each of the S GPUs draws while it is not computing
  (blocked on P2P communication, waiting on a hop, or idle in a pipeline bubble) for the
  rest of the iteration.

The domain cannot import the solver (layers: errors → domain → io / solver → planning), so
`evaluate`, `timeline` and `make_plan` here are how the schedulers, the CLI, the demo and
the server score plans.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from perseus.domain.plan import Evaluation, Plan, ScheduledInstruction, check_plan_shape
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import Instruction, PipelineSchedule
from perseus.errors import PlanError, SolverError
from perseus.solver.problem import OptionTable, SolverProblem

MAX_HOP_LATENCY_S = 10.0
"""The largest hop latency accepted (s): far above any real P2P transfer, so a value past it
is a unit mistake (ms for s), not a network."""

__all__ = [
    "MAX_HOP_LATENCY_S",
    "PipelineProblem",
    "check_hop_latency",
    "evaluate",
    "evaluate_plan",
    "make_plan",
    "max_frequencies",
    "pipeline_problem",
    "stage_busy_s",
    "timeline",
]


class PipelineProblem:
    """The solver's problem for one (profile, schedule, blocking power, hop latency), and
    the way back.

    `hop_latency_s` is the lag of every edge between two pipeline ranks (see the module
    docstring). Raises `ScheduleError` when the profile does not fit the schedule,
    `SolverError` for a blocking power that is not a finite number of watts >= 0 or a hop
    latency outside ``0..MAX_HOP_LATENCY_S`` seconds.
    """

    def __init__(
        self,
        profile: InstructionProfile,
        schedule: PipelineSchedule,
        p2p_power_w: float,
        *,
        hop_latency_s: float = 0.0,
    ):
        hop_latency_s = check_hop_latency(hop_latency_s)
        schedule.check_profile(profile)
        self.profile = profile
        self.schedule = schedule
        self.p2p_power_w = float(p2p_power_w)
        instructions = schedule.instructions()
        index = {instr: k for k, instr in enumerate(instructions)}
        type_index: dict[tuple[int, int, str], int] = {}
        type_kinds: list[str] = []
        options: list[OptionTable] = []
        type_of = np.empty(len(instructions), dtype=np.int64)
        for k, instr in enumerate(instructions):
            key = (instr.rank, instr.stage, instr.kind)
            if key not in type_index:
                type_index[key] = len(options)
                o = schedule.options(profile, instr)
                options.append(OptionTable(o.time_s, o.energy_j, o.freq_mhz))
                type_kinds.append(instr.kind)
            type_of[k] = type_index[key]
        dag_edges = schedule.edges()
        edges = [(index[u], index[v]) for u, v in dag_edges]
        # Edges between two pipeline ranks: a P2P hop each.
        self.cross_rank = np.array([u.rank != v.rank for u, v in dag_edges], dtype=bool)
        self.hop_latency_s = hop_latency_s
        stage_index = [np.array([index[i] for i in o], dtype=np.int64) for o in schedule.orders]
        # The staggered dithering's lead ramps in over the first min(S, M) microbatches
        # (`perseus.solver.frontier.staggered_lead`).
        microbatch = np.array([ins.microbatch for ins in instructions], dtype=float)
        ramp_length = min(len(stage_index), int(microbatch.max()) + 1) if len(microbatch) else 1
        self.instructions: list[Instruction] = instructions
        self.stage_index = stage_index
        self._lookup: list[dict[int, int]] | None = None
        self.solver = SolverProblem.build(
            edges=edges,
            type_of=type_of,
            options=options,
            resources=stage_index,
            p2p_power_w=self.p2p_power_w,
            lead_ramp=np.minimum(1.0, (microbatch + 1) / ramp_length),
            edge_lag_s=self._edge_lags(hop_latency_s),
        )

    def _edge_lags(self, hop_latency_s: float) -> np.ndarray:
        return np.where(self.cross_rank, hop_latency_s, 0.0)

    def with_hop_latency(self, hop_latency_s: float) -> PipelineProblem:
        """This problem with another hop latency (shares the DAG layout: cheap)."""
        hop_latency_s = check_hop_latency(hop_latency_s)
        if hop_latency_s == self.hop_latency_s:
            return self
        other = object.__new__(PipelineProblem)
        other.__dict__.update(self.__dict__)
        other.hop_latency_s = hop_latency_s
        other.solver = self.solver.with_edge_lag(self._edge_lags(hop_latency_s))
        return other

    # ------------------------------------------------------------------ plans ↔ choices
    def choice_of(self, frequencies: list[list[int]]) -> np.ndarray:
        """Option indices ``(n,)`` of a plan given per stage, in execution order.

        Raises `PlanError` when the plan's shape does not fit the schedule or a frequency
        was not profiled for its instruction.
        """
        check_plan_shape(self.schedule, frequencies)
        pb = self.solver
        if self._lookup is None:
            lookup: list[dict[int, int]] = []
            for o in pb.type_options:
                first: dict[int, int] = {}
                for k, f in enumerate(o.label):
                    first.setdefault(int(f), k)
                lookup.append(first)
            self._lookup = lookup
        choice = np.empty(pb.n, dtype=np.int64)
        for stage, (idx, freqs) in enumerate(zip(self.stage_index, frequencies, strict=True)):
            for i, freq in zip(idx, freqs, strict=True):
                k = self._lookup[pb.type_of[i]].get(int(freq))
                if k is None:
                    labels = pb.type_options[pb.type_of[i]].label
                    raise PlanError(
                        f"Stage {stage}: {self.instructions[i].kind} at {freq} MHz is not in "
                        f"the profile (profiled {int(labels.min())}..{int(labels.max())} MHz)"
                    )
                choice[i] = k
        return choice

    def frequencies_of(self, choice: np.ndarray) -> list[list[int]]:
        """One plan's option indices ``(n,)`` as per-stage frequency lists."""
        freq = self.solver.choices_to_labels(choice)
        return [[int(f) for f in freq[idx]] for idx in self.stage_index]

    # ------------------------------------------------------------------ accounting
    def evaluate(
        self, frequencies: list[list[int]], *, switch_latency_s: float = 0.0
    ) -> Evaluation:
        """Exact iteration time and energy of a plan (per stage, execution order), each hop
        taking this problem's hop latency; with `switch_latency_s` > 0, each clock change
        takes that long to apply (`perseus.planning.switching`)."""
        if switch_latency_s > 0:
            from perseus.planning.switching import switching_accounting

            return switching_accounting(self, frequencies, switch_latency_s)
        T, E, C, B = self.solver.account(self.choice_of(frequencies)[:, None])
        return Evaluation(float(T[0]), float(E[0]), float(C[0]), float(B[0]))

    def timeline(self, frequencies: list[list[int]]) -> list[ScheduledInstruction]:
        """Every instruction at its earliest start (hops included), in the schedule's
        topological order."""
        choice = self.choice_of(frequencies)
        time_s, energy_j = self.solver.choices_to_arrays(choice)
        start, finish = self.solver.start_finish(time_s)
        freq = self.solver.choices_to_labels(choice)
        return [
            ScheduledInstruction(ins, int(f), float(s), float(t), float(e))
            for ins, f, s, t, e in zip(
                self.instructions, freq, start, finish, energy_j, strict=True
            )
        ]

    def stage_busy_s(self, frequencies: list[list[int]]) -> list[float]:
        """Per stage, the plan's total computation time (exactly rounded sums)."""
        time_s, _ = self.solver.choices_to_arrays(self.choice_of(frequencies))
        return [math.fsum(time_s[idx]) for idx in self.stage_index]


_CACHE_SIZE = 8
_cache: list[PipelineProblem] = []
_cache_lock = threading.Lock()


def check_hop_latency(hop_latency_s: float) -> float:
    """`hop_latency_s` as a float; `SolverError` unless it is 0..`MAX_HOP_LATENCY_S` seconds."""
    try:
        value = float(hop_latency_s)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0.0 <= value <= MAX_HOP_LATENCY_S):
        raise SolverError(
            f"The hop latency must be between 0 and {MAX_HOP_LATENCY_S:g} s, got "
            f"{hop_latency_s!r} (a P2P hop is microseconds to milliseconds)"
        )
    return value


def pipeline_problem(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    p2p_power_w: float,
    *,
    hop_latency_s: float = 0.0,
) -> PipelineProblem:
    """A `PipelineProblem`, reused for the same profile and schedule objects, power and hop
    latency.

    Scoring plans one at a time (the schedulers, the CLI, the tests) would otherwise lay
    the same DAG out again for every plan. Profiles and schedules are never mutated; the
    few most recent problems are kept (with their profile and schedule, so that the
    identity comparison cannot meet a recycled object). A problem cached at another hop
    latency is re-lagged instead of laid out again.
    """
    p2p = float(p2p_power_w)
    hop = check_hop_latency(hop_latency_s)
    sibling = None
    with _cache_lock:
        for k, pp in enumerate(_cache):
            if pp.profile is profile and pp.schedule is schedule and pp.p2p_power_w == p2p:
                if pp.hop_latency_s == hop:
                    _cache.append(_cache.pop(k))
                    return pp
                sibling = pp
    if sibling is not None:
        pp = sibling.with_hop_latency(hop)
    else:
        pp = PipelineProblem(profile, schedule, p2p, hop_latency_s=hop)
    with _cache_lock:
        _cache.append(pp)
        del _cache[:-_CACHE_SIZE]
    return pp


def evaluate(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    frequencies: list[list[int]],
    p2p_power_w: float,
    *,
    switch_latency_s: float = 0.0,
    hop_latency_s: float = 0.0,
) -> Evaluation:
    """Exact iteration time and energy of a plan (`frequencies`: per stage, execution order),
    each clock change taking `switch_latency_s` to apply and each hop between two pipeline
    ranks `hop_latency_s`."""
    return pipeline_problem(profile, schedule, p2p_power_w, hop_latency_s=hop_latency_s).evaluate(
        frequencies, switch_latency_s=switch_latency_s
    )


def evaluate_plan(
    profile: InstructionProfile,
    plan: Plan,
    *,
    switch_latency_s: float | None = None,
    hop_latency_s: float | None = None,
) -> Evaluation:
    """Re-score a plan file against a profile (at the plan's own blocking power and, by
    default, its own switching and hop latencies)."""
    latency = plan.switch_latency if switch_latency_s is None else switch_latency_s
    hop = plan.hop_latency if hop_latency_s is None else hop_latency_s
    return evaluate(
        profile,
        plan.pipeline_schedule(),
        plan.stage_frequencies(),
        plan.p2p_power,
        switch_latency_s=latency,
        hop_latency_s=hop,
    )


def timeline(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    frequencies: list[list[int]],
    *,
    hop_latency_s: float = 0.0,
) -> list[ScheduledInstruction]:
    """Place every instruction at its earliest start (in a topological order of the DAG),
    each hop between two pipeline ranks taking `hop_latency_s`."""
    return pipeline_problem(profile, schedule, 0.0, hop_latency_s=hop_latency_s).timeline(
        frequencies
    )


def stage_busy_s(
    profile: InstructionProfile, schedule: PipelineSchedule, frequencies: list[list[int]]
) -> list[float]:
    """Per stage, the plan's total computation time (s)."""
    return pipeline_problem(profile, schedule, 0.0).stage_busy_s(frequencies)


def make_plan(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    frequencies: list[list[int]],
    p2p_power_w: float,
    *,
    switch_latency_s: float = 0.0,
    hop_latency_s: float = 0.0,
) -> Plan:
    """A plan file's model for `frequencies`, with its exact time and energy (marked
    emulated when the profile is; clock changes taking `switch_latency_s`, hops between
    ranks `hop_latency_s`)."""
    evaluation = evaluate(
        profile,
        schedule,
        frequencies,
        p2p_power_w,
        switch_latency_s=switch_latency_s,
        hop_latency_s=hop_latency_s,
    )
    return Plan.from_frequencies(
        schedule,
        frequencies,
        p2p_power_w=p2p_power_w,
        evaluation=evaluation,
        emulated=profile.emulated,
        switch_latency_s=switch_latency_s,
        hop_latency_s=hop_latency_s,
    )


def max_frequencies(profile: InstructionProfile, schedule: PipelineSchedule) -> list[list[int]]:
    """The all-maximum-frequency plan (each instruction at its highest profiled frequency)."""
    schedule.check_profile(profile)
    return [
        [int(schedule.options(profile, i).freq_mhz.max()) for i in order]
        for order in schedule.orders
    ]


def all_max_plan(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    p2p_power_w: float,
    *,
    switch_latency_s: float = 0.0,
    hop_latency_s: float = 0.0,
) -> Plan:
    """The all-max plan (`max_frequencies`) scored like any other (`make_plan`): the
    reference every predicted saving and slowdown is taken against."""
    return make_plan(
        profile,
        schedule,
        max_frequencies(profile, schedule),
        p2p_power_w,
        switch_latency_s=switch_latency_s,
        hop_latency_s=hop_latency_s,
    )
