"""The promise of the plan `Perseus` runs: the rounds that check it and the record of it.

`Promise` keeps the all-max rounds (the reference of every measured saving and slowdown),
the rounds of the plan running now, the `PromiseGuard` that compares the two, and the
`JobStory` every step goes to. `Perseus` decides when a plan runs; the promise records the
deployment or the hold with its prediction, turns the guard's verdicts into "keep",
"move to a faster plan" or "fall back to all-max" (for a cool-down, then "redeploy"), and
states the measured result.

Both histories are bounded windows (`perseus.domain.robust.ROUND_WINDOW`): the all-max
rounds are the guard's, the plan's rounds the newest of the plan running now. What the
guard needs after a coordinator restart (its all-max rounds, its state, its back-off) is
kept in the job's ``guard.json`` (`save`, written atomically when the coordinator dumps its
state; a few kB) and read back by `load` when the job is resumed.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perseus.domain.plan import Plan
from perseus.domain.robust import ROUND_WINDOW
from perseus.io.atomic import atomic_write_text
from perseus.schedulers.perseus_scheduler.args import PerseusArgs
from perseus.schedulers.perseus_scheduler.costs import CostModel
from perseus.schedulers.perseus_scheduler.guard import (
    GuardDecision,
    PromiseGuard,
    RoundFigures,
    median_figures,
)
from perseus.schedulers.perseus_scheduler.story import JobStory

__all__ = ["GUARD_STATE_VERSION", "SAVE_EVERY", "Promise", "Verdict"]

logger = logging.getLogger(__name__)

GUARD_STATE_VERSION = 1
"""The version of ``guard.json``'s layout; another one is not read (the guard re-measures)."""

SAVE_EVERY = 10
"""Rounds between two writes of ``guard.json`` when nothing but all-max rounds changed (every
decision is written at once): a restart loses at most this many rounds of a cool-down."""

Verdict = tuple[Plan | None, str | None]
"""What the guard's verdict asks for: (a faster plan to move to, its reason), (None, the
reason to fall back to all-max), or (None, None): keep the plan."""


def _pct(x: float) -> str:
    return f"{x:+.2%}"


