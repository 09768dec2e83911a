"""The job's record on disk stays bounded however long the job runs: ``promise.jsonl`` is
rotated to ``promise.1.jsonl`` past `MAX_RECORD_BYTES`, and the dump's reader takes both,
oldest first."""

from __future__ import annotations

import json

from perseus.planning.dump import _promise
from perseus.schedulers.perseus_scheduler import story
from perseus.schedulers.perseus_scheduler.story import JobStory


def _entry(n: int) -> dict:
    return {"round": n, "event": "check", "reason": "still keeps the plan", "rounds": [n] * 8}


def test_the_record_is_rotated_and_stays_under_twice_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(story, "MAX_RECORD_BYTES", 2_000)
    path = tmp_path / "promise.jsonl"
    log = JobStory("job", path)
    for n in range(500):
        log.record(_entry(n))
    before = tmp_path / "promise.1.jsonl"
    assert path.stat().st_size <= 2_000 and before.stat().st_size <= 2_000
    newest = [json.loads(line)["round"] for line in path.read_text().splitlines()]
    older = [json.loads(line)["round"] for line in before.read_text().splitlines()]
    assert newest[-1] == 499 and older[-1] + 1 == newest[0]  # nothing lost at the seam
    assert [e["round"] for e in _promise(before, path)] == older + newest


def test_a_restarted_coordinator_counts_the_record_it_appends_to(tmp_path, monkeypatch):
    monkeypatch.setattr(story, "MAX_RECORD_BYTES", 2_000)
    path = tmp_path / "promise.jsonl"
    first = JobStory("job", path)
    for n in range(10):
        first.record(_entry(n))
    size = path.stat().st_size
    again = JobStory("job", path)  # after a restart: the file is already part full
    n = 10
    while path.stat().st_size >= size and not (tmp_path / "promise.1.jsonl").exists():
        again.record(_entry(n))
        n += 1
    assert path.stat().st_size <= 2_000
    assert (tmp_path / "promise.1.jsonl").stat().st_size <= 2_000
