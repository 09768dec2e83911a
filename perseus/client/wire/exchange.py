"""A round's exchange with the coordinator, run off the training thread.

At a round's end every rank folds its result into its stage leader's (`JobFanOut.gather`);
the leader reports the group's result, long-polls for the next schedule and hands it out to
its group; the others receive it (`perseus.client.wire.leaders`). `RoundExchange.start` runs that
on a daemon thread (`Background`) so that training never waits for it until the next
round's first step needs the schedule. A leader that gets no schedule tells its group why,
so that no rank waits for one that will not come.

While the coordinator is away (killed, restarting), the exchange retries for
``PERSEUS_RECONNECT_S`` (`perseus.client.wire.coordinator`) and every rank waits where it waits
every round: in its next `on_step_begin`, between two steps, its GPU at the clock of its
last instruction. All ranks of a job stop at the same step boundary (the round barrier), so
no rank runs a step its pipeline peers do not run; when the restarted coordinator answers,
training carries on; when the window ends first, `on_step_begin` raises the error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from perseus.client.wire.coordinator import CoordinatorClient
from perseus.client.wire.leaders import JobFanOut
from perseus.protocol import FrequencySchedule, ProfilingResult

__all__ = ["Background", "RoundExchange"]

logger = logging.getLogger(__name__)


class Background:
    """One call run on a daemon thread; `result()` returns its value or re-raises its error.

    A daemon thread (not an executor) so that a rank that exits never waits for a
    schedule long-poll that will not be answered.
    """

    def __init__(self, func: Callable[..., Any], *args: Any, name: str) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(func, *args), name=name, daemon=True).start()

    def _run(self, func: Callable[..., Any], *args: Any) -> None:
        try:
            self._value = func(*args)
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """Wait at most `timeout_s` for the call to end; whether it did."""
        return self._done.wait(timeout_s)

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class RoundExchange:
    """One rank's side of every round's report and schedule (module docstring)."""

    def __init__(
        self,
        coordinator: CoordinatorClient,
        fanout: JobFanOut,
        *,
        job_id: str,
        rank: int,
        round_timeout_s: float,
    ) -> None:
        self._coordinator = coordinator
        self._fanout = fanout
        self._job_id = job_id
        self._rank = rank
        self._round_timeout_s = round_timeout_s
        self.reported = threading.Event()
        """Set once the last round's result was handed on (reported, or failed to be)."""

    def get_schedule(self, round_: int) -> FrequencySchedule:
        """Round `round_`'s schedule: a leader asks the coordinator and hands it out to its
        group; the others take their leader's. Either way the leader's (group's) schedule."""
        fanout = self._fanout
        if not fanout.is_leader:
            return fanout.receive(round_)
        try:
            schedule = self._coordinator.get_schedule(
                self._job_id, self._rank, timeout_s=self._round_timeout_s
            )
        except BaseException as exc:
            self._hand_out_error(round_, exc)
            raise
        fanout.hand_out(round_, schedule)
        return schedule

    def _hand_out_error(self, round_: int, exc: BaseException) -> None:
        """A leader that got no schedule tells its group why (never masking `exc`)."""
        with contextlib.suppress(Exception):
            self._fanout.hand_out(round_, None, f"{type(exc).__name__}: {exc}")

    def _report_and_get(self, result: ProfilingResult, round_: int) -> FrequencySchedule:
        fanout = self._fanout
        try:
            try:
                folded = fanout.gather(result)
                if folded is not None:
                    self._coordinator.report_result(self._job_id, folded)
            finally:
                self.reported.set()
        except BaseException as exc:
            if fanout.is_leader:
                self._hand_out_error(round_, exc)
            raise
        return self.get_schedule(round_)

    def start(self, result: ProfilingResult, round_: int) -> Background:
        """Report `result` and ask for round `round_`'s schedule, on a daemon thread."""
        self.reported.clear()
        return Background(
            self._report_and_get, result, round_, name=f"perseus-round-rank{self._rank}"
        )

    def wait_reported(self, pending: Background | None, timeout_s: float) -> None:
        """At close: give the last round's report `timeout_s` to reach the coordinator."""
        if pending is not None and not self.reported.wait(timeout_s):
            logger.warning(
                "Rank %d: the last round's report did not reach the coordinator", self._rank
            )

    def wait_ended(self, pending: Background | None, timeout_s: float) -> None:
        """After the job's finish: the next round's exchange is still running; a leader's
        long-poll ends now that the job has finished, and it tells its group, whose ranks
        wait for it in a collective that must end before their process group goes."""
        if pending is not None and not pending.wait(timeout_s):
            logger.warning(
                "Rank %d: the next round's exchange did not end after the job's finish",
                self._rank,
            )

    def collect(
        self, pending: Background | None, round_: int, *, dp_rank: int
    ) -> tuple[FrequencySchedule, FrequencySchedule]:
        """Round `round_`'s schedule as handed out to the group (from the exchange thread
        `pending`, else fetched now) and this rank's part of it (its replica's list; the
        job's status, whose notes are logged here, on leaders only)."""
        handed: FrequencySchedule = (
            pending.result() if pending is not None else self.get_schedule(round_)
        )
        leader = self._fanout.is_leader
        mine = FrequencySchedule(
            rank=self._rank,
            frequencies=handed.frequencies_for(dp_rank),
            steps=handed.steps,
            status=handed.status if leader else None,
        )
        if mine.status is not None:
            for note in mine.status.notes:
                level = logging.WARNING if note.level == "warning" else logging.INFO
                logger.log(level, "Perseus: %s", note.text)
        return handed, mine
