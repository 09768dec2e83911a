"""Measurements are validated where they arrive (issue #30, "one bad sample decides the job").

Each case of the issue against a real coordinator on loopback running the Perseus scheduler
with dumps on: a bad result is a 422 for that rank naming the field and the job, nothing of
it reaches the dump or the scheduler, and the rank's corrected result carries the job on.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import GroundTruth, SimulatedJob, running_server

from perseus.protocol import FrequencySchedule, ProfilingResult, load_prof
from perseus.schedulers.all_max import AllMaxFrequency
from perseus.server.errors import scheduler_error_status
from perseus.settings import PerseusSettings

M = 4
TRUTH = GroundTruth([0.010, 0.014])

Body = dict[str, Any]


def _set(path: tuple[Any, ...], value: float) -> Callable[[Body], None]:
    def mutate(body: Body) -> None:
        target = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _drop_last_forward(body: Body) -> None:
    body["time_breakdown"]["forward"][0].pop()
    body["energy_breakdown"]["forward"][0].pop()


def _one_energy_too_many(body: Body) -> None:
    body["iter_energy"].append(1.0)


# (case, how the rank's good result is spoiled, what the 422 must name)
CASES: list[tuple[str, Callable[[Body], None], str]] = [
    ("negative energy", _set(("iter_energy", 0), -15950.0), "iter_energy.0"),
    (
        "negative instruction energy",
        _set(("energy_breakdown", "forward", 0, 1), -1.0),
        "energy_breakdown.forward.0.1",
    ),
    ("NaN time", _set(("time_breakdown", "forward", 0, 0), math.nan), "time_breakdown.forward.0.0"),
    ("NaN energy", _set(("iter_energy", 0), math.nan), "iter_energy.0"),
    ("inf time", _set(("iter_time", 0), math.inf), "iter_time.0"),
    (
        "inf energy",
        _set(("energy_breakdown", "backward", 0, 0), math.inf),
        "energy_breakdown.backward.0.0",
    ),
    ("1e308 energy", _set(("iter_energy", 0), 1e308), "iter_energy.0"),
    (
        "1e308 time",
        _set(("time_breakdown", "backward", 0, 2), 1e308),
        "time_breakdown.backward.0.2",
    ),
    ("zero time", _set(("time_breakdown", "forward", 0, 0), 0.0), "time_breakdown.forward.0.0"),
    ("one forward short", _drop_last_forward, "3 'forward' duration(s)"),
    ("more energies than times", _one_energy_too_many, "iter_energy has 2 entries"),
]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[str, SimulatedJob, list[ProfilingResult], Path]]:
    """A Perseus job of 2 pipeline ranks that ran round 0; its ranks' good results."""
    settings = PerseusSettings(
        scheduler="Perseus",
        scheduler_args={"num_microbatches": M, "freq_step": 4, "warmup_rounds": 1},
        dump_dir=str(tmp_path),
        dump_data=True,
    )
    with running_server(settings, round_timeout_s=30.0) as url:
        job = SimulatedJob(url, TRUTH, pp=2, num_microbatches=M)

        async def round0() -> dict[int, FrequencySchedule]:
            async with httpx.AsyncClient(timeout=30.0) as client:
                await job.register(client)
                return await job.ask_all(client)

        schedules = asyncio.run(round0())
        yield url, job, job.results_for(schedules), tmp_path / str(job.job_id)


def _post(url: str, job_id: str, body: Body) -> httpx.Response:
    # json.dumps writes NaN/Infinity literals, as a careless client would.
    return httpx.post(
        f"{url}/result/{job_id}",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
        timeout=30.0,
    )


@pytest.mark.parametrize(("case", "spoil", "names"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_result_is_a_422_naming_field_and_job_and_the_rank_may_correct_it(
    started: tuple[str, SimulatedJob, list[ProfilingResult], Path],
    case: str,
    spoil: Callable[[Body], None],
    names: str,
) -> None:
    url, job, good, job_dir = started
    assert job.job_id is not None
    bad = copy.deepcopy(good[0].model_dump())
    spoil(bad)
    r = _post(url, job.job_id, bad)
    assert r.status_code == 422, (case, r.text)
    detail = r.json()["detail"]
    assert names in detail and job.job_id in detail, detail
    assert not list(job_dir.glob("*.prof.json")), "a refused result reached the dump"

    # The job is untouched: the rank sends its corrected result, the round goes on.
    for res in good:
        r = _post(url, job.job_id, res.model_dump())
        assert r.status_code == 200, r.text

    async def next_round() -> dict[int, FrequencySchedule]:
        async with httpx.AsyncClient(timeout=30.0) as client:
            return await job.ask_all(client)

    schedules = asyncio.run(next_round())
    assert sorted(schedules) == [0, 1]
    assert load_prof(job_dir, 0) == good  # what the scheduler saw: the good results only


def test_a_result_of_the_wrong_schedule_shape_names_the_rank_and_kind(
    started: tuple[str, SimulatedJob, list[ProfilingResult], Path],
) -> None:
    url, job, good, _ = started
    assert job.job_id is not None
    body = good[1].model_dump()
    body["time_breakdown"]["backward_input"] = [[0.01]]
    body["energy_breakdown"]["backward_input"] = [[1.0]]
    r = _post(url, job.job_id, body)
    assert r.status_code == 422
    assert "Rank 1 reported 1 'backward_input' duration(s)" in r.json()["detail"]
    assert "runs no backward_input" in r.json()["detail"]
    assert _post(url, job.job_id, good[1].model_dump()).status_code == 200


class Exponentiating(AllMaxFrequency):
    """A scheduler whose arithmetic overflows on valid measurements (OverflowError)."""

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        super().observe(profiling_results)
        self.score = math.fsum(math.exp(1e3 * r.iter_energy[0]) for r in profiling_results)


def test_a_scheduler_that_overflows_on_the_numbers_fails_the_job_with_a_422(
    tmp_path: Path,
) -> None:
    settings = PerseusSettings(
        scheduler=f"{Exponentiating.__module__}:{Exponentiating.__qualname__}",
        scheduler_args={"num_microbatches": M},
    )
    with running_server(settings, round_timeout_s=30.0) as url:
        job = SimulatedJob(url, TRUTH, pp=2, num_microbatches=M)

        async def two_rounds() -> list[int]:
            async with httpx.AsyncClient(timeout=30.0) as client:
                await job.register(client)
                await job.report(client, await job.ask_all(client))  # valid energies
                answers = await asyncio.gather(
                    *(
                        client.get(f"{url}/schedule/{job.job_id}", params={"rank": r})
                        for r in (0, 1)
                    )
                )
                later = await client.get(f"{url}/schedule/{job.job_id}", params={"rank": 0})
                return [a.status_code for a in answers] + [later.status_code]

        assert asyncio.run(two_rounds()) == [422, 422, 422]


def test_numbers_a_scheduler_cannot_compute_with_are_4xx_not_5xx() -> None:
    assert scheduler_error_status(OverflowError("math range error")) == 422
    assert scheduler_error_status(ZeroDivisionError("float division by zero")) == 422
    assert scheduler_error_status(ValueError("bad")) == 400
    assert scheduler_error_status(RuntimeError("a bug")) == 500
