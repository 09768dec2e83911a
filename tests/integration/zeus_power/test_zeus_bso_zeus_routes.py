"""Zeus 0.16's batch-size routes (``/zeus``) through a real server on loopback and real SQLite.

Bodies are sent as Zeus's client sends them: ``content=`` JSON text with no Content-Type.
Zeus's real client runs against the same routes in `tests/integration/zeus016`; these tests
pin the adapter's translations and its sharing of one trial logic with our own routes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from zeus_assets.bso_server import running_server

from zeus_power.bso.local import LocalBatchSizeOptimizer
from zeus_power.bso.models import JobConfig, JobState, TrialList, TrialResult
from zeus_power.bso.service import BSOService
from zeus_power.metric import zeus_cost

SPEC: dict[str, Any] = {
    "job_id": None,
    "job_id_prefix": "mnist",
    "batch_sizes": [256, 32, 64, 128],
    "default_batch_size": 128,
    "eta_knob": 0.5,
    "beta_knob": 2.0,
    "target_metric": 0.9,
    "higher_is_better_metric": True,
    "max_epochs": 4,
    "num_pruning_rounds": 2,
    "window_size": 0,
    "mab_prior_mean": 0.0,
    "mab_prior_precision": 0.0,
    "mab_num_explorations": 2,
    "mab_seed": 1,
    "max_power": 600.0,  # Zeus: the max power of all GPUs together
    "number_of_gpus": 2,
    "gpu_model": "NVIDIA A40",
}


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    with (
        running_server(f"sqlite:///{tmp_path / 'bso.db'}") as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


def _zeus(http: httpx.Client, method: str, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    """A request as Zeus's client makes it: JSON text, no Content-Type."""
    content = None if body is None else json.dumps(body)
    response = http.request(method, f"/zeus{path}", content=content, **kw)
    assert "content-type" not in response.request.headers
    return response


def _register(http: httpx.Client, **overrides: Any) -> dict[str, Any]:
    r = _zeus(http, "POST", "/jobs", {**SPEC, **overrides})
    assert r.status_code in (200, 201), r.text
    return r.json()


def _epoch(http: httpx.Client, trial: dict, epoch: int, *, metric: float, energy: float) -> dict:
    body = {**trial, "time": 1.0 * epoch, "energy": energy, "metric": metric, "current_epoch": epoch}
    r = _zeus(http, "POST", "/report", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_registration_names_the_job_and_keeps_zeus_field_meanings(http: httpx.Client) -> None:
    created = _register(http)
    assert created["job_id"].startswith("mnist-") and len(created["job_id"]) == len("mnist-") + 8
    assert created["batch_sizes"] == [32, 64, 128, 256]
    assert (created["max_power"], created["number_of_gpus"]) == (600.0, 2)
    # Stored as our config: 300 W per GPU, the same cost as Zeus's max_power.
    state = JobState.model_validate(http.get(f"/jobs/{created['job_id']}").json())
    assert state.config.max_power_w == 300.0 and state.config.total_max_power_w == 600.0

    # A second session of a named job: 201, then 200 with the same spec, 409 with another.
    first = _zeus(http, "POST", "/jobs", {**SPEC, "job_id": "mnist-run"})
    again = _zeus(http, "POST", "/jobs", {**SPEC, "job_id": "mnist-run"})
    other = _zeus(http, "POST", "/jobs", {**SPEC, "job_id": "mnist-run", "max_epochs": 9})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert again.json() == first.json()
    assert "max_epochs" in other.json()["detail"]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"mab_num_explorations": 0}, "mab_num_explorations"),
        ({"beta_knob": 0.5}, "beta_knob"),
        ({"batch_sizes": [32, 32, 64, 128]}, "distinct"),
        ({"job_id": "other-1"}, "does not start with job_id_prefix"),
        ({"max_power": float("inf")}, "max_power"),
        ({"job_id_prefix": "../etc"}, "job_id_prefix"),
    ],
)
def test_what_our_policy_cannot_take_is_a_422_naming_it(
    http: httpx.Client, overrides: dict, named: str
) -> None:
    body = json.dumps({**SPEC, **overrides}, allow_nan=True)
    r = http.post("/zeus/jobs", content=body)
    assert r.status_code == 422 and named in r.text, r.text
    assert http.post("/zeus/jobs", content=b"{not json").status_code == 422


