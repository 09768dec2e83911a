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
a job nobody asks about for weeks holds no more than one asked every round.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from pathlib import Path
from typing import Any

from perseus.protocol import MAX_NOTES, JobNote

__all__ = ["MAX_EVENTS", "JobStory"]

logger = logging.getLogger(__name__)

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

    def note(self, text: str, *, warning: bool = False) -> None:
        """A line for the job's log (the newest `MAX_NOTES` are kept until sent)."""
        (logger.warning if warning else logger.info)("Job %s: %s", self.job_id, text)
        self._notes.append(JobNote(level="warning" if warning else "info", text=text))

    def record(self, entry: dict[str, Any]) -> None:
        """An event on record (``round``, ``event``, ``reason`` and figures)."""
        self._events.append(entry)
        try:
            self.record_path.parent.mkdir(parents=True, exist_ok=True)
            with self.record_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
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
