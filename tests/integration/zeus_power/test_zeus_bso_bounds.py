"""Every number the batch-size optimizer takes is bounded and finite at the edge (issue #30).

Each case of the issue against a real server on loopback and a real SQLite file: what
answered 500 (or was stored as infinity) is now a 422 naming the field, with a strict
JSON body, and nothing of it is stored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from zeus_assets.bso_server import running_server

from zeus_power.bso.models import TrialAssignment, TrialList

JOB: dict[str, Any] = {
    "batch_sizes": [8, 16, 32],
    "default_batch_size": 16,
    "eta_knob": 0.5,
    "max_power_w": 300.0,
    "mab_seed": 7,
}


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    with (
        running_server(f"sqlite:///{tmp_path / 'bso.db'}") as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


def _send(http: httpx.Client, method: str, path: str, body: dict[str, Any]) -> httpx.Response:
    # json.dumps writes NaN/Infinity literals, as a careless client would.
    return http.request(
        method, path, content=json.dumps(body), headers={"content-type": "application/json"}
    )


def _refused(response: httpx.Response, field: str) -> None:
    assert response.status_code == 422, response.text
    body = json.loads(response.text, parse_constant=lambda c: pytest.fail(f"{c} in the body"))
    assert any(field in [str(x) for x in err["loc"]] for err in body["detail"]), body


def _trial(http: httpx.Client, job_id: str) -> TrialAssignment:
    response = http.post(f"/jobs/{job_id}/trials")
    assert response.status_code == 201, response.text
    return TrialAssignment.model_validate(response.json())


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"batch_sizes": [8, 16, 2**63]}, "batch_sizes"),
        ({"batch_sizes": [16, 2**64 + 1]}, "batch_sizes"),
        ({"default_batch_size": 2**63}, "default_batch_size"),
        ({"mab_seed": -1}, "mab_seed"),
        ({"mab_seed": 2**64}, "mab_seed"),
        ({"eta_knob": math.nan}, "eta_knob"),
        ({"beta_knob": math.nan}, "beta_knob"),
        ({"beta_knob": math.inf}, "beta_knob"),
        ({"max_power_w": math.nan}, "max_power_w"),
        ({"max_power_w": 1e308}, "max_power_w"),
        ({"target_metric": math.nan}, "target_metric"),
        ({"mab_prior_mean": -math.inf}, "mab_prior_mean"),
        ({"mab_prior_precision": math.nan}, "mab_prior_precision"),
        ({"max_epochs": 2**63}, "max_epochs"),
        ({"number_of_gpus": 2**63}, "number_of_gpus"),
        ({"window_size": 2**63}, "window_size"),
        ({"num_pruning_rounds": 2**40}, "num_pruning_rounds"),
        ({"mab_num_explorations": 2**63}, "mab_num_explorations"),
    ],
)
def test_an_unbounded_or_non_finite_spec_is_a_422_and_nothing_is_stored(
    http: httpx.Client, overrides: dict[str, Any], field: str
) -> None:
    _refused(_send(http, "POST", "/jobs", {"job_id": "edge", **JOB, **overrides}), field)
    assert http.get("/jobs/edge").status_code == 404
    # The server is fine: the same job with sane numbers registers and serves trials.
    assert _send(http, "POST", "/jobs", {"job_id": "edge", **JOB}).status_code == 201
    assert _trial(http, "edge").batch_size == 16


def test_a_trial_number_beyond_any_sql_integer_is_a_422(http: httpx.Client) -> None:
    assert _send(http, "POST", "/jobs", {"job_id": "tn", **JOB}).status_code == 201
    trial = _trial(http, "tn")
    result = {"energy_j": 10.0, "time_s": 1.0, "converged": True}
    for number in (2**63, 2**31, 10**30):
        response = _send(http, "PATCH", f"/jobs/tn/trials/{number}", result)
        _refused(response, "trial_number")
    response = _send(http, "PATCH", f"/jobs/tn/trials/{trial.trial_number}", result)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("result", "field"),
    [
        ('{"energy_j": 1e999, "time_s": 1.0, "converged": true}', "energy_j"),
        ('{"energy_j": NaN, "time_s": 1.0, "converged": true}', "energy_j"),
        ('{"energy_j": 1e308, "time_s": 1.0, "converged": true}', "energy_j"),
        ('{"energy_j": 10.0, "time_s": Infinity, "converged": true}', "time_s"),
        (
            '{"energy_j": 10.0, "time_s": 1.0, "converged": true, "epochs": 9223372036854775808}',
            "epochs",
        ),
    ],
)
def test_a_non_finite_or_unbounded_result_is_a_422_and_the_trial_waits_for_a_good_one(
    http: httpx.Client, result: str, field: str
) -> None:
    assert _send(http, "POST", "/jobs", {"job_id": "res", **JOB}).status_code == 201
    trial = _trial(http, "res")
    path = f"/jobs/res/trials/{trial.trial_number}"
    response = http.patch(path, content=result, headers={"content-type": "application/json"})
    _refused(response, field)
    records = TrialList.validate_python(http.get("/jobs/res/trials").json())
    assert [(r.status, r.energy_j) for r in records] == [("dispatched", None)]
    good = {"energy_j": 10.0, "time_s": 1.0, "converged": True}
    assert _send(http, "PATCH", path, good).status_code == 200
    records = TrialList.validate_python(http.get("/jobs/res/trials").json())
    assert [(r.status, r.energy_j) for r in records] == [("succeeded", 10.0)]
