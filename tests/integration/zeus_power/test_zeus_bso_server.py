"""The batch-size optimizer through a real server (uvicorn on loopback) and a real SQLite file."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from zeus_assets.bso_server import running_server

from zeus_power.bso.models import JobState, TrialAssignment, TrialList

# eta_knob=1 makes the cost equal to the reported energy, so tables read as costs.
BASE = {
    "batch_sizes": [8, 16, 32, 64, 128, 256],
    "default_batch_size": 32,
    "eta_knob": 1.0,
    "beta_knob": 2.0,
    "max_power_w": 300.0,
    "mab_seed": 7,
}


def _job(job_id: str, **overrides) -> dict:
    return {"job_id": job_id, **BASE, **overrides}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'bso.db'}"


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    with running_server(db_url) as url:
        yield url


@pytest.fixture
def http(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=30) as client:
        yield client


def _register(http: httpx.Client, job: dict) -> JobState:
    response = http.post("/jobs", json=job)
    assert response.status_code in (200, 201), response.text
    return JobState.model_validate(response.json())


def _trial(http: httpx.Client, job_id: str) -> TrialAssignment:
    response = http.post(f"/jobs/{job_id}/trials")
    assert response.status_code == 201, response.text
    return TrialAssignment.model_validate(response.json())


def _report(http: httpx.Client, job_id: str, number: int, cost: float, converged: bool) -> None:
    response = http.patch(
        f"/jobs/{job_id}/trials/{number}",
        json={"energy_j": cost, "time_s": 1.0, "converged": converged},
    )
    assert response.status_code == 200, response.text


def _drive(
    http: httpx.Client, job_id: str, table: dict[int, float | None], n: int
) -> list[TrialAssignment]:
    """Run `n` trials sequentially; table: batch size -> cost, None = does not converge."""
    trials = []
    for _ in range(n):
        trial = _trial(http, job_id)
        cost = table[trial.batch_size]
        _report(
            http, job_id, trial.trial_number, cost if cost is not None else 50.0, cost is not None
        )
        trials.append(trial)
    return trials


def test_pruning_goes_down_then_up_and_a_failure_ends_a_direction(http: httpx.Client) -> None:
    _register(http, _job("prune"))
    # 16 and 128 fail: 8 (below 16) and 256 (above 128) are never tried.
    table = {8: 90.0, 16: None, 32: 200.0, 64: 150.0, 128: None, 256: 100.0}
    trials = _drive(http, "prune", table, 7)
    assert [(t.batch_size, t.stage, t.round) for t in trials] == [
        (32, "pruning", 1),
        (16, "pruning", 1),  # down ... fails: down ends
        (64, "pruning", 1),  # up
        (128, "pruning", 1),  # fails: up ends
        (64, "pruning", 2),  # round 2 starts at the cheapest survivor
        (32, "pruning", 2),  # and walks over the survivors only
        (64, "mab", None),  # Thompson sampling over {32, 64}
    ]
    state = JobState.model_validate(http.get("/jobs/prune").json())
    assert state.stage == "mab" and state.survivors == [32, 64]
    assert (state.best_batch_size, state.best_cost) == (64, 150.0)


def test_full_pruning_order_and_round_two_pivot(http: httpx.Client) -> None:
    _register(http, _job("order"))
    table = {8: 500.0, 16: 300.0, 32: 200.0, 64: 150.0, 128: None, 256: 100.0}
    trials = _drive(http, "order", table, 9)
    assert [t.batch_size for t in trials[:9]] == [32, 16, 8, 64, 128, 64, 32, 16, 8]
    assert [t.round for t in trials] == [1] * 5 + [2] * 4


def test_thompson_sampling_converges_to_the_cheapest_arm(http: httpx.Client) -> None:
    _register(
        http, _job("ts", batch_sizes=[16, 32, 64], default_batch_size=32, num_pruning_rounds=1)
    )
    rng = np.random.default_rng(0)
    means = {16: 180.0, 32: 160.0, 64: 150.0}
    picks = []
    for _ in range(60):
        trial = _trial(http, "ts")
        cost = float(rng.normal(means[trial.batch_size], 8.0))
        _report(http, "ts", trial.trial_number, cost, True)
        picks.append((trial.stage, trial.batch_size))
    mab = [bs for stage, bs in picks if stage == "mab"]
    assert len(mab) >= 55
    late = Counter(mab[-25:])
    assert late[64] >= 20, late  # the cheapest arm dominates once the posteriors narrow
    assert Counter(mab)[16] < Counter(mab)[64]


def test_early_stop_bound_is_beta_times_best_converged_cost(http: httpx.Client) -> None:
    _register(http, _job("beta", beta_knob=1.5))
    first = _trial(http, "beta")
    assert first.cost_ub is None  # nothing converged yet
    _report(http, "beta", first.trial_number, 200.0, True)
    second = _trial(http, "beta")
    assert second.cost_ub == pytest.approx(1.5 * 200.0)
    # A non-converged trial never becomes the best, however cheap.
    _report(http, "beta", second.trial_number, 1.0, False)
    third = _trial(http, "beta")
    assert third.cost_ub == pytest.approx(300.0)
    state = JobState.model_validate(http.get("/jobs/beta").json())
    assert (state.best_batch_size, state.best_cost) == (first.batch_size, 200.0)


def test_no_early_stop_without_beta(http: httpx.Client) -> None:
    _register(http, _job("nobeta", beta_knob=None))
    trial = _trial(http, "nobeta")
    _report(http, "nobeta", trial.trial_number, 100.0, True)
    assert _trial(http, "nobeta").cost_ub is None


def test_filler_while_the_pruning_trial_is_in_flight(http: httpx.Client) -> None:
    _register(http, _job("fill"))
    first = _trial(http, "fill")
    filler = _trial(http, "fill")  # the walk waits on `first`
    assert (first.stage, filler.stage, filler.batch_size) == ("pruning", "filler", 32)
    _report(http, "fill", first.trial_number, 100.0, True)
    _report(http, "fill", filler.trial_number, 90.0, True)
    nxt = _trial(http, "fill")
    assert (nxt.stage, nxt.batch_size) == ("pruning", 16)  # fillers do not steer pruning


def test_a_dead_clients_trial_times_out_and_its_batch_size_is_handed_out_again(
    db_url: str,
) -> None:
    with running_server(db_url, trial_timeout_s=0.5) as url, httpx.Client(base_url=url) as http:
        _register(http, _job("dead"))
        first = _trial(http, "dead")
        filler = _trial(http, "dead")  # not timed out yet: the walk still waits on `first`
        assert (first.stage, filler.stage) == ("pruning", "filler")
        time.sleep(0.7)  # both clients die silently
        again = _trial(http, "dead")
        assert (again.stage, again.round, again.batch_size) == ("pruning", 1, first.batch_size)
        statuses = [
            r.status for r in TrialList.validate_python(http.get("/jobs/dead/trials").json())
        ]
        assert statuses == ["timed_out", "timed_out", "dispatched"]
        _report(http, "dead", first.trial_number, 100.0, True)  # a late report still counts
        late = TrialList.validate_python(http.get("/jobs/dead/trials").json())[0]
        assert (late.status, late.cost) == ("succeeded", 100.0)
        twice = http.patch(
            f"/jobs/dead/trials/{first.trial_number}",
            json={"energy_j": 1, "time_s": 1, "converged": True},
        )
        assert twice.status_code == 409


def test_without_a_trial_timeout_a_trial_waits_forever(http: httpx.Client) -> None:
    _register(http, _job("patient"))
    first = _trial(http, "patient")
    time.sleep(0.3)
    assert _trial(http, "patient").stage == "filler"
    records = TrialList.validate_python(http.get("/jobs/patient/trials").json())
    assert [r.status for r in records] == ["dispatched", "dispatched"]
    assert records[0].trial_number == first.trial_number


def test_nothing_converges_is_a_conflict(http: httpx.Client) -> None:
    _register(http, _job("hopeless", batch_sizes=[16, 32], default_batch_size=16))
    _drive(http, "hopeless", {16: None, 32: None}, 2)
    response = http.post("/jobs/hopeless/trials")
    assert response.status_code == 409
    assert "no batch size of [16, 32] reached the target" in response.json()["detail"]
    assert http.get("/jobs/hopeless").json()["stage"] == "infeasible"


def test_registration_is_idempotent_and_mismatch_is_409(http: httpx.Client) -> None:
    assert http.post("/jobs", json=_job("reg")).status_code == 201
    assert http.post("/jobs", json=_job("reg")).status_code == 200
    response = http.post("/jobs", json=_job("reg", eta_knob=0.5))
    assert response.status_code == 409
    assert "eta_knob" in response.json()["detail"]
    assert http.get("/jobs/reg").json()["config"]["eta_knob"] == 1.0  # state intact


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"default_batch_size": 48}, "default_batch_size=48 is not one of"),
        ({"eta_knob": 1.5}, "eta_knob"),
        ({"eta_knob": -0.1}, "eta_knob"),
        ({"beta_knob": 0.5}, "beta_knob"),
        ({"batch_sizes": []}, "batch_sizes"),
        ({"batch_sizes": [8, 8, 32]}, "distinct"),
        ({"batch_sizes": [0, 32]}, "positive"),
        ({"max_power_w": 0}, "max_power_w"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"surprise": 1}, "surprise"),
        ({"job_id": "bad id/"}, "job_id"),
    ],
)
def test_invalid_specs_are_422(http: httpx.Client, overrides: dict, field: str) -> None:
    response = http.post("/jobs", json={**_job("bad"), **overrides})
    assert response.status_code == 422
    assert field in response.text
    assert http.get("/jobs/bad").status_code == 404  # nothing was stored


def test_unknown_job_is_404_everywhere(http: httpx.Client) -> None:
    for response in (
        http.get("/jobs/ghost"),
        http.get("/jobs/ghost/trials"),
        http.post("/jobs/ghost/trials"),
        http.patch("/jobs/ghost/trials/1", json={"energy_j": 1, "time_s": 1, "converged": True}),
    ):
        assert response.status_code == 404
        assert (
            response.json()["detail"] == "Unknown job id 'ghost': register it first (POST /jobs)."
        )


def test_bad_reports(http: httpx.Client) -> None:
    _register(http, _job("rep"))
    trial = _trial(http, "rep")
    bad = http.patch(
        f"/jobs/rep/trials/{trial.trial_number}",
        json={"energy_j": -1, "time_s": 1, "converged": True},
    )
    assert bad.status_code == 422
    unknown = http.patch(
        "/jobs/rep/trials/99", json={"energy_j": 1, "time_s": 1, "converged": True}
    )
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "ZeusBSOTrialNotFoundError"
    assert "has no trial 99" in unknown.json()["detail"]
    _report(http, "rep", trial.trial_number, 10.0, True)
    again = http.patch(
        f"/jobs/rep/trials/{trial.trial_number}",
        json={"energy_j": 5, "time_s": 1, "converged": True},
    )
    assert again.status_code == 409 and "already reported" in again.json()["detail"]
    records = TrialList.validate_python(http.get("/jobs/rep/trials").json())
    assert [(r.status, r.cost) for r in records] == [("succeeded", 10.0)]  # first report kept


def test_state_survives_a_server_restart(db_url: str) -> None:
    with running_server(db_url) as url, httpx.Client(base_url=url) as http:
        _register(http, _job("durable"))
        _drive(http, "durable", {b: 100.0 + b for b in BASE["batch_sizes"]}, 3)
    with running_server(db_url) as url, httpx.Client(base_url=url) as http:
        state = JobState.model_validate(http.get("/jobs/durable").json())
        assert state.num_trials == 3
        assert _trial(http, "durable").trial_number == 4


def test_concurrent_clients_on_two_servers_sharing_one_database(db_url: str) -> None:
    """Two server processes' worth of apps on one SQLite file: only DB transactions protect it."""
    table = {8: 500.0, 16: 300.0, 32: 200.0, 64: 150.0, 128: 170.0, 256: 260.0}
    workers, per_worker = 8, 6
    with running_server(db_url) as url_a, running_server(db_url) as url_b:
        urls = [url_a, url_b]
        # FastAPI builds some validation fields on an app's first request, inside
        # `warnings.catch_warnings()` to hide a pydantic warning. Those filters are
        # process-wide and not thread-safe: two apps of this one process doing it at once
        # in their server threads can let the warning out (an error under pytest's
        # filterwarnings), so each app answers one request first. Real servers are
        # separate processes.
        for url in urls:
            assert httpx.get(f"{url}/jobs/warm-up").status_code == 404
        barrier = threading.Barrier(workers)

        def register(i: int) -> int:
            with httpx.Client(base_url=urls[i % 2], timeout=60) as http:
                barrier.wait()
                return http.post("/jobs", json=_job("race")).status_code

        with ThreadPoolExecutor(workers) as pool:
            codes = sorted(pool.map(register, range(workers)))
        assert codes == [200] * (workers - 1) + [201]

        def work(i: int) -> list[int]:
            numbers = []
            with httpx.Client(base_url=urls[i % 2], timeout=60) as http:
                for _ in range(per_worker):
                    trial = _trial(http, "race")
                    _report(http, "race", trial.trial_number, table[trial.batch_size], True)
                    numbers.append(trial.trial_number)
            return numbers

        with ThreadPoolExecutor(workers) as pool:
            numbers = [n for chunk in pool.map(work, range(workers)) for n in chunk]

        with httpx.Client(base_url=url_a) as http:
            records = TrialList.validate_python(http.get("/jobs/race/trials").json())
    total = workers * per_worker
    assert sorted(numbers) == list(range(1, total + 1))  # no trial handed out twice
    assert [r.trial_number for r in records] == list(range(1, total + 1))
    assert all(
        r.status == "succeeded" and r.cost == table[r.batch_size] for r in records
    )  # no lost result
    pruning = [(r.round, r.batch_size) for r in records if r.stage == "pruning"]
    assert len(pruning) == len(set(pruning))  # each pruning step ran once
    # The pruning trials, in order, follow the sequential walk.
    assert [bs for rnd, bs in pruning if rnd == 1] == [32, 16, 8, 64, 128, 256]
    assert [bs for rnd, bs in pruning if rnd == 2] == [64, 32, 16, 8, 128, 256][
        : len([1 for rnd, _ in pruning if rnd == 2])
    ]
