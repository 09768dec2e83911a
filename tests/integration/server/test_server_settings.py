"""PERSEUS_SCHEDULER switches behaviour; bad settings fail up front with a clear message."""

from __future__ import annotations

import httpx
import pytest
from server_fixtures import (
    F_MAX,
    FREQS,
    GroundTruth,
    SimulatedJob,
    running_server,
    stage_freqs,
    write_truth_profile,
)
from typer.testing import CliRunner

from perseus.cli import app as cli_app
from perseus.demo import Coordinator
from perseus.errors import ConfigurationError
from perseus.schedulers import SCHEDULERS, check_scheduler_args
from perseus.server import create_app
from perseus.settings import PerseusSettings

M = 2


def run_with_env(monkeypatch, scheduler: str, args: str, rounds: int = 3) -> SimulatedJob:
    monkeypatch.setenv("PERSEUS_SCHEDULER", scheduler)
    monkeypatch.setenv("PERSEUS_SCHEDULER_ARGS", args)
    settings = PerseusSettings()  # what `perseus serve` and create_app() read
    with running_server(settings) as url:
        job = SimulatedJob(url, GroundTruth([0.01, 0.012]), pp=2, num_microbatches=M)
        job.run_sync(rounds)
    return job


def test_switching_perseus_scheduler_switches_behaviour(monkeypatch, tmp_path):
    monkeypatch.setenv("PERSEUS_DUMP_DIR", str(tmp_path))
    all_max = run_with_env(monkeypatch, "AllMaxFrequency", '{"num_microbatches": 2}')
    profiler = run_with_env(
        monkeypatch,
        "InstructionProfiler",
        '{"num_microbatches": 2, "warmup_rounds": 0, "sweep": "full"}',
    )
    assert all(set(stage_freqs(h, 0)) == {F_MAX} for h in all_max.history)
    assert [stage_freqs(h, 0)[0] for h in profiler.history] == FREQS[:3]
    assert "AllMaxFrequency" in all_max.job_id and "InstructionProfiler" in profiler.job_id


