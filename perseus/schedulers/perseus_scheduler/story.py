"""What a job is told, and what stays on record: the `Perseus` scheduler's notes and events.

- **Notes** are lines for the job's own log: rank 0 logs them (`perseus.protocol.RoundStatus`
  rides on its next schedule), so the user sees profiling progress, the deployed plan's
  prediction and every move of the guard without configuring anything. Each is also logged
  by the coordinator.
- **Events** are the record: every deployment, check and move, with its reason and figures,
  one JSON object a line in the job's ``promise.jsonl`` (written whether or not the
  coordinator dumps its state: it is a product, like the profile), and handed to the
  coordinator for ``GET /jobs/{job_id}`` and the metrics (`promise_events`).

Both wait in bounded queues until taken (`MAX_NOTES` notes, `MAX_EVENTS` events, the newest):
a job nobody asks about for weeks holds no more than one asked every round. The record on
disk is bounded too: past `MAX_RECORD_BYTES` ``promise.jsonl`` becomes ``promise.1.jsonl``
(replacing the one before) and a new one starts, so a job that runs for months keeps its
newest events in at most twice that (a guard check every few rounds is ~80 MB a million
rounds unbounded).
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from pathlib import Path
from typing import Any

from perseus.io.jobdir import JobDir
from perseus.protocol import MAX_NOTES, JobNote

__all__ = ["MAX_EVENTS", "MAX_RECORD_BYTES", "JobStory"]

logger = logging.getLogger(__name__)

MAX_RECORD_BYTES = 8 * 1024 * 1024
"""``promise.jsonl`` is rotated to ``promise.1.jsonl`` past this size (see the module docstring)."""

MAX_EVENTS = 1000
"""Events kept until taken (the newest): the coordinator takes them every round and keeps
its own 100; ``promise.jsonl`` has them all."""


class JobStory:
    """Notes for the job's log and events on record, for one job (see the module docstring)."""

    def __init__(self, job_id: str, record_path: Path) -> None:
        self.job_id = job_id
        self.record_path = record_path
        self._notes: deque[JobNote] = deque(maxlen=MAX_NOTES)
        self._events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._record_bytes: int | None = None
        """The size of ``promise.jsonl`` (None: not looked at yet)."""

    def note(self, text: str, *, warning: bool = False) -> None:
        """A line for the job's log (the newest `MAX_NOTES` are kept until sent)."""
        (logger.warning if warning else logger.info)("Job %s: %s", self.job_id, text)
        self._notes.append(JobNote(level="warning" if warning else "info", text=text))

    def record(self, entry: dict[str, Any]) -> None:
        """An event on record (``round``, ``event``, ``reason`` and figures)."""
        self._events.append(entry)
        line = (json.dumps(entry) + "\n").encode("utf-8")
        try:
            self.record_path.parent.mkdir(parents=True, exist_ok=True)
            if self._record_bytes is None:  # a restarted coordinator appends to its file
                exists = self.record_path.is_file()
                self._record_bytes = self.record_path.stat().st_size if exists else 0
            if self._record_bytes and self._record_bytes + len(line) > MAX_RECORD_BYTES:
                before = self.record_path.with_name(JobDir.PROMISE_BEFORE)
                os.replace(self.record_path, before)
                self._record_bytes = 0
            with self.record_path.open("ab") as f:
                f.write(line)
            self._record_bytes += len(line)
        except OSError as exc:
            logger.warning("Job %s: could not write %s: %s", self.job_id, self.record_path, exc)

    def take_notes(self) -> list[JobNote]:
        """The notes since the last call."""
        notes = list(self._notes)
        self._notes.clear()
        return notes

    def take_events(self) -> list[dict[str, Any]]:
        """The events since the last call."""
        events = list(self._events)
        self._events.clear()
        return events
