"""A job that describes its pipeline: the coordinator (real server on loopback) refuses an
order that misses, repeats or deadlocks on an instruction at registration (422), naming the
instruction, and accepts a good one."""

from __future__ import annotations

import httpx
import pytest
from server_fixtures import running_server

from perseus.settings import PerseusSettings

F, B = "forward", "backward"
GOOD = [[[0, F, 0], [0, F, 1], [0, B, 0], [0, B, 1]], [[1, F, 0], [1, B, 0], [1, F, 1], [1, B, 1]]]


def job(orders: list[list[list[object]]]) -> dict[str, object]:
    pipeline = {
        "schedule": "Schedule1F1B",
        "num_stages": 2,
        "num_microbatches": 2,
        "num_chunks": 1,
        "orders": orders,
    }
    return {"pp_degree": 2, "dp_degree": 1, "tp_degree": 1, "world_size": 2, "pipeline": pipeline}


@pytest.fixture(scope="module")
def client():
    # No default pipeline on the server: every job must describe its own.
    settings = PerseusSettings(scheduler="AllMaxFrequency", scheduler_args={})
    with running_server(settings) as url, httpx.Client(base_url=url, timeout=20) as c:
        yield c


def test_a_good_order_is_accepted(client):
    r = client.post("/register_job", json=job(GOOD))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("orders", "message"),
    [
        # Rank 1 never runs the backward of microbatch 1.
        ([GOOD[0], GOOD[1][:3]], "B1@s1 (backward of microbatch 1 on stage 1) is missing"),
        # Rank 0 runs the forward of microbatch 0 twice.
        (
            [[[0, F, 0], *GOOD[0]], GOOD[1]],
            "F0@s0 (forward of microbatch 0 on stage 0) is repeated",
        ),
        # Rank 0 waits for its backward of microbatch 0 before its first forward: a cycle.
        (
            [[[0, B, 0], [0, F, 0], [0, F, 1], [0, B, 1]], GOOD[1]],
            "deadlocks: B0@s0 can never run",
        ),
    ],
    ids=["missing", "repeated", "cyclic"],
)
def test_a_bad_order_is_refused_at_registration_naming_the_instruction(client, orders, message):
    r = client.post("/register_job", json=job(orders))
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"], r.text