def test_create_app_reads_the_environment(monkeypatch):
    monkeypatch.setenv("PERSEUS_SCHEDULER", "ZeusGlobal")
    monkeypatch.setenv("PERSEUS_SCHEDULER_ARGS", '{"num_microbatches": 4, "eta_knob": 0.3}')
    app = create_app()
    assert app.state.settings.scheduler == "ZeusGlobal"  # settings keep the name
    assert app.state.scheduler_cls is SCHEDULERS["ZeusGlobal"]


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("Perseus", {"num_chunks": 0}, "num_chunks: Input should be greater"),
        ("Perseus", {"num_microbatches": 0}, "num_microbatches: Input should be greater"),
        ("ZeusGlobal", {"num_microbatches": 2, "eta_knob": 2}, "eta_knob"),
        ("InstructionProfiler", {"num_microbatches": 2, "freq_stride": 2}, "It accepts:"),
        ("PointSolution", {}, "solution_path: Field required"),
        (
            "AllMaxFrequency",
            {"num_microbatches": 2, "schedule": "zigzag"},
            "Unknown pipeline schedule",
        ),
    ],
)
def test_bad_scheduler_args_are_a_configuration_error(name, args, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        check_scheduler_args(SCHEDULERS[name], args)


def test_create_app_checks_scheduler_args_up_front():
    with pytest.raises(ConfigurationError, match=r"Unknown scheduler 'Nope'\. Valid names"):
        create_app(PerseusSettings(scheduler="Nope"))
    with pytest.raises(ConfigurationError, match="Unknown pipeline schedule"):
        create_app(PerseusSettings(scheduler="EnvPipe", scheduler_args={"schedule": "zigzag"}))
    with pytest.raises(ConfigurationError, match="round_timeout_s"):
        create_app(
            PerseusSettings(scheduler="AllMaxFrequency", scheduler_args={"num_microbatches": 1}),
            round_timeout_s=0,
        )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PERSEUS_SCHEDULER": "Nope"}, "Unknown scheduler 'Nope'"),
        (
            {"PERSEUS_SCHEDULER": "Perseus", "PERSEUS_SCHEDULER_ARGS": '{"num_microbatches": 0}'},
            "num_microbatches",
        ),
        ({"PERSEUS_SCHEDULER_ARGS": "{not json"}, "PERSEUS_SCHEDULER_ARGS is not a JSON"),
        (
            {"PERSEUS_SCHEDULER": "AllMaxFrequency", "PERSEUS_SCHEDULER_ARGS": '{"x": 1}'},
            "PERSEUS_SCHEDULER_ARGS.x: not an argument of scheduler AllMaxFrequency",
        ),
        ({"PERSEUS_DUMP_KEEP_ROUNDS": "-1"}, "PERSEUS_DUMP_KEEP_ROUNDS"),
    ],
)
def test_perseus_serve_exits_2_with_a_clear_message(env, message):
    result = CliRunner().invoke(cli_app, ["serve"], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_scheduler_args_are_declared_once_and_shared():
    from perseus.schedulers.args import PipelineArgs, SchedulerArgs, SweepArgs

    assert all(issubclass(cls.Args, SchedulerArgs) for cls in SCHEDULERS.values())
    sweeping = ["InstructionProfiler", "Perseus", "EnvPipe", "ZeusGlobal", "ZeusPerStage"]
    assert all(issubclass(SCHEDULERS[n].Args, PipelineArgs) for n in [*sweeping, "AllMaxFrequency"])
    assert all(issubclass(SCHEDULERS[n].Args, SweepArgs) for n in sweeping)
    checked = check_scheduler_args(SCHEDULERS["Perseus"], {"num_microbatches": 4, "freq_step": 2})
    assert (checked.num_microbatches, checked.freq_step, checked.schedule) == (4, 2, "1f1b")


def test_perseus_serve_flags_run_the_loop(tmp_path):
    """`perseus serve --scheduler Perseus --max-slowdown 0.01` as a real process: the flags
    win over PERSEUS_SCHEDULER / PERSEUS_SCHEDULER_ARGS, what they do not set comes from the
    variable, and a job runs through profiling to a deployed plan within 1 %."""
    truth = GroundTruth([0.010, 0.016])
    profile = write_truth_profile(truth, 2, tmp_path / "truth.csv")
    with Coordinator(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": 4, "max_slowdown": 0.5},
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        serve_args=[
            "--scheduler",
            "Perseus",
            "--max-slowdown",
            "0.01",
            "--profile-path",
            str(profile),
            "--no-refine",
        ],
    ) as coordinator:
        info = httpx.get(f"{coordinator.url}/info").json()
        assert info["scheduler"] == "Perseus"
        assert info["scheduler_args"] == {
            "num_microbatches": 4,
            "max_slowdown": 0.01,
            "profile_path": "<redacted>",
            "refine": False,
        }
        job = SimulatedJob(coordinator.url, truth, pp=2, num_microbatches=4)
        # A warm-up, 4 all-max rounds (the baseline), the blocking power's own round, then
        # the plan from round 6 (its first round may be an all-max reference).
        history = job.run_sync(8)
        assert job.statuses[-1] is not None and job.statuses[-1].phase == "deployed"
        assert "+Perseus+" in job.job_id
        assert all(set(stage_freqs(history[0], r)) == {F_MAX} for r in history[0])
        assert any(set(stage_freqs(history[-1], r)) != {F_MAX} for r in history[-1])
        detail = httpx.get(f"{coordinator.url}/jobs/{job.job_id}").json()
        assert detail["deployed_plan"] is not None
        assert detail["energy"]["predicted_slowdown"] <= 0.01 + 1e-9
        assert detail["energy"]["predicted_saving"] > 0
