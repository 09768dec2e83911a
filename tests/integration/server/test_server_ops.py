"""The operator's view against a real coordinator on loopback, after a Perseus job on
emulated GPUs ran some rounds: ``/healthz``, ``/metrics``, ``/jobs``, ``/jobs/{id}`` report
what the job did, and ``perseus report`` reads the same numbers from the job's dump."""

from __future__ import annotations

import asyncio
import json
import math
import platform
import statistics

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import (
    F_MAX,
    GroundTruth,
    SimulatedJob,
    planned_energy,
    running_server,
    write_truth_profile,
)
from typer.testing import CliRunner

from perseus.cli import app as cli_app
from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import load_plan
from perseus.io.profile_csv import load_profile
from perseus.planning import evaluate, max_frequencies
from perseus.protocol import ProfilingResult
from perseus.server.metrics import package_version as m_version
from perseus.settings import PerseusSettings

M = 4
PP, DP = 2, 2
ROUNDS = 10
"""A warm-up, 4 all-max rounds (the baseline), the profile source's own all-max round for the
blocking power, then the plan from round 6 (its first round may be an all-max reference)."""
TRUTH = GroundTruth([0.010, 0.016])


def figures(results: list[ProfilingResult]) -> tuple[float, float]:
    """(time, energy) per iteration of the whole job, computed here from the raw results: the
    slowest rank's median iteration time (the guard's and the report's round time) and the
    sum of the ranks' mean iteration energies."""
    time_s = max(statistics.median(r.iter_time) for r in results)
    energy = math.fsum(sum(r.iter_energy) / len(r.iter_energy) for r in results)
    return time_s, energy


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """A Perseus job (given profile, measured blocking power) after ROUNDS reported rounds and
    one more handed out; yields (url, job, tmp dir) with the coordinator still up."""
    tmp = tmp_path_factory.mktemp("ops")
    truth = TRUTH
    profile = write_truth_profile(truth, PP, tmp / "truth.csv")
    settings = PerseusSettings(
        scheduler="Perseus",
        scheduler_args={"num_microbatches": M, "profile_path": str(profile)},
        dump_dir=str(tmp / "dump"),
        dump_data=True,
    )
    with running_server(settings) as url:
        job = SimulatedJob(url, truth, pp=PP, dp=DP, num_microbatches=M)

        async def main() -> None:
            async with httpx.AsyncClient(timeout=60.0) as client:
                await job.run(client, ROUNDS)
                await job.ask_all(client)  # the last round's results are dumped now

        asyncio.run(main())
        yield url, job, tmp


def kinds(job: SimulatedJob, plan_freqs: list[list[int]]) -> list[str]:
    out = []
    for schedules in job.history:
        freqs = {r: [f for _, f in s.frequencies] for r, s in schedules.items()}
        pp_of = {i.rank: i.pp_rank for i in job.infos}
        if all(f == F_MAX for fs in freqs.values() for f in fs):
            out.append("all-max")
        elif all(fs == plan_freqs[pp_of[r]] for r, fs in freqs.items()):
            out.append("deployed")
        else:
            out.append("other")
    return out


def medians(job: SimulatedJob, rounds: list[int]) -> tuple[float, float]:
    each = [figures(job.results[k]) for k in rounds]
    return statistics.median(t for t, _ in each), statistics.median(e for _, e in each)


