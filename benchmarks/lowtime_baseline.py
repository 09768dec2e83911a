"""Run lowtime 0.3.0 (the public Perseus solver) on one of our schedules.

This follows lowtime's own Perseus example flow, on *our* DAG (same instructions, same
edges) so both solvers see the same problem:

- per (stage, instruction), every profiled row becomes an ``ExecutionOption`` with
  ``real_time`` = profiled time, ``unit_time`` = ``unit_time_s`` (1 ms by default, the
  example's ``--unit-time``), ``cost`` = profiled energy, ``knob`` = frequency;
  ``CandidateExecutionOptions`` keeps the Pareto options and one per quantised time;
- as in the example, each candidate's cost becomes the effective computation energy
  ``e − P_block · quant_time · unit_time``;
- ``ExponentialModel`` fits ``a·exp(b·t) + c`` to those points (its default grid search);
- a dummy source and sink are added and ``PhillipsDessouky(dag).run()`` shortens the
  iteration one time unit per iteration from all-slowest to all-fastest.

Every iteration's plan (each instruction's ``assigned_knob``) is collected; the caller
scores the plans with our exact accounting. lowtime's own energy figures (its fitted
curve) are returned too, for reference only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import networkx as nx

from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import Instruction, PipelineSchedule

__all__ = ["LowtimeResult", "run_lowtime"]


@dataclass
class LowtimeResult:
    """Plans (per-stage frequencies in execution order) lowtime produced, and its timing."""

    plans: list[list[list[int]]]
    model_cost_j: list[float]  # lowtime's fitted-curve effective cost of each plan
    model_time_s: list[float]  # lowtime's quantised iteration time of each plan
    wall_s: float


def run_lowtime(
    profile: InstructionProfile,
    schedule: PipelineSchedule,
    *,
    p2p_power_w: float,
    unit_time_s: float = 1e-3,
) -> LowtimeResult:
    """Run lowtime's Phillips–Dessouky solver on `schedule`'s DAG (see the module docstring)."""
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import add_sink_node, add_source_node
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward
    from lowtime.solver import PhillipsDessouky

    logging.getLogger("lowtime").setLevel(logging.WARNING)
    start = time.perf_counter()
    specs: dict[tuple[int, int, str], OperationSpec] = {}
    for instr in schedule.instructions():
        key = (instr.rank, instr.stage, instr.kind)
        if key in specs:
            continue
        opts = schedule.options(profile, instr)
        options = [
            ExecutionOption[int](
                real_time=float(t), unit_time=unit_time_s, cost=float(e), knob=int(f)
            )
            for f, t, e in zip(opts.freq_mhz, opts.time_s, opts.energy_j, strict=True)
        ]
        candidates = CandidateExecutionOptions[int](options=options)
        for option in candidates.options:
            option.cost -= option.quant_time * unit_time_s * p2p_power_w
        specs[key] = OperationSpec[int](options=candidates, cost_model=ExponentialModel(candidates))

    dag = nx.DiGraph()
    node_of: dict[Instruction, int] = {}
    ops = {}
    for node_id, instr in enumerate(schedule.instructions(), start=2):
        cls = Forward if instr.kind == "forward" else Backward
        op = cls(
            spec=specs[instr.rank, instr.stage, instr.kind],
            stage_id=instr.rank,
            micro_batch_id=instr.microbatch,
        )
        dag.add_node(node_id, op=op)
        node_of[instr] = node_id
        ops[instr] = op
    for u, v in schedule.dag().edges():
        dag.add_edge(node_of[u], node_of[v])
    add_source_node(dag, 0)
    add_sink_node(dag, 1)
    dag.graph["source_node"] = 0
    dag.graph["sink_node"] = 1

    plans: list[list[list[int]]] = []
    costs: list[float] = []
    model_times: list[float] = []

    def snapshot() -> list[list[int]]:
        return [[int(ops[i].assigned_knob) for i in order] for order in schedule.orders]

    solver = PhillipsDessouky(dag)
    for result in solver.run():
        plans.append(snapshot())
        costs.append(float(result.cost))
        model_times.append(float(result.real_time))
    return LowtimeResult(
        plans=plans,
        model_cost_j=costs,
        model_time_s=model_times,
        wall_s=time.perf_counter() - start,
    )