def test_epochs_go_on_until_the_policy_stops_them_and_one_trial_numbering(
    http: httpx.Client,
) -> None:
    job_id = _register(http, job_id="mnist-epochs")["job_id"]
    r = _zeus(http, "GET", "/jobs/batch_size", params={"job_id": job_id})
    first = r.json()
    assert first == {"job_id": job_id, "batch_size": 128, "trial_number": 1}

    assert _epoch(http, first, 1, metric=0.3, energy=100.0)["stop_train"] is False
    done = _epoch(http, first, 2, metric=0.95, energy=200.0)
    assert (done["stop_train"], done["converged"]) == (True, True)
    # Zeus's client may repeat a report: the trial's result stands.
    assert _epoch(http, first, 3, metric=0.1, energy=999.0)["converged"] is True

    # Our own route hands out the same job's next trial: one numbering, one policy.
    ours = http.post(f"/jobs/{job_id}/trials").json()
    assert (ours["trial_number"], ours["batch_size"]) == (2, 64)
    bound = 2.0 * zeus_cost(200.0, 2.0, 0.5, 600.0)
    assert ours["cost_ub"] == pytest.approx(bound)
    second = {"job_id": job_id, "batch_size": 64, "trial_number": 2}
    stopped = _epoch(http, second, 1, metric=0.2, energy=2 * bound)  # past β × best cost
    assert (stopped["stop_train"], stopped["converged"]) == (True, False)
    assert "early-stop bound" in stopped["message"]

    third = _zeus(http, "GET", "/jobs/batch_size", params={"job_id": job_id}).json()
    assert third["trial_number"] == 3
    for epoch in range(1, 5):
        verdict = _epoch(http, third, epoch, metric=0.1, energy=1.0 * epoch)
    assert (verdict["stop_train"], verdict["converged"]) == (True, False)
    assert "max_epochs=4" in verdict["message"]

    trials = TrialList.validate_python(http.get(f"/jobs/{job_id}/trials").json())
    assert [(t.trial_number, t.status, t.epochs) for t in trials] == [
        (1, "succeeded", 2),
        (2, "failed", 1),
        (3, "failed", 4),
    ]
    assert trials[0].cost == pytest.approx(zeus_cost(200.0, 2.0, 0.5, 600.0))


def test_ending_a_trial_without_a_result_fails_it(http: httpx.Client) -> None:
    job_id = _register(http, job_id="mnist-end")["job_id"]
    trial = _zeus(http, "GET", "/jobs/batch_size", params={"job_id": job_id}).json()
    ended = _zeus(http, "PATCH", "/trials", trial)
    assert ended.status_code == 200 and ended.json()["status"] == "failed"
    # Zeus's client ends every trial at exit, reported or not: a no-op after a result.
    nxt = _zeus(http, "GET", "/jobs/batch_size", params={"job_id": job_id}).json()
    _epoch(http, nxt, 1, metric=0.99, energy=10.0)
    assert _zeus(http, "PATCH", "/trials", nxt).json()["status"] == "succeeded"

    assert _zeus(http, "PATCH", "/trials", {**nxt, "trial_number": 99}).status_code == 404
    assert _zeus(http, "PATCH", "/trials", {**nxt, "batch_size": 256}).status_code == 404
    unknown = _zeus(http, "GET", "/jobs/batch_size", params={"job_id": "nope"})
    assert unknown.status_code == 404


def test_zeus_routes_need_the_token_when_the_server_has_one(tmp_path: Path) -> None:
    token = "zeus-route-token-0123456789"
    with running_server(f"sqlite:///{tmp_path / 'bso.db'}", token=token) as url:
        r = httpx.post(f"{url}/zeus/jobs", content=json.dumps(SPEC))
        assert r.status_code == 401
        r = httpx.post(
            f"{url}/zeus/jobs",
            content=json.dumps(SPEC),
            headers={"authorization": f"Bearer {token}"},
        )
        assert r.status_code == 201


# ---------------------------------------------------------------- the one service, in process


def _config(job_id: str) -> JobConfig:
    return JobConfig(
        job_id=job_id, batch_sizes=[32, 64, 128], default_batch_size=64, max_power_w=300.0
    )


def test_the_local_optimizer_is_the_service_with_its_expiry_and_numbering() -> None:
    local = LocalBatchSizeOptimizer(trial_timeout_s=0.05)
    assert isinstance(local, BSOService)
    local.register_job(_config("local"))
    first = local.next_trial("local")
    threading.Event().wait(0.1)
    second = local.next_trial("local")  # the first timed out: its batch size again
    assert (first.trial_number, second.trial_number) == (1, 2)
    assert second.batch_size == first.batch_size
    statuses = [t.status for t in local.list_trials("local")]
    assert statuses == ["timed_out", "dispatched"]
    # A late report is still taken, as by the server.
    late = local.report("local", 1, TrialResult(energy_j=10.0, time_s=1.0, converged=True))
    assert late.status == "succeeded"


def test_the_local_optimizer_serves_threads_one_transaction_at_a_time() -> None:
    local = LocalBatchSizeOptimizer()
    local.register_job(_config("threads"))
    with ThreadPoolExecutor(8) as pool:
        numbers = list(pool.map(lambda _: local.next_trial("threads").trial_number, range(40)))
    assert sorted(numbers) == list(range(1, 41))
