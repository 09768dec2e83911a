"""torch's ``pipeline_order`` as Perseus's per-rank instruction orders.

`compute_orders` keeps each pipeline rank's compute actions (F, B, I, W: ``forward``,
``backward``, ``backward_input``, ``backward_weight``) with their stage and microbatch;
bubbles and UNSHARD / RESHARD / REDUCE_GRAD / SEND / RECV actions are dropped, and
``OVERLAP_F_B`` actions become their sub-actions (torch's runtime runs them one after the
other when no custom function is registered for them). `renumber_single_stage` repairs the
microbatch numbers of torch's single-stage schedules (torch 2.13's `Schedule1F1B` numbers
its last rank's forwards from 1). No torch import: the actions are read by attribute.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from perseus.errors import ConfigurationError

__all__ = ["Action", "action_name", "compute_orders", "renumber_single_stage"]

Action = tuple[int, str, int]
"""(virtual stage, instruction kind, microbatch)."""

_KINDS = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight"}
_LETTERS = {kind: letter for letter, kind in _KINDS.items()}
_IGNORED = {"UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}


def action_name(action: Action) -> str:
    """An action as a message names it, with torch's own notation (e.g. ``1F3``)."""
    stage, kind, mb = action
    return f"{kind} of stage {stage}, microbatch {mb} (torch: {stage}{_LETTERS[kind]}{mb})"


def _type_value(action: Any) -> str:
    computation = action.computation_type
    return str(getattr(computation, "value", computation))


def _flatten(action: Any, *, rank: int, where: str) -> list[Action]:
    """The compute actions of one of torch's `_Action`s (OVERLAP_F_B: its sub-actions)."""
    value = _type_value(action)
    if value == "OVERLAP_F_B":
        subs = action.sub_actions or ()
        return [a for sub in subs for a in _flatten(sub, rank=rank, where=where)]
    if value in _IGNORED:
        return []
    kind = _KINDS.get(value)
    if kind is None:
        raise ConfigurationError(
            f"{where}: rank {rank}'s pipeline_order holds action {action!r} of type {value!r}, "
            f"which Perseus does not know (it measures {', '.join(_KINDS)})"
        )
    if action.microbatch_index is None:
        raise ConfigurationError(f"{where}: rank {rank}'s action {action!r} has no microbatch")
    return [(int(action.stage_index), kind, int(action.microbatch_index))]


def compute_orders(
    pipeline_order: dict[int, Sequence[Any]], num_ranks: int, *, where: str = "the schedule"
) -> list[list[Action]]:
    """Each pipeline rank's compute actions, in order, from torch's ``pipeline_order``.

    Bubbles (None) and non-compute actions are dropped; ``OVERLAP_F_B`` actions become their
    sub-actions (torch's runtime runs them one after the other when no custom function is
    registered for them).
    """
    if sorted(pipeline_order) != list(range(num_ranks)):
        raise ConfigurationError(
            f"{where}: pipeline_order has ranks {sorted(pipeline_order)} but the pipeline "
            f"group has {num_ranks} rank(s)"
        )
    return [
        [
            a
            for action in pipeline_order[rank]
            if action is not None
            for a in _flatten(action, rank=rank, where=where)
        ]
        for rank in range(num_ranks)
    ]


def renumber_single_stage(orders: list[list[Action]], num_microbatches: int) -> list[list[Action]]:
    """Orders of a single-stage schedule with each kind's microbatches numbered 0, 1, ...

    torch's single-stage schedules (`ScheduleGPipe`, `Schedule1F1B`) run each kind's
    microbatches in ascending order from 0, but their ``pipeline_order`` is built separately
    from the loop that runs them, and torch 2.13's `Schedule1F1B` numbers the last rank's
    forwards from 1 (``F1 .. FM``, an off-by-one: it executes ``F0 .. F(M-1)``). A rank whose
    actions of one kind are ``num_microbatches`` strictly ascending numbers gets them
    renumbered ``0 .. M-1``; anything else is left as is (and the run-time check of every
    executed action still compares against the result).
    """
    fixed = []
    for order in orders:
        by_kind: dict[tuple[int, str], list[int]] = {}
        for stage, kind, mb in order:
            by_kind.setdefault((stage, kind), []).append(mb)
        renumber = {
            key
            for key, mbs in by_kind.items()
            if len(mbs) == num_microbatches
            and mbs != list(range(num_microbatches))
            and all(a < b for a, b in itertools.pairwise(mbs))
        }
        seen: dict[tuple[int, str], int] = {}
        out = []
        for stage, kind, mb in order:
            if (stage, kind) in renumber:
                mb = seen.get((stage, kind), 0)
                seen[(stage, kind)] = mb + 1
            out.append((stage, kind, mb))
        fixed.append(out)
    return fixed
