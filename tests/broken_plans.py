"""Schedulers that break Perseus's promise on purpose: the e2e checks must fail on them.

Each is `Perseus` itself (same profile, frontier, prediction, guard and report) except for
what the ranks run once a plan is deployed. The e2e tests that judge a deployed plan
(`test_e2e_promise.py`, `test_e2e_perseus.py`, `test_e2e_schedules.py`) take their
scheduler from ``PERSEUS_E2E_SCHEDULER`` (`e2e_fixtures.scheduler_under_test`), so that

    PERSEUS_E2E_SCHEDULER=broken_plans:SlowPlan python -m pytest -p no:xdist tests/e2e/test_e2e_promise.py

runs the same job against a plan that breaks its promise, and shows the checks failing
(docs/testing-notes.md, "Checks that fail when the promise does"). The coordinator loads
them as plugins (``module:Class``) from this folder, which the fixtures put on its
``PYTHONPATH``.
"""

from __future__ import annotations

from perseus.schedulers.measurement import StagePlan
from perseus.schedulers.perseus_scheduler.phase import PerseusPhase
from perseus.schedulers.perseus_scheduler.scheduler import Perseus

__all__ = ["NoSaving", "SlowPlan"]

SLOW_CLOCK_SHARE = 0.6
"""`SlowPlan` runs every instruction at the supported clock nearest this share of the max."""


class SlowPlan(Perseus):
    """Announces the plan Perseus chose and runs every instruction at ~60 % of the max clock
    instead: far slower than the budget it promised."""

    def _deployed_plan(self) -> StagePlan:
        plan = super()._deployed_plan()
        if self.phase is not PerseusPhase.DEPLOYED:
            return plan
        slow = min(self.frequencies, key=lambda f: abs(f - SLOW_CLOCK_SHARE * self.max_freq_mhz))
        return self.uniform_plan(slow)


class NoSaving(Perseus):
    """Announces the plan Perseus chose and runs all-max instead: on time, and none of the
    promised saving."""

    def _deployed_plan(self) -> StagePlan:
        plan = super()._deployed_plan()
        return self.max_plan() if self.phase is PerseusPhase.DEPLOYED else plan
