"""The coordinator over real HTTP (uvicorn on loopback): statuses, the round barrier, observe
ordering, errors reaching every rank, round timeout, eviction, dumps."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from server_fixtures import job_info, rank_infos, running_server

from perseus.errors import PerseusError
from perseus.memory import available_memory_bytes
from perseus.protocol import FrequencySchedule, ProfilingResult, load_prof, load_ranks, load_sched
from perseus.schedulers.args import SchedulerArgs
from perseus.schedulers.base import FrequencyScheduler
from perseus.settings import PerseusSettings


class Recorder(FrequencyScheduler):
    """A plugin scheduler that logs every call (by job id) and can be told to fail."""

    class Args(SchedulerArgs):
        fail_in_round: int = -1
        fail_with: str = "value"
        sleep_s: float = 0.0

    log: ClassVar[dict[str, list[tuple]]] = {}

    def __init__(self, job_info, rank_infos, perseus_settings, args: Args):  # type: ignore[no-untyped-def]
        super().__init__(job_info, rank_infos, perseus_settings, args)
        self.round = 0
        self.fail_in_round = args.fail_in_round
        self.fail_with = args.fail_with
        self.sleep_s = args.sleep_s
        self.log.setdefault(job_info.job_id, []).append(("init", [r.rank for r in self.rank_infos]))

    def next_schedule(self) -> list[FrequencySchedule]:
        self.log[self.job_info.job_id].append(("next", self.round))
        if self.round == self.fail_in_round:
            if self.fail_with == "value":
                raise PerseusError(f"bad input in round {self.round}")
            raise RuntimeError(f"crash in round {self.round}")
        time.sleep(self.sleep_s)
        out = [
            FrequencySchedule(rank=r.rank, frequencies=[("forward", 1000 + self.round)])
            for r in self.rank_infos
        ]
        self.round += 1
        return out

    def observe(self, profiling_results: list[ProfilingResult]) -> None:
        self.log[self.job_info.job_id].append(
            ("observe", [(r.rank, r.iter_time[0]) for r in profiling_results])
        )


def settings_for(scheduler: type = Recorder, tmp_path: Path | None = None, **kw) -> PerseusSettings:
    args = kw.pop("scheduler_args", {})
    extra = {"dump_dir": str(tmp_path / "dump"), "dump_data": True} if tmp_path else {}
    # Settings keep a name; a test's scheduler is a plugin, "module:Class".
    name = f"{scheduler.__module__}:{scheduler.__qualname__}"
    return PerseusSettings(scheduler=name, scheduler_args=args, **extra, **kw)


def register(client: httpx.Client, pp: int, dp: int = 1, tp: int = 1) -> str:
    r = client.post("/register_job", json=job_info(pp, dp, tp).model_dump())
    assert r.status_code == 200, r.text
    job_id = r.json()
    assert isinstance(job_id, str) and job_id
    for info in rank_infos(pp, dp, tp):
        r = client.post(f"/register_rank/{job_id}", json=info.model_dump())
        assert r.status_code == 200, r.text
        assert r.json() is None
    return job_id


def result(rank: int, t: float = 1.0) -> dict:
    return ProfilingResult(rank=rank, iter_time=[t], iter_energy=[100.0]).model_dump()


@pytest.fixture
def server():
    with running_server(settings_for(), round_timeout_s=5.0) as url:
        yield url


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server, timeout=20.0) as c:
        yield c


def ask_all(base_url: str, job_id: str, ranks: list[int]) -> list[httpx.Response]:
    async def main():
        async with httpx.AsyncClient(base_url=base_url, timeout=20.0) as c:
            return await asyncio.gather(
                *(c.get(f"/schedule/{job_id}", params={"rank": r}) for r in ranks)
            )

    return asyncio.run(main())


# ------------------------------------------------------------------------- info & statuses
def test_info_names_the_scheduler_and_its_args(tmp_path):
    settings = PerseusSettings(scheduler="AllMaxFrequency", scheduler_args={"num_microbatches": 3})
    with running_server(settings) as url:
        body = httpx.get(f"{url}/info").json()
    assert body["scheduler"] == "AllMaxFrequency"
    assert body["scheduler_args"] == {"num_microbatches": 3}
    assert body["version"]


def test_register_job_validation_is_422_with_a_string_detail(client):
    bad = {"pp_degree": 2, "dp_degree": 1, "tp_degree": 1, "world_size": 3}
    r = client.post("/register_job", json=bad)
    assert r.status_code == 422
    assert "world_size" in r.json()["detail"]
    r = client.post("/register_job", json={**job_info(2).model_dump(), "job_id": "mine"})
    assert r.status_code == 422
    assert "job_id" in r.json()["detail"]


@pytest.mark.parametrize("metadata", ["../../etc", "a/b", "x" * 65, "two words"])
def test_job_metadata_that_cannot_be_part_of_a_job_id_is_422(client, metadata):
    r = client.post("/register_job", json={**job_info(1).model_dump(), "job_metadata": metadata})
    assert r.status_code == 422 and "job_metadata" in r.json()["detail"]


def test_job_metadata_ends_the_job_id(client):
    r = client.post(
        "/register_job", json={**job_info(1).model_dump(), "job_metadata": "gpt3-run.7"}
    )
    assert r.status_code == 200 and r.json().endswith("+gpt3-run.7")


def test_every_registration_status(client):
    r = client.post("/register_rank/nope", json=rank_infos(1)[0].model_dump())
    assert r.status_code == 404
    assert "nope" in r.json()["detail"]
    job_id = client.post("/register_job", json=job_info(2, 2).model_dump()).json()
    infos = rank_infos(2, 2)
    out_of_range = infos[0].model_copy(update={"rank": 4})
    r = client.post(f"/register_rank/{job_id}", json=out_of_range.model_dump())
    assert r.status_code == 422 and "world_size is 4" in r.json()["detail"]
    bad_pp = infos[0].model_copy(update={"pp_rank": 2})
    r = client.post(f"/register_rank/{job_id}", json=bad_pp.model_dump())
    assert r.status_code == 422 and "pp_rank 2" in r.json()["detail"]
    no_freqs = infos[0].model_copy(update={"available_frequencies": []})
    r = client.post(f"/register_rank/{job_id}", json=no_freqs.model_dump())
    assert r.status_code == 422
    # A GPU's power outside what a GPU could draw (or idle above its limit) is refused.
    for powers, name in (
        ({"power_limit_w": 4e5}, "power_limit_w"),  # mW sent as W
        ({"idle_power_w": -1.0}, "idle_power_w"),
        ({"idle_power_w": 450.0, "power_limit_w": 400.0}, "above power_limit_w"),
    ):
        r = client.post(f"/register_rank/{job_id}", json={**infos[0].model_dump(), **powers})
        assert r.status_code == 422 and name in r.text, r.text
    assert client.post(f"/register_rank/{job_id}", json=infos[0].model_dump()).status_code == 200
    # The same registration again is a client's retry after a lost answer: accepted as is.
    assert client.post(f"/register_rank/{job_id}", json=infos[0].model_dump()).status_code == 200
    other = infos[0].model_copy(update={"available_frequencies": [1000]})
    r = client.post(f"/register_rank/{job_id}", json=other.model_dump())
    assert r.status_code == 409 and "already registered" in r.json()["detail"]
    same_coords = infos[0].model_copy(update={"rank": 1})
    r = client.post(f"/register_rank/{job_id}", json=same_coords.model_dump())
    assert r.status_code == 422 and "already taken by rank 0" in r.json()["detail"]


def test_schedule_and_result_statuses(client):
    assert client.get("/schedule/nope", params={"rank": 0}).status_code == 404
    job_id = register(client, 2)
    assert client.get(f"/schedule/{job_id}", params={"rank": 2}).status_code == 422
    r = client.get(f"/schedule/{job_id}")
    assert r.status_code == 422 and "rank" in r.json()["detail"]
    assert client.post("/result/nope", json=result(0)).status_code == 404
    assert client.post(f"/result/{job_id}", json=result(5)).status_code == 422
    r = client.post(f"/result/{job_id}", json=result(0))
    assert r.status_code == 409 and "before any schedule" in r.json()["detail"]
    assert all(r.status_code == 200 for r in ask_all(str(client.base_url), job_id, [0, 1]))
    assert client.post(f"/result/{job_id}", json=result(0)).status_code == 200
    # The same result again is a client's retry; a different one is a conflict.
    assert client.post(f"/result/{job_id}", json=result(0)).status_code == 200
    r = client.post(f"/result/{job_id}", json=result(0, t=2.0))
    assert r.status_code == 409 and "once per round" in r.json()["detail"]


def test_straggler_statuses(client):
    assert client.post("/straggler/nope", json={"dp_rank": 0, "slowdown": 1.2}).status_code == 404
    job_id = register(client, 1, 2)
    r = client.post(f"/straggler/{job_id}", json={"dp_rank": 0, "slowdown": 0.5})
    assert r.status_code == 422
    r = client.post(f"/straggler/{job_id}", json={"dp_rank": 0, "slowdown": 1e300})
    assert r.status_code == 422 and "less than or equal to 100" in r.text, r.text
    r = client.post(f"/straggler/{job_id}", json={"dp_rank": 0, "slowdown": 1.2})
    assert r.status_code == 400 and "does not handle straggler" in r.json()["detail"]


# ------------------------------------------------------------------------- the barrier
def test_a_round_is_a_barrier(server):
    """N ranks in threads: nobody gets a schedule until the last rank asks."""
    with httpx.Client(base_url=server, timeout=20.0) as c:
        job_id = register(c, 4)
    got: dict[int, tuple[float, dict]] = {}

    def ask(rank: int) -> None:
        with httpx.Client(base_url=server, timeout=20.0) as c:
            r = c.get(f"/schedule/{job_id}", params={"rank": rank})
            got[rank] = (time.monotonic(), r.json())

    threads = [threading.Thread(target=ask, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    assert got == {}, "a rank got its schedule before every rank asked"
    released_at = time.monotonic()
    ask(3)
    for t in threads:
        t.join(timeout=10)
    assert sorted(got) == [0, 1, 2, 3]
    assert all(ts >= released_at for ts, _ in got.values())
    assert all(
        body["rank"] == r and body["frequencies"] == [["forward", 1000]]
        for r, (_, body) in got.items()
    )


def test_ranks_may_ask_before_everyone_registered(server):
    with httpx.Client(base_url=server, timeout=20.0) as c:
        job_id = c.post("/register_job", json=job_info(2).model_dump()).json()
        infos = rank_infos(2)
        c.post(f"/register_rank/{job_id}", json=infos[0].model_dump())
        box: list[httpx.Response] = []
        t = threading.Thread(
            target=lambda: box.append(
                httpx.get(f"{server}/schedule/{job_id}", params={"rank": 0}, timeout=20)
            )
        )
        t.start()
        time.sleep(0.2)
        t2 = threading.Thread(
            target=lambda: box.append(
                httpx.get(f"{server}/schedule/{job_id}", params={"rank": 1}, timeout=20)
            )
        )
        t2.start()
        time.sleep(0.3)
        assert box == []
        assert c.post(f"/register_rank/{job_id}", json=infos[1].model_dump()).status_code == 200
        t.join(10)
        t2.join(10)
    assert sorted(r.json()["rank"] for r in box) == [0, 1]


def test_observe_gets_the_previous_rounds_results_sorted_by_rank(client):
    job_id = register(client, 3)
    base = str(client.base_url)
    ask_all(base, job_id, [2, 0, 1])
    for rank in (2, 0, 1):  # report out of order
        assert client.post(f"/result/{job_id}", json=result(rank, t=10.0 + rank)).status_code == 200
    second = ask_all(base, job_id, [1, 2, 0])
    assert [r.json()["frequencies"] for r in second] == [[["forward", 1001]]] * 3
    ask_all(base, job_id, [0, 1, 2])  # no results reported: observe is not called
    assert Recorder.log[job_id] == [
        ("init", [0, 1, 2]),
        ("next", 0),
        ("observe", [(0, 10.0), (1, 11.0), (2, 12.0)]),
        ("next", 1),
        ("next", 2),
    ]


def test_result_after_asking_for_the_next_round_is_rejected(server):
    with httpx.Client(base_url=server, timeout=20.0) as c:
        job_id = register(c, 2)
        ask_all(server, job_id, [0, 1])
        t = threading.Thread(
            target=lambda: httpx.get(f"{server}/schedule/{job_id}", params={"rank": 0}, timeout=20)
        )
        t.start()
        time.sleep(0.3)
        r = c.post(f"/result/{job_id}", json=result(0))
        assert r.status_code == 409 and "before asking" in r.json()["detail"]
        ask_all(server, job_id, [1])
        t.join(10)


@pytest.mark.parametrize(("fail_with", "status"), [("value", 400), ("crash", 500)])
def test_a_scheduler_error_reaches_every_rank(fail_with, status):
    settings = settings_for(scheduler_args={"fail_in_round": 1, "fail_with": fail_with})
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=20) as c:
        job_id = register(c, 3)
        assert all(r.status_code == 200 for r in ask_all(url, job_id, [0, 1, 2]))
        responses = ask_all(url, job_id, [0, 1, 2])
        assert [r.status_code for r in responses] == [status] * 3
        for r in responses:
            detail = r.json()["detail"]
            assert "round 1" in detail and "Recorder" in detail
            assert "Traceback" not in r.text
        later = c.get(f"/schedule/{job_id}", params={"rank": 0})
        assert (
            later.status_code == status and later.json()["detail"] == responses[0].json()["detail"]
        )


def _too_big_to_solve(stages: int) -> int:
    """Microbatches whose 1F1B schedule fits in memory but whose frontier (~100 KB per
    instruction) does not; 0 where the platform does not tell the available memory."""
    room = available_memory_bytes()
    return 0 if room is None else int(1.5 * room / (100 * 1024 * 2 * stages)) + 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # A default pipeline too big to build is refused before its schedule is built.
        ({"num_microbatches": 10**10}, "40,000,000,000 instructions; at most 1,048,576"),
        # No pipeline from the job and none by default: the job must describe it.
        ({}, "did not describe its pipeline"),
    ],
)
def test_a_job_whose_pipeline_cannot_be_built_is_refused_at_registration(args, message):
    settings = PerseusSettings(scheduler="AllMaxFrequency", scheduler_args=args)
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=20) as c:
        r = c.post("/register_job", json=job_info(2).model_dump())
        assert r.status_code == 422 and message in r.text, r.text


@pytest.mark.parametrize(
    ("scheduler", "args", "message"),
    [
        ("PointSolution", {"solution_path": "/nonexistent/plan.json"}, "/nonexistent/plan.json"),
    ],
)
def test_a_scheduler_that_cannot_start_fails_every_rank_with_400(scheduler, args, message):
    settings = PerseusSettings(scheduler=scheduler, scheduler_args=args)
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=20) as c:
        job_id = c.post("/register_job", json=job_info(2).model_dump()).json()
        infos = rank_infos(2)
        assert c.post(f"/register_rank/{job_id}", json=infos[0].model_dump()).status_code == 200
        last = c.post(f"/register_rank/{job_id}", json=infos[1].model_dump())
        assert last.status_code == 400 and message in last.json()["detail"], last.text
        other = c.get(f"/schedule/{job_id}", params={"rank": 0})
        assert other.status_code == 400 and other.json()["detail"] == last.json()["detail"]


@pytest.mark.skipif(available_memory_bytes() is None, reason="the available memory is unknown")
def test_a_frontier_too_big_to_solve_is_refused_at_job_registration():
    """Counted from the schedule's shape, before any schedule is built or any rank swept."""
    settings = PerseusSettings(
        scheduler="Perseus", scheduler_args={"num_microbatches": _too_big_to_solve(2)}
    )
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=20) as c:
        r = c.post("/register_job", json=job_info(2).model_dump())
        assert r.status_code == 422 and "GiB of memory, but only" in r.text, r.text
        assert c.get("/info").status_code == 200  # the coordinator goes on