class Promise:
    """The checked promise of one job's plans (see the module docstring).

    Args:
        job_id: The job, for the log.
        record_path: The job's ``promise.jsonl``.
        args: `Perseus`'s arguments (the budget and the guard's settings).
        predict: A plan → its predicted (saving, slowdown) against all-max.
        state_path: The job's ``guard.json`` (None: the guard's state is not kept, the
            coordinator does not dump its state and so resumes no job).
    """

    def __init__(
        self,
        job_id: str,
        record_path: Path,
        args: PerseusArgs,
        predict: Callable[[Plan], tuple[float, float]],
        *,
        state_path: Path | None = None,
    ) -> None:
        self.guarded = args.guard and args.baseline_rounds > 0
        """The guard watches deployed plans (it needs all-max rounds to compare with)."""
        self.guard = PromiseGuard(
            budget=args.max_slowdown,
            window=args.guard_window,
            z=args.guard_z,
            baseline_window=max(ROUND_WINDOW, args.baseline_rounds + 1),
        )
        self.story = JobStory(job_id, record_path)
        self.plan_rounds: deque[RoundFigures] = deque(maxlen=ROUND_WINDOW)
        """The newest measured rounds of the plan running now (since `plan_since`)."""
        self.plan_since = 0
        self.state_path = state_path
        self._saved_round: int | None = None
        self._predict = predict

    @property
    def baseline(self) -> deque[RoundFigures]:
        """The newest measured all-max rounds (the guard's window, oldest first)."""
        return self.guard.baseline

    def add_baseline(self, figures: RoundFigures) -> None:
        self.guard.add_baseline(figures)

    def note(self, text: str, *, warning: bool = False) -> None:
        self.story.note(text, warning=warning)

    def costs_known(self, costs: CostModel) -> None:
        """Tell the job the cost model its plans are scored with."""
        self.note(f"cost model: {costs.describe()}")
        if costs.switch_source == "unknown":
            self.note(
                "no rank could time a clock switch on its GPU: planning as if changes were "
                "free (set switch_latency_ms to override)",
                warning=True,
            )

    def record(
        self,
        round_: int,
        event: str,
        reason: str,
        *,
        plan: Plan | None = None,
        warning: bool = False,
        text: str | None,
        **extra: Any,
    ) -> None:
        """An event on record (with `plan`: its prediction); `text`, if any, for the log."""
        entry: dict[str, Any] = {"round": round_, "event": event, "reason": reason, **extra}
        if plan is not None:
            saving, slowdown = self._predict(plan)
            entry |= {
                "predicted_saving": saving,
                "predicted_slowdown": slowdown,
                "iteration_time_s": plan.iteration_time,
                "energy_j": plan.energy,
            }
        self.story.record(entry)
        if text is not None:
            self.note(text, warning=warning)

    def deployed(
        self,
        round_: int,
        first_round: int,
        plan: Plan,
        event: str,
        reason: str,
        *,
        costs: CostModel | None = None,
    ) -> None:
        """`plan` (a frontier point) runs from `first_round`: watch it and say so (`event`:
        ``deployed``, ``move`` for the guard's move to a faster plan, ``redeploy`` after
        a cool-down)."""
        self.plan_rounds.clear()
        self.plan_since = first_round
        saving, slowdown = self._predict(plan)
        if self.guarded:
            if event == "redeploy":
                self.guard.redeploy(slowdown)
            else:
                self.guard.watch(slowdown)
        verb = {"deployed": "deployed", "redeploy": "re-deployed"}.get(event, "moved to")
        text = (
            f"{verb} a plan predicted to save {saving:.2%} at {_pct(slowdown)} slowdown ({reason})"
        )
        if self.guarded and event == "deployed":
            text += (
                f"; checked against the {len(self.baseline)} all-max rounds over the next "
                f"{1 + self.guard.window} rounds"
            )
        model = {}
        if costs is not None:
            model = {
                "switch_latency_s": costs.switch_latency_s,
                "hop_latency_s": costs.hop_latency_s,
                "model_residual": costs.residual,
            }
        self.record(
            round_, event, reason, plan=plan, warning=event != "deployed", text=text, **model
        )

    def held(
        self, round_: int, first_round: int, plan: Plan, event: str, problems: list[str]
    ) -> None:
        """All-max (`plan`) runs from `first_round`, for `problems`: for good (``held``:
        a check before deployment failed), or for the guard's cool-down (``fallback``)."""
        self.plan_rounds.clear()
        self.plan_since = first_round
        reason = "; ".join(problems)
        if event != "fallback" or not self.guarded:
            self.guard.hold()
            self.record(
                round_, event, reason, plan=plan, warning=True, text=f"all-max stays: {reason}"
            )
            return
        if not self.guard.cooling:  # a faster move found no plan: the guard falls back here
            self.guard.fall_back()
        rounds = self.guard.cooldown_left
        self.record(
            round_,
            event,
            reason,
            plan=plan,
            warning=True,
            text=(
                f"all-max for {rounds} round(s): {reason}; then the plan is re-deployed if "
                "fresh all-max rounds support it"
            ),
            cooldown_rounds=rounds,
        )

    def verdict(
        self,
        round_: int,
        decision: GuardDecision,
        faster: Callable[[GuardDecision], Plan | None],
        *,
        no_faster: str = "no faster plan meets the budget with the measured costs",
    ) -> Verdict:
        """Record the guard's `decision` and say what it asks for (`Verdict`); `faster`
        finds the faster plan a ``faster`` move asks for (None: there is none, for the
        reason `no_faster`)."""
        figures = {
            "measured_slowdown": decision.measured_slowdown,
            "measured_saving": decision.measured_saving,
            "slowdown_tolerance": decision.slowdown_tolerance,
            "saving_tolerance": decision.saving_tolerance,
            "rounds": list(decision.rounds),
        }
        if decision.move is None:
            # The first verdict on a plan is news for the job's log; later ones only when
            # they are not "still keeps" (they stay in promise.jsonl and /jobs either way).
            quiet = decision.reason.startswith("still keeps")
            text = None if quiet else f"guard: {decision.reason}"
            self.record(round_, "check", decision.reason, text=text, **figures)
            return None, None
        if decision.move == "faster":
            plan = faster(decision)
            if plan is not None:
                self.record(round_, "check", decision.reason, warning=True, text=None, **figures)
                return plan, f"guard: {decision.reason}; re-scored with the measured costs"
            reason = f"{decision.reason}; {no_faster}"
        else:
            reason = decision.reason
        self.record(round_, "check", reason, text=None, **figures)
        return None, f"guard: {reason}"

    # ------------------------------------------------------------------ restarts
    def save(self, round_: int, *, force: bool = False) -> None:
        """Write the guard's state to ``guard.json`` (atomically: a reader, or a restart
        after ``kill -9``, never sees half of it): at once when `force` (a decision), else
        at most every `SAVE_EVERY` rounds. Nothing without a `state_path`."""
        if self.state_path is None:
            return
        if not force and self._saved_round is not None and round_ - self._saved_round < SAVE_EVERY:
            return
        state = {
            "version": GUARD_STATE_VERSION,
            "round": round_,
            "guarded": self.guarded,
            "guard": self.guard.to_state(),
        }
        try:
            atomic_write_text(self.state_path, json.dumps(state) + "\n")
        except OSError as exc:
            logger.warning(
                "Job %s: could not write %s: %s", self.story.job_id, self.state_path, exc
            )
            return
        self._saved_round = round_

    def load(self) -> dict[str, Any] | None:
        """The state `save` wrote, checked (None: no ``guard.json``, e.g. a dump from before
        it existed, or one this version cannot read, which the job's log is told about)."""
        path = self.state_path
        if path is None or not path.is_file():
            return None
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(state, dict) or state.get("version") != GUARD_STATE_VERSION:
                raise ValueError(f"not version {GUARD_STATE_VERSION} of the guard's state")
            int(state["round"])
            probe = PromiseGuard(budget=0.0, baseline_window=self.guard.baseline_window)
            probe.restore(state["guard"])  # raises on a state it cannot go on from
        except (OSError, ValueError, TypeError, KeyError) as exc:
            self.note(f"{path.name} is not usable ({exc}): the guard starts afresh", warning=True)
            return None
        return state

    def summary(self, text: str, *, held: bool) -> str:
        """`text` (the job's energy so far) after the measured saving and slowdown of the
        plan running now (all-max when `held`) against the all-max rounds."""
        if not self.baseline or not self.plan_rounds:
            return text
        t0, e0 = median_figures(self.baseline)
        t1, e1 = median_figures(self.plan_rounds)
        what = "all-max (held)" if held else "the plan"
        return (
            f"measured saving {1 - e1 / e0:.2%} at {_pct(t1 / t0 - 1)} slowdown (medians of "
            f"{len(self.plan_rounds)} round(s) of {what} since round {self.plan_since} vs "
            f"{len(self.baseline)} all-max round(s)); {text}"
        )
