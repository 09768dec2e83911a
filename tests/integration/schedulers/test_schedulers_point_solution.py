"""PointSolution runs exactly a plan file's frequencies; a plan that does not fit is a 400."""

from __future__ import annotations

import httpx
import pytest
from server_fixtures import F_MAX, FREQS, GroundTruth, SimulatedJob, running_server, stage_freqs

from perseus.domain.plan import Plan
from perseus.domain.schedule import make_schedule
from perseus.io.plan_file import save_plan
from perseus.settings import PerseusSettings

M = 3


def varied_plan(num_stages: int, *, bad_freq: int | None = None, num_microbatches: int = M) -> Plan:
    """Every instruction of the plan gets its own frequency (stage, position dependent)."""
    kinds = make_schedule("1f1b", num_stages, num_microbatches).kinds()
    levels = FREQS[::5][:9]  # 1410, 1335, … 810 MHz
    freqs = [
        [(k, levels[(s + i) % len(levels)]) for i, k in enumerate(ks)] for s, ks in enumerate(kinds)
    ]
    if bad_freq is not None:
        freqs[-1][0] = (freqs[-1][0][0], bad_freq)
    return Plan(
        schedule="1f1b",
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        p2p_power=70.0,
        iteration_time=1.0,
        energy=1.0,
        frequencies=freqs,
    )


def settings(path, **args) -> PerseusSettings:
    return PerseusSettings(
        scheduler="PointSolution", scheduler_args={"solution_path": str(path), **args}
    )


def test_every_rank_runs_exactly_its_stages_planned_frequencies(tmp_path):
    plan = varied_plan(3)
    save_plan(plan, tmp_path / "plan.json")
    with running_server(settings(tmp_path / "plan.json")) as url:
        job = SimulatedJob(url, GroundTruth([0.01] * 3), pp=3, dp=2, num_microbatches=M)
        history = job.run_sync(2)
    for schedules in history:
        for info in job.infos:
            assert schedules[info.rank].frequencies == plan.frequencies[info.pp_rank]
    assert len(set(stage_freqs(history[0], 0))) > 1


def first_error(url: str, pp: int) -> httpx.Response:
    job = SimulatedJob(url, GroundTruth([0.01] * pp), pp=pp, num_microbatches=M)
    with pytest.raises(httpx.HTTPStatusError) as info:
        job.run_sync(1)
    return info.value.response


@pytest.mark.parametrize(
    ("plan", "args", "message"),
    [
        (varied_plan(3), {}, "3 stage(s) but job"),
        (varied_plan(2, bad_freq=1234), {}, "[1234] MHz are not available on rank 1"),
        (varied_plan(2), {"num_microbatches": 5}, "num_microbatches=5"),
        ("import os; os.system('echo pwned')", {}, "not valid JSON"),
        ('{"version": 1, "schedule": "1f1b"}', {}, "is invalid"),
    ],
)
def test_a_plan_that_does_not_fit_the_job_is_a_400_naming_the_problem(
    tmp_path, plan, args, message
):
    path = tmp_path / "plan.json"
    if isinstance(plan, Plan):
        save_plan(plan, path)
    else:
        path.write_text(plan)
    with running_server(settings(path, **args)) as url:
        r = first_error(url, 2)
    assert r.status_code == 400
    assert message in r.json()["detail"]


def zeus_literal(num_stages: int) -> str:
    """`varied_plan`'s clocks as Zeus / lowtime write them: a Python literal of tuples."""
    return repr([[tuple(e) for e in entries] for entries in varied_plan(num_stages).frequencies])


def test_a_zeus_style_literal_plan_runs_on_the_jobs_pipeline(tmp_path):
    path = tmp_path / "freqs.py"
    path.write_text(f"# lowtime output\n{zeus_literal(3)}\n")
    with running_server(settings(path, num_microbatches=M)) as url:
        job = SimulatedJob(url, GroundTruth([0.01] * 3), pp=3, dp=2, num_microbatches=M)
        history = job.run_sync(2)
    expected = varied_plan(3).frequencies
    for schedules in history:
        for info in job.infos:
            assert schedules[info.rank].frequencies == expected[info.pp_rank]


@pytest.mark.parametrize(
    ("text", "args", "message"),
    [
        (zeus_literal(2), {}, "not the pipeline they are for"),
        (zeus_literal(3), {"num_microbatches": M}, "clocks for 3 pipeline rank(s)"),
        (zeus_literal(2), {"num_microbatches": M + 1}, "runs 8 instruction(s) there"),
        (
            zeus_literal(2).replace(f"'forward', {F_MAX}", f"'backward', {F_MAX}", 1),
            {"num_microbatches": M},
            "instruction #0 is 'backward'",
        ),
        ("[[('forward', True)]]", {"num_microbatches": M}, "valid integer"),
        ("[[('fwd', 1500)]]", {"num_microbatches": M}, "not an instruction kind"),
        ("__import__('os').system('echo pwned')", {"num_microbatches": M}, "not valid JSON"),
        ("[" * 100_000, {"num_microbatches": M}, "nests too deeply"),
    ],
    ids=["no-pipeline", "ranks", "count", "kind", "bool", "name", "code", "deep"],
)
def test_a_literal_plan_that_does_not_fit_is_a_400_naming_the_problem(
    tmp_path, text, args, message
):
    path = tmp_path / "freqs.py"
    path.write_text(text)
    with running_server(settings(path, **args)) as url:
        r = first_error(url, 2)
    assert r.status_code == 400
    assert message in r.json()["detail"], r.json()["detail"]