def expected(job: SimulatedJob, tmp) -> dict:
    plan = load_plan(tmp / "dump" / job.job_id / "deployed_plan.json")
    k = kinds(job, plan.stage_frequencies())[:ROUNDS]
    # A warm-up and 4 baseline rounds at all-max (they measure the blocking power too),
    # then the plan: it measured both.
    assert k[:5] == ["all-max"] * 5 and k[5] == "deployed" and k[-2:] == ["deployed"] * 2, k
    assert set(k) == {"all-max", "deployed"}, k
    # Medians: of the all-max rounds but the first (a warm-up), and of the plan's rounds.
    t_max, e_max = medians(job, [i for i, x in enumerate(k) if x == "all-max" and i > 0])
    t_dep, e_dep = medians(job, [i for i, x in enumerate(k) if x == "deployed"])
    last_max = max(i for i, x in enumerate(k) if x == "all-max")
    last_dep = max(i for i, x in enumerate(k) if x == "deployed")
    schedule = make_schedule("1f1b", PP, M)
    profile = load_profile(tmp / "truth.csv")
    base = evaluate(profile, schedule, max_frequencies(profile, schedule), plan.p2p_power)
    return {
        "plan": plan,
        "kinds": k,
        "latest_all_max": figures(job.results[last_max]),
        "latest_deployed": figures(job.results[last_dep]),
        "measured_all_max": (t_max, e_max),
        "measured_deployed": (t_dep, e_dep),
        "predicted_all_max": (base.iteration_time_s, base.energy_j * DP),
        "predicted_deployed": (plan.iteration_time, plan.energy * DP),
        "measured_saving": 1 - e_dep / e_max,
        "predicted_saving": 1 - plan.energy / base.energy_j,
        "measured_slowdown": t_dep / t_max - 1,
        "predicted_slowdown": plan.iteration_time / base.iteration_time_s - 1,
    }


ENERGY_REL = 3e-4
"""The energy counter counts whole millijoules: under 1 mJ of every instruction's ≥ 3.7 J."""


def test_healthz_needs_nothing_and_counts_jobs(ran):
    url, _, _ = ran
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "jobs": 1}


def test_jobs_lists_the_job_with_its_round(ran):
    url, job, _ = ran
    r = httpx.get(f"{url}/jobs")
    assert r.status_code == 200, r.text
    assert r.json() == [
        {
            "job_id": job.job_id,
            "state": "running",
            "scheduler": "Perseus",
            "world_size": PP * DP,
            "talking_ranks": PP * DP,  # protocol 1: every rank talks
            "ranks_registered": PP * DP,
            "round": ROUNDS + 1,
            "rounds_completed": ROUNDS + 1,
        }
    ]


