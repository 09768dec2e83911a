"""``/metrics`` the way operators scrape it, against a real coordinator on loopback: a
read-only metrics token, Prometheus's conventions (counters, ``perseus_build_info``, no
``_created``), per-job series gone a set while after the job ends, and the Grafana
dashboard's queries naming only series a real scrape has."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from paths import REPO
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import GroundTruth, SimulatedJob, running_server, write_truth_profile

from perseus.protocol import JOB_TOKEN_HEADER
from perseus.server import create_app
from perseus.server.job.stats import MAX_GUARD_REASONS, JobStats
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


UNIT_ABBREVIATIONS = {"s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d"}
NON_BASE_UNITS = {
    "milliseconds": "seconds", "microseconds": "seconds", "nanoseconds": "seconds",
    "minutes": "seconds", "hours": "seconds", "days": "seconds", "kilobytes": "bytes",
    "megabytes": "bytes", "gigabytes": "bytes", "millijoules": "joules",
    "kilowatts": "watts", "milliwatts": "watts", "megahertz": "hertz", "kilohertz": "hertz",
    "percent": "ratio", "celsius": "kelvin",
}  # fmt: skip
SNAKE = re.compile(r"[a-z_][a-z0-9_]*")
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def lint_exposition(text: str) -> list[str]:
    """What ``promtool check metrics`` reports, checked in-process (no external binary): the
    text format's structure (one HELP and one TYPE per family, before its samples, which are
    contiguous and unique), then promtool's lint rules (help text, counters end in
    ``_total``, snake_case, base units, no abbreviated units or type in the name, reserved
    suffixes only where the type owns them, ``le`` on every bucket)."""
    problems: list[str] = []
    help_of: dict[str, str] = {}
    type_of: dict[str, str] = {}
    sampled: set[str] = set()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    current = ""

    def family_of(sample: str) -> str:
        for family, kind in type_of.items():
            if sample == family or sample in (family + x for x in SUFFIXES.get(kind, ())):
                return family
        return sample

    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            parts = line.split(" ", 3)
            if len(parts) < 4:
                problems.append(f"malformed line: {line!r}")
                continue
            table = help_of if parts[1] == "HELP" else type_of
            name = parts[2]
            if name in table:
                problems.append(f"{name}: second {parts[1]} line")
            if name in sampled:
                problems.append(f"{name}: {parts[1]} line after its samples")
            table[name] = parts[3]
            current = name
        elif line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            family = family_of(name)
            if family in sampled and family != current:
                problems.append(f"{family}: samples not contiguous")
            sampled.add(family)
            current = family
    for family in text_string_to_metric_families(text):  # raises on a malformed sample
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in seen:
                problems.append(f"{sample.name}{dict(key[1])}: duplicate sample")
            seen.add(key)
            problems += [f"{sample.name}: label {k!r} not snake_case"
                         for k in sample.labels if not SNAKE.fullmatch(k)]  # fmt: skip
            if sample.name.endswith("_bucket") and "le" not in sample.labels:
                problems.append(f"{sample.name}: a bucket without 'le'")
    for name, kind in type_of.items():
        words = name.split("_")
        if not help_of.get(name, "").strip():
            problems.append(f"{name}: no help text")
        if kind == "counter" and not name.endswith("_total"):
            problems.append(f"{name}: counter metrics should have _total suffix")
        if not SNAKE.fullmatch(name) or ":" in name:
            problems.append(f"{name}: metric names should be snake_case")
        if any(w in UNIT_ABBREVIATIONS for w in words):
            problems.append(f"{name}: metric names should not contain abbreviated units")
        problems += [f"{name}: use base unit {NON_BASE_UNITS[w]!r} instead of {w!r}"
                     for w in words if w in NON_BASE_UNITS]  # fmt: skip
        if any(w == t for w in words[1:] for t in ("counter", "gauge", "histogram", "summary")):
            problems.append(f"{name}: metric name should not include its type")
        reserved = ("_bucket", "_sum", "_count")
        if name.endswith(reserved) and kind not in SUFFIXES:
            problems.append(f"{name}: non-histogram metric with a reserved suffix")
    return problems


def test_the_scrape_passes_promtools_checks(scraped):
    _, _, text = scraped
    assert lint_exposition(text) == []


@pytest.mark.parametrize(
    ("exposition", "problem"),
    [
        ("# HELP a_total A.\n# TYPE a_total counter\na_total 1\n", None),
        ("# HELP a A.\n# TYPE a counter\na 1\n", "counter metrics should have _total"),
        ("# HELP a_total \n# TYPE a_total counter\na_total 1\n", "no help text"),
        ("# HELP aB A.\n# TYPE aB gauge\naB 1\n", "snake_case"),
        ("# HELP a_ms A.\n# TYPE a_ms gauge\na_ms 1\n", "abbreviated units"),
        ("# HELP a_milliseconds A.\n# TYPE a_milliseconds gauge\na_milliseconds 1\n",
         "base unit 'seconds'"),
        ("# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\na{x=\"1\"} 2\n", "duplicate sample"),
        ("# HELP a A.\n# TYPE a gauge\na 1\n# HELP b B.\n# TYPE b gauge\nb 1\na 2\n",
         "not contiguous"),
        ("# HELP a_count A.\n# TYPE a_count gauge\na_count 1\n", "reserved suffix"),
    ],
)  # fmt: skip
def test_the_lint_finds_what_promtool_finds(exposition, problem):
    problems = lint_exposition(exposition)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


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