def test_round_timeout_is_504_naming_the_missing_ranks_then_409():
    with running_server(settings_for(), round_timeout_s=0.5) as url:
        with httpx.Client(base_url=url, timeout=20) as c:
            job_id = register(c, 3)
        t0 = time.monotonic()
        responses = ask_all(url, job_id, [0, 2])
        assert time.monotonic() - t0 < 5
        assert [r.status_code for r in responses] == [504, 504]
        assert "rank(s) [1] never asked" in responses[0].json()["detail"]
        later = httpx.get(f"{url}/schedule/{job_id}", params={"rank": 1})
        assert later.status_code == 409 and "never asked" in later.json()["detail"]
        assert httpx.post(f"{url}/result/{job_id}", json=result(1)).status_code == 409


def test_a_slow_scheduler_blocks_neither_the_loop_nor_other_jobs():
    with (
        running_server(settings_for(scheduler_args={"sleep_s": 3.0})) as url,
        httpx.Client(base_url=url, timeout=20) as c,
    ):
        slow = register(c, 1)
        t = threading.Thread(target=lambda: ask_all(url, slow, [0]))
        t.start()
        time.sleep(0.2)  # `slow`'s scheduler now sleeps 3 s in its worker thread
        t0 = time.monotonic()
        assert c.get("/info").status_code == 200
        other = register(c, 2)  # another job registers and starts its scheduler
        elapsed = time.monotonic() - t0
        t.join(10)
    assert other and elapsed < 1.5