def test_job_detail_reports_what_the_job_measured_and_its_plan_predicted(ran):
    url, job, tmp = ran
    want = expected(job, tmp)
    r = httpx.get(f"{url}/jobs/{job.job_id}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["state"] == "running" and body["failure"] is None
    assert (body["pp_degree"], body["dp_degree"], body["tp_degree"]) == (PP, DP, 1)
    assert body["last_round_latency_s"] > 0
    plan, summary = want["plan"], body["deployed_plan"]
    freqs = [f for s in plan.stage_frequencies() for f in s]
    assert summary["instructions"] == len(freqs) == PP * 2 * M
    assert summary["min_frequency_mhz"] == min(freqs) < F_MAX
    assert summary["iteration_time_s"] == pytest.approx(plan.iteration_time, rel=1e-12)
    assert summary["energy_j"] == pytest.approx(plan.energy, rel=1e-12)
    latest = body["latest_measured"]
    assert latest["round"] == ROUNDS - 1 and latest["kind"] == want["kinds"][-1]
    t, e = figures(job.results[ROUNDS - 1])
    assert latest["figures"] == pytest.approx({"iteration_time_s": t, "energy_j": e}, rel=1e-12)
    energy = body["energy"]
    for key in ("measured_all_max", "measured_deployed", "predicted_all_max", "predicted_deployed"):
        t, e = want[key]
        assert energy[key] == pytest.approx({"iteration_time_s": t, "energy_j": e}, rel=1e-9), key
    assert energy["measured_saving"] == pytest.approx(want["measured_saving"], rel=1e-9)
    assert energy["predicted_saving"] == pytest.approx(want["predicted_saving"], rel=1e-9)
    assert energy["measured_saving"] > 0.01  # the plan saved energy ...
    # ... and the profile is the emulator's own: the plan's time is what the GPUs ran, its
    # energy what they measured plus the blocked tail its accounting charges to the ranks
    # that finish an iteration first (their iteration ends with their last instruction).
    assert energy["measured_slowdown"] == pytest.approx(energy["predicted_slowdown"], abs=1e-9)
    dp_of = {i.rank: i.dp_rank for i in job.infos}
    for which, plan_energy in (
        ("all-max", want["predicted_all_max"][1] / DP),
        ("deployed", plan.energy),
    ):
        last = max(i for i, x in enumerate(want["kinds"]) if x == which)
        planned = planned_energy(job.results[last], TRUTH.p2p_power_w, dp_of)
        assert planned == pytest.approx(plan_energy, rel=ENERGY_REL), which
    assert energy["measured_saving"] == pytest.approx(energy["predicted_saving"], abs=0.01)


def test_an_unknown_job_is_404(ran):
    url, _, _ = ran
    r = httpx.get(f"{url}/jobs/no-such-job")
    assert r.status_code == 404
    assert "no-such-job" in r.json()["detail"]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_count_what_the_job_did(ran):
    url, job, tmp = ran
    want = expected(job, tmp)
    r = httpx.get(f"{url}/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    world = PP * DP
    assert m["perseus_jobs", (("state", "running"),)] == 1
    assert m["perseus_jobs", (("state", "failed"),)] == 0
    assert m["perseus_ranks", ()] == world
    assert m["perseus_rounds_total", ()] == ROUNDS + 1
    assert m["perseus_round_latency_seconds_count", ()] == ROUNDS + 1
    assert m["perseus_job_rounds_total", (("job_id", job.job_id),)] == ROUNDS + 1
    assert m["perseus_job_iterations_total", (("job_id", job.job_id),)] == ROUNDS
    # The cumulative counters, recomputed here from what the simulated ranks reported: every
    # GPU's energy, and per round (one iteration each) its energy against the latest
    # all-max round's, from the first all-max round on.
    total = math.fsum(e for results in job.results for r in results for e in r.iter_energy)
    saved = overspent = 0.0
    base = None
    for kind, results in zip(want["kinds"], job.results, strict=True):
        energy = figures(results)[1]
        if kind == "all-max":
            base = energy
        if base is not None:
            saved += max(0.0, base - energy)
            overspent += max(0.0, energy - base)
    job_label = (("job_id", job.job_id),)
    assert m["perseus_energy_joules_total", job_label] == pytest.approx(total, rel=1e-12)
    assert m["perseus_energy_saved_joules_total", job_label] == pytest.approx(saved, rel=1e-9)
    assert m["perseus_energy_overspent_joules_total", job_label] == pytest.approx(
        overspent, rel=1e-9, abs=1e-9
    )
    assert saved > 0  # the deployed rounds saved energy
    assert m["perseus_job_state", (("job_id", job.job_id), ("state", "running"))] == 1
    assert m["perseus_job_state", (("job_id", job.job_id), ("state", "finished"))] == 0
    assert m["perseus_build_info", (("python", platform.python_version()), ("version", m_version()))] == 1
    assert not [name for name, _ in m if name.endswith("_created")]

    def requests(route: str, method: str) -> float:
        return m[
            "perseus_http_requests_total", (("method", method), ("route", route), ("status", "200"))
        ]

    assert requests("/register_job", "POST") == 1
    assert requests("/register_rank/{job_id}", "POST") == world
    assert requests("/schedule/{job_id}", "GET") == world * (ROUNDS + 1)
    assert requests("/result/{job_id}", "POST") == world * ROUNDS
    # The gauges of each kind are its latest round's; the saving is the medians'.
    for which, key in (("all-max", "latest_all_max"), ("deployed", "latest_deployed")):
        t, e = want[key]
        labels = (("job_id", job.job_id), ("which", which))
        assert m["perseus_job_energy_per_iteration_joules", labels] == pytest.approx(e, rel=1e-9)
        assert m["perseus_job_time_per_iteration_seconds", labels] == pytest.approx(t, rel=1e-9)
    for source in ("measured", "predicted"):
        labels = (("job_id", job.job_id), ("source", source))
        got = m["perseus_job_energy_saving_ratio", labels]
        assert got == pytest.approx(want[f"{source}_saving"], rel=1e-9)
        assert m["perseus_job_slowdown_ratio", labels] == pytest.approx(
            want[f"{source}_slowdown"], rel=1e-9
        )


def test_report_cli_reads_the_same_numbers_from_the_dump_and_plots(ran):
    url, job, tmp = ran
    want = expected(job, tmp)
    job_dir = tmp / "dump" / job.job_id
    result = CliRunner().invoke(cli_app, ["report", str(job_dir), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["job_id"] == job.job_id
    for key in ("measured_all_max", "measured_deployed", "predicted_all_max", "predicted_deployed"):
        t, e = want[key]
        assert body[key] == pytest.approx({"iteration_time_s": t, "energy_j": e}, rel=1e-9), key
    assert body["measured_saving"] == pytest.approx(want["measured_saving"], rel=1e-9)
    assert body["predicted_saving"] == pytest.approx(want["predicted_saving"], rel=1e-9)
    png = job_dir / "energy_report.png"
    assert body["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The coordinator's view of the same job agrees with the dump's.
    served = httpx.get(f"{url}/jobs/{job.job_id}").json()["energy"]
    for key in ("measured_all_max", "measured_deployed", "measured_saving", "predicted_saving"):
        assert body[key] == pytest.approx(served[key], rel=1e-12), key


def test_report_cli_table_and_clear_errors(ran, tmp_path):
    _, job, tmp = ran
    job_dir = tmp / "dump" / job.job_id
    out = tmp_path / "r.png"
    result = CliRunner().invoke(cli_app, ["report", str(job_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "Energy saving: measured +" in result.output
    assert out.is_file()
    # Not a job's dump: exit 2 with a message, no traceback.
    result = CliRunner().invoke(cli_app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not a job's dump" in result.output
    # A malformed file is named.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "job.json").write_text((job_dir / "job.json").read_text())
    (bad / "0.sched.json").write_text((job_dir / "0.sched.json").read_text())
    (bad / "0.prof.json").write_text('[{"rank": "x"}]')
    result = CliRunner().invoke(cli_app, ["report", str(bad)])
    assert result.exit_code == 2, result.output
    assert "0.prof.json is malformed" in result.output
    assert "Traceback" not in result.output


def test_report_says_when_the_plan_rests_on_estimated_energies(ran, tmp_path):
    """The job's profile with its rows marked estimated (as the online profiler marks them
    on GPUs whose energy counter refreshes): the report says so, table and JSON."""
    from perseus.io.profile_csv import read_profile_rows, write_profile_rows

    _, job, tmp = ran
    job_dir = tmp / "dump" / job.job_id
    rows = read_profile_rows(tmp / "truth.csv")
    estimated = tmp_path / "estimated.csv"
    write_profile_rows(
        estimated, [r._replace(estimated=True, energy_se=0.01 * r.energy) for r in rows]
    )
    args = ["report", str(job_dir), "--profile", str(estimated), "--out", str(tmp_path / "r.png")]
    result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"{len(rows)} of {len(rows)} profile options have energies estimated" in text
    assert "median 1.00 %" in text
    result = CliRunner().invoke(cli_app, [*args[:4], "--json", "--out", str(tmp_path / "j.png")])
    assert "estimated from aggregate readings" in json.loads(result.output)["profile_estimates"]
    result = CliRunner().invoke(cli_app, ["report", str(job_dir), "--json"])
    assert "profile_estimates" not in json.loads(result.output)  # measured rows: no note
