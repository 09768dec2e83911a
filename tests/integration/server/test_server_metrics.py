"""``/metrics`` the way operators scrape it, against a real coordinator on loopback: a
read-only metrics token, Prometheus's conventions (counters, ``perseus_build_info``, no
``_created``), per-job series gone a set while after the job ends, and the Grafana
dashboard's queries naming only series a real scrape has."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import httpx
import pytest
from paths import REPO
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import GroundTruth, SimulatedJob, running_server, write_truth_profile

from perseus.protocol import JOB_TOKEN_HEADER
from perseus.server import create_app
from perseus.server.stats import MAX_GUARD_REASONS, JobStats
from perseus.settings import PerseusSettings

ROUNDS = 9
"""A warm-up, 4 all-max rounds (the baseline), the blocking power's own round, then the plan
(its first round may be an all-max reference): the job has measured a saving."""
TOKEN = "cluster-token-0123456789"
METRICS_TOKEN = "metrics-token-0123456789"
DASHBOARD = REPO / "docs" / "grafana" / "perseus-dashboard.json"
COUNTERS = (
    "perseus_energy_joules",
    "perseus_energy_saved_joules",
    "perseus_energy_overspent_joules",
    "perseus_job_rounds",
    "perseus_job_iterations",
    "perseus_guard_moves",
    "perseus_rounds",
    "perseus_jobs_ended",
    "perseus_http_requests",
)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A Perseus job (given profile) that ran `ROUNDS` rounds and whose guard moved once,
    scraped with the metrics token alone; yields (url, job, scrape text)."""
    tmp = tmp_path_factory.mktemp("metrics")
    truth = GroundTruth([0.010, 0.016])
    settings = PerseusSettings(
        scheduler="Perseus",
        scheduler_args={
            "num_microbatches": 4,
            "profile_path": str(write_truth_profile(truth, 2, tmp / "p.csv")),
        },
        dump_dir=str(tmp / "dump"),
        token=TOKEN,
        metrics_token=METRICS_TOKEN,
    )
    app = create_app(settings)
    with running_server(settings, app=app) as url:
        job = SimulatedJob(url, truth, pp=2, num_microbatches=4, token=TOKEN)
        job.run_sync(ROUNDS)
        assert job.job_id is not None
        assert job.statuses[-1] is not None and job.statuses[-1].phase == "deployed"
        app.state.job_manager.jobs[job.job_id].stats.guard_moved("slowdown")
        r = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
        assert r.status_code == 200, r.text
        yield url, job, r.text


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_the_metrics_token_scrapes_and_opens_nothing_else(scraped):
    url, job, _ = scraped
    metrics_only = {"authorization": f"Bearer {METRICS_TOKEN}"}
    assert httpx.get(f"{url}/metrics").status_code == 401
    for method, path in (
        ("GET", "/jobs"),
        ("GET", f"/jobs/{job.job_id}"),
        ("GET", "/info"),
        ("POST", "/register_job"),
        ("POST", f"/straggler/{job.job_id}"),
    ):
        r = httpx.request(method, url + path, headers=metrics_only)
        assert r.status_code == 401, (path, r.status_code)
        assert METRICS_TOKEN not in r.text
    # The cluster token still scrapes too.
    assert (
        httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    )


def test_a_scrape_parses_with_the_cumulative_counters(scraped):
    _, job, text = scraped
    fams = families(text)
    for name in COUNTERS:
        assert fams[name].type == "counter", name
    assert fams["perseus_build_info"].type == "gauge"  # an Info, in the text format
    assert not [line for line in text.splitlines() if "_created" in line]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values() for s in f.samples
    }
    job_label = ("job_id", job.job_id)
    assert samples["perseus_guard_moves_total", (job_label, ("reason", "slowdown"))] == 1
    assert samples["perseus_energy_joules_total", (job_label,)] > 0
    assert samples["perseus_energy_saved_joules_total", (job_label,)] > 0
    assert samples["perseus_job_rounds_total", (job_label,)] == ROUNDS
    assert samples["perseus_job_state", (job_label, ("state", "running"))] == 1


def test_promtool_accepts_the_scrape(scraped, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    _, _, text = scraped
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboards_queries_name_only_scraped_series(scraped):
    _, _, text = scraped
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"]]
    names = {n for q in queries for n in re.findall(r"\bperseus_[a-z0-9_]+\b", q)}
    scraped_names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert names and not names - scraped_names, sorted(names - scraped_names)
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("energy", "saving", "slowdown", "rounds"):
        assert topic in titles


def test_an_ended_jobs_series_disappear_after_the_set_delay():
    ttl_s = 2.0
    settings = PerseusSettings(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": 2},
        ended_job_ttl_s=ttl_s,
    )
    with running_server(settings, round_timeout_s=0.5) as url:
        # A job whose round times out (its rank 1 never asks) fails ...
        dead = SimulatedJob(url, GroundTruth([0.01, 0.012]), pp=2, num_microbatches=2)
        dead.run_sync(0)
        assert httpx.get(f"{url}/schedule/{dead.job_id}", params={"rank": 0}).status_code == 504
        # ... and one that ran finishes.
        done = SimulatedJob(url, GroundTruth([0.01, 0.012]), pp=2, num_microbatches=2)
        done.run_sync(2)
        r = httpx.post(
            f"{url}/finish/{done.job_id}",
            headers={JOB_TOKEN_HEADER: done.headers[JOB_TOKEN_HEADER]},
        )
        assert r.status_code == 200, r.text
        ended_at = time.monotonic()

        def series() -> dict[str, str]:
            text = httpx.get(f"{url}/metrics").text
            return {
                s.labels["job_id"]: s.labels["state"]
                for f in text_string_to_metric_families(text)
                if f.name == "perseus_job_state"
                for s in f.samples
                if s.value == 1
            }

        assert series() == {done.job_id: "finished", dead.job_id: "failed"}
        while series():
            assert time.monotonic() - ended_at < ttl_s + 5, "the series never went"
            time.sleep(0.1)
        assert time.monotonic() - ended_at >= ttl_s
        assert httpx.get(f"{url}/jobs").json() == []
        text = httpx.get(f"{url}/metrics").text
        ended = {
            s.labels["state"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "perseus_jobs_ended"
            for s in f.samples
        }
        assert ended == {"finished": 1, "failed": 1, "evicted": 0}


def test_guard_moves_are_counted_by_bounded_reason():
    stats = JobStats(world_size=2, dp_degree=1)
    stats.guard_moved("slowdown")
    stats.guard_moved("Slowdown")
    stats.guard_moved("energy not lower!")
    assert stats.guard_moves == {"slowdown": 2, "energy_not_lower": 1}
    for i in range(2 * MAX_GUARD_REASONS):
        stats.guard_moved(f"reason{i}")
    assert len(stats.guard_moves) == MAX_GUARD_REASONS + 1 and stats.guard_moves["other"] > 0
