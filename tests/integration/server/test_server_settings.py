"""PERSEUS_SCHEDULER switches behaviour; bad settings fail up front with a clear message."""

from __future__ import annotations

import pytest
import typer
from server_fixtures import F_MAX, FREQS, GroundTruth, SimulatedJob, running_server, stage_freqs
from typer.testing import CliRunner

from perseus.cli.serve import serve
from perseus.errors import ConfigurationError
from perseus.server import create_app
from perseus.settings import PerseusSettings
from schedulers import SCHEDULERS, check_scheduler_args

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
        ({"PERSEUS_SCHEDULER_ARGS": "{not json"}, "scheduler_args"),
        (
            {"PERSEUS_SCHEDULER": "AllMaxFrequency", "PERSEUS_SCHEDULER_ARGS": '{"x": 1}'},
            "Invalid scheduler_args",
        ),
        ({"PERSEUS_DUMP_KEEP_ROUNDS": "-1"}, "PERSEUS_DUMP_KEEP_ROUNDS"),
    ],
)
def test_perseus_serve_exits_2_with_a_clear_message(env, message):
    app = typer.Typer()
    app.command()(serve)
    result = CliRunner().invoke(app, [], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_scheduler_args_are_declared_once_and_shared():
    from schedulers.args import PipelineArgs, SchedulerArgs, SweepArgs

    assert all(issubclass(cls.Args, SchedulerArgs) for cls in SCHEDULERS.values())
    sweeping = ["InstructionProfiler", "Perseus", "EnvPipe", "ZeusGlobal", "ZeusPerStage"]
    assert all(issubclass(SCHEDULERS[n].Args, PipelineArgs) for n in [*sweeping, "AllMaxFrequency"])
    assert all(issubclass(SCHEDULERS[n].Args, SweepArgs) for n in sweeping)
    checked = check_scheduler_args(SCHEDULERS["Perseus"], {"num_microbatches": 4, "freq_step": 2})
    assert (checked.num_microbatches, checked.freq_step, checked.schedule) == (4, 2, "1f1b")