# ------------------------------------------------------------------------- eviction & dumps
def test_idle_jobs_are_evicted():
    with (
        running_server(settings_for(max_job_idle_time=1)) as url,
        httpx.Client(base_url=url, timeout=20) as c,
    ):
        job_id = register(c, 1)
        assert c.get(f"/schedule/{job_id}", params={"rank": 0}).status_code == 200
        busy_id = register(c, 1)
        for _ in range(8):  # keeps touching busy_id: never idle for 1 s
            time.sleep(0.25)
            c.get(f"/schedule/{busy_id}", params={"rank": 0})
        r = c.get(f"/schedule/{job_id}", params={"rank": 0})
        assert r.status_code == 404 and job_id in r.json()["detail"]
        assert c.get(f"/schedule/{busy_id}", params={"rank": 0}).status_code == 200


def test_dumps_are_written_and_readable(tmp_path):
    with (
        running_server(settings_for(tmp_path=tmp_path)) as url,
        httpx.Client(base_url=url, timeout=20) as c,
    ):
        job_id = register(c, 2)
        ask_all(url, job_id, [0, 1])
        for rank in (0, 1):
            c.post(f"/result/{job_id}", json=result(rank, 2.0))
        ask_all(url, job_id, [0, 1])
    job_dir = tmp_path / "dump" / job_id
    assert {p.name for p in job_dir.iterdir()} >= {
        "job.json", "scheduler.json", "ranks.json", "0.sched.json", "1.sched.json", "0.prof.json"
    }  # fmt: skip
    assert [r.rank for r in load_ranks(job_dir)] == [0, 1]
    assert load_sched(job_dir, 1)[1].frequencies == [("forward", 1001)]
    assert [p.iter_time for p in load_prof(job_dir, 0)] == [[2.0], [2.0]]


def test_no_dumps_without_dump_data(tmp_path):
    settings = settings_for(dump_dir=str(tmp_path / "dump"), dump_data=False)
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=20) as c:
        job_id = register(c, 1)
        ask_all(url, job_id, [0])
    assert not (tmp_path / "dump").exists()
