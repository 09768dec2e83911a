"""`JobDump`: what a restarted coordinator needs of one job, on disk as soon as it is known.

Each rank's registration before it is answered (``ranks.partial.jsonl``), all ranks
(``ranks.json``) when the last one registers, a round's results when its last result
arrives, the schedules and the deployed plan (with its all-max baseline, written first:
the report reads both as a pair) when a round completes, older rounds pruned to
`dump_keep_rounds` except those the energy report is made from, and a ``failed`` or
``finished`` marker when the job ends (neither is ever restored). File names are
`perseus.io.jobdir.JobDir`'s. With `dump_data` off every method does nothing.

A write that fails is logged and the job goes on: the dump serves a restart, never the
running job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

from perseus.domain.plan import Plan
from perseus.io.atomic import atomic_write_text
from perseus.io.jobdir import JobDir
from perseus.io.model_files import dump_models
from perseus.protocol import FrequencySchedule, ProfilingResult, RankInfo

__all__ = ["JobDump"]

logger = logging.getLogger(__name__)


class JobDump:
    """The dumped state of one job under `dir` (a no-op unless `enabled`)."""

    def __init__(self, job_id: str, dir: JobDir, *, enabled: bool, keep_rounds: int) -> None:
        self.job_id = job_id
        self.dir = dir
        self.enabled = enabled
        self.keep_rounds = keep_rounds
        self.persisted_plan: str | None = None
        """The deployed plan last written (JSON text): an unchanged plan is not rewritten."""
        self._written: deque[int] = deque()
        """Rounds whose schedules this dump wrote and has not pruned, oldest first."""
        self._spared: set[int] = set()
        """Older rounds a prune kept because a report is made from them."""
        self._swept = False
        """The directory was pruned by listing it once (rounds written before a restart)."""

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """`fn(*args)` in a worker thread; an `OSError` is logged, not raised."""
        if not self.enabled:
            return
        try:
            await asyncio.to_thread(fn, *args, **kwargs)
        except OSError as exc:
            logger.error("Job %s: could not write the dump: %s", self.job_id, exc)

    async def text(self, path: Any, text: str) -> None:
        """Write one of the job's files (its record, its scheduler) atomically."""
        await self._run(atomic_write_text, path, text)

    async def registration(self, info: RankInfo) -> None:
        """One rank's registration, before the rank hears back: a restart keeps it."""
        await self._run(self.dir.append_registration, info.model_dump_json())

    async def all_ranks(self, ranks: list[RankInfo]) -> None:
        """Every talking rank has registered: ``ranks.json`` replaces the partial list."""
        await self._run(dump_models, self.dir.ranks, ranks)
        await self._run(self.dir.registering.unlink, missing_ok=True)

    async def results(self, round_number: int, results: list[ProfilingResult]) -> None:
        await self._run(dump_models, self.dir.results(round_number), results)

    async def schedules(self, round_number: int, schedules: list[FrequencySchedule]) -> None:
        await self._run(dump_models, self.dir.schedules(round_number), schedules)
        if self.enabled:
            self._written.append(round_number)

    async def prune(self, protect: Collection[int]) -> None:
        """Keep the last `keep_rounds` rounds and the `protect`ed ones (0: keep all).

        The first prune lists the directory (rounds dumped before a restart); later ones
        delete the rounds this dump wrote by name, so that a round's cost does not grow
        with the directory or the job's age."""
        if not self.keep_rounds or not self.enabled:
            return
        if not self._swept:
            self._swept = True
            await self._run(self._sweep, protect)
            return
        kept = set(protect)
        victims = [n for n in self._spared if n not in kept]
        self._spared.difference_update(victims)
        while len(self._written) > self.keep_rounds:
            n = self._written.popleft()
            if n in kept:
                self._spared.add(n)
            else:
                victims.append(n)
        if victims:
            await self._run(self._delete_rounds, victims)

    def _sweep(self, protect: Collection[int]) -> None:
        """The first prune: by listing the directory, then taking what is left as this
        dump's own (the newest `keep_rounds`; the older ones kept for a report are spared
        until it no longer needs them)."""
        self.dir.prune_rounds(self.keep_rounds, protect)
        left = self.dir.rounds()
        self._written = deque(left[-self.keep_rounds :])
        self._spared = set(left[: -self.keep_rounds])

    def _delete_rounds(self, rounds: list[int]) -> None:
        for n in rounds:
            for path in (self.dir.schedules(n), self.dir.results(n)):
                path.unlink(missing_ok=True)

    async def plans(self, plan: Plan, baseline: Plan | None) -> None:
        """The deployed plan (and its all-max baseline, first), when it changed."""
        text = plan.model_dump_json() + "\n"
        if text == self.persisted_plan or not self.enabled:
            return
        if baseline is not None:
            await self._run(
                atomic_write_text, self.dir.baseline_plan, baseline.model_dump_json() + "\n"
            )
        await self._run(atomic_write_text, self.dir.deployed_plan, text)
        self.persisted_plan = text

    def mark(self, marker: str, text: str) -> None:
        """Write the ``failed``, ``finished`` or ``evicted`` marker at once (small, rare: a
        restart must never revive the job), if the job's directory exists."""
        if self.enabled and self.dir.path.is_dir():
            with contextlib.suppress(OSError):
                atomic_write_text(getattr(self.dir, marker), text)
