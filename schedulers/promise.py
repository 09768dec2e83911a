"""The promise of the plan `Perseus` runs: the rounds that check it and the record of it.

`Promise` keeps the all-max rounds (the reference of every measured saving and slowdown),
the rounds of the plan running now, the `PromiseGuard` that compares the two, and the
`JobStory` every step goes to. `Perseus` decides when a plan runs; the promise records the
deployment or the hold with its prediction, turns the guard's verdicts into "keep",
"move to a faster plan" or "fall back to all-max", and states the measured result.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from perseus.domain.plan import Plan
from schedulers.costs import CostModel
from schedulers.guard import GuardDecision, PromiseGuard, RoundFigures, median_figures
from schedulers.perseus_args import PerseusArgs
from schedulers.story import JobStory

__all__ = ["Promise", "Verdict"]

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
    """

    def __init__(
        self,
        job_id: str,
        record_path: Path,
        args: PerseusArgs,
        predict: Callable[[Plan], tuple[float, float]],
    ) -> None:
        self.guarded = args.guard and args.baseline_rounds > 0
        """The guard watches deployed plans (it needs all-max rounds to compare with)."""
        self.guard = PromiseGuard(
            budget=args.max_slowdown,
            window=args.guard_window,
            z=args.guard_z,
            baseline_window=max(4, args.baseline_rounds + 1),
        )
        self.story = JobStory(job_id, record_path)
        self.baseline: list[RoundFigures] = []
        """The measured all-max rounds."""
        self.plan_rounds: list[RoundFigures] = []
        """The measured rounds of the plan running now (since `plan_since`)."""
        self.plan_since = 0
        self._predict = predict

    def add_baseline(self, figures: RoundFigures) -> None:
        self.baseline.append(figures)
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
        ``deployed``, or ``move`` for the guard's move to a faster plan)."""
        self.plan_rounds, self.plan_since = [], first_round
        saving, slowdown = self._predict(plan)
        if self.guarded:
            self.guard.watch(slowdown)
        text = (
            f"{'deployed' if event == 'deployed' else 'moved to'} a plan predicted to save "
            f"{saving:.2%} at {_pct(slowdown)} slowdown ({reason})"
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
        """All-max (`plan`) runs from `first_round`, for `problems`."""
        self.plan_rounds, self.plan_since = [], first_round
        self.guard.hold()
        reason = "; ".join(problems)
        self.record(round_, event, reason, plan=plan, warning=True, text=f"all-max stays: {reason}")

    def verdict(
        self,
        round_: int,
        decision: GuardDecision,
        faster: Callable[[GuardDecision], Plan | None],
    ) -> Verdict:
        """Record the guard's `decision` and say what it asks for (`Verdict`); `faster`
        finds the faster plan a ``faster`` move asks for (None: there is none)."""
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
            reason = decision.reason + "; no faster plan meets the budget with the measured costs"
        else:
            reason = decision.reason
        self.record(round_, "check", reason, text=None, **figures)
        return None, f"guard: {reason}"

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
