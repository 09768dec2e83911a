"""The per-rank hook against a real coordinator (a one-rank job in this process).

The coordinator is a real server process on loopback; the process group is a one-rank
gloo group; the GPU is an `EmulatedGPU` in nominal mode (exact instruction times) with
uniform kinds (every kind compute-bound: nominal × f_max / f) and its default, real sensors.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from paths import require_module
from server_fixtures import single_rank_layout

from perseus.client import EmulationSettings, PerseusOptimizer
from perseus.demo import Coordinator
from perseus.domain.plan import Plan
from perseus.domain.schedule import make_schedule
from perseus.errors import (
    ConfigurationError,
    CoordinatorError,
    DeviceError,
    RankError,
    ScheduleError,
)
from perseus.io.plan_file import save_plan
from perseus.protocol import ParallelLayout
from zeus_power.device.base import GPUPermissionError
from zeus_power.device.emulated import EmulatedGPU

dist = require_module("torch.distributed")

NOMINAL = {"forward": 0.005, "backward": 0.01}
ORDER = ["forward", "backward", "forward", "backward"]  # 1F1B, one stage, 2 microbatches


@pytest.fixture(scope="module")
def all_max(tmp_path_factory, process_group):
    tmp = tmp_path_factory.mktemp("allmax")
    with Coordinator(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": 2},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true"},
    ) as coordinator:
        yield coordinator


@pytest.fixture(scope="module")
def point(tmp_path_factory, process_group):
    tmp = tmp_path_factory.mktemp("point")
    schedule = make_schedule("1f1b", 1, 2)
    plan = Plan(
        schedule="1f1b",
        num_stages=1,
        num_microbatches=2,
        p2p_power=55.0,
        iteration_time=1.0,
        energy=1.0,
        frequencies=[
            [(i.kind, f) for i, f in zip(schedule.orders[0], [1005, 705, 1200, 1005], strict=True)]
        ],
    )
    save_plan(plan, tmp / "plan.json")
    with Coordinator(
        scheduler="PointSolution",
        scheduler_args={"solution_path": str(tmp / "plan.json")},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
    ) as coordinator:
        yield coordinator


def _hook(coordinator, gpu=None, **kwargs):
    return PerseusOptimizer(
        **single_rank_layout(server_url=coordinator.url),
        job_metadata="client-test",
        gpu=gpu or EmulatedGPU(0),
        emulation=EmulationSettings(nominal=True, kinds="uniform"),
        nominal_time_s=NOMINAL,
        **kwargs,
    )


def _step(hook, names=ORDER):
    hook.on_step_begin()
    for name in names:
        hook.on_instruction_begin(name)
        hook.on_instruction_end(name)
    hook.on_step_end()


def test_a_round_is_reported_as_one_profiling_result(all_max, tmp_path):
    with _hook(all_max, steps_per_round=2, trace_dir=tmp_path) as hook:
        _step(hook)
        _step(hook)
        job_dir = all_max.dump_dir / hook.job_id
        _step(hook)  # the next round's GET makes the coordinator observe (and dump) round 0
    assert hook.job_id.endswith("+client-test")
    assert hook.timing == "sync"  # auto: an emulated GPU runs no CUDA events
    dump = job_dir / "0.prof.json"
    deadline = time.monotonic() + 10
    while not dump.exists():  # the coordinator writes its dumps in the background
        assert time.monotonic() < deadline, f"{dump} was never written"
        time.sleep(0.05)
    result = json.loads(dump.read_text())[0]
    assert result["rank"] == 0 and len(result["iter_time"]) == len(result["iter_energy"]) == 2
    for name in ("forward", "backward"):
        for it, (times, energies) in enumerate(
            zip(result["time_breakdown"][name], result["energy_breakdown"][name], strict=True)
        ):
            assert times == pytest.approx([NOMINAL[name]] * 2)  # exact at the max clock
            # An instruction's energy cannot be read: its share of the iteration's by time.
            power_w = result["iter_energy"][it] / result["iter_time"][it]
            assert energies == pytest.approx([t * power_w for t in times])
    assert all(t >= 2 * sum(NOMINAL.values()) for t in result["iter_time"])
    assert isinstance(result["energy_windows"], list)  # 60 ms: maybe no refresh inside
    # The rank registered its GPU as emulated: the coordinator knows its numbers are a model's;
    # and the period it measured its energy counter refreshing at (100 ms by default).
    (info,) = json.loads((job_dir / "ranks.json").read_text())
    assert info["emulated"] is True
    assert info["energy_refresh_s"] == pytest.approx(0.1, abs=0.01)
    # Its GPU's power limit (an A100's 400 W) and its idle power, measured at start (55 W).
    assert info["power_limit_w"] == 400.0
    assert info["idle_power_w"] == pytest.approx(EmulatedGPU(0).idle_power_w, rel=0.04)
    trace = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    assert trace[0] == {
        "kind": "job",
        "job_id": hook.job_id,
        "rank": 0,
        "leader": 0,  # one rank: it leads itself
        "dp_rank": 0,
        "pp_rank": 0,
        "tp_rank": 0,
        "emulated": True,
    }
    assert [r["round"] for r in trace if r["kind"] == "step"] == [0, 0, 1]


def test_the_hook_opens_an_emulated_gpu_only_when_asked_for(all_max, monkeypatch):
    """With ZEUS_GPU_BACKEND=emulated (the opt-in; tests/conftest.py sets it) the hook opens
    its own emulated GPU and registers it as such."""
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "emulated")
    with PerseusOptimizer(
        **single_rank_layout(server_url=all_max.url),
        emulation=EmulationSettings(nominal=True),
        nominal_time_s=NOMINAL,
    ) as hook:
        assert isinstance(hook.gpu, EmulatedGPU) and hook.gpu.emulated and hook.emulated
        _step(hook)


def test_the_plan_is_applied_per_instruction_and_clocks_are_restored(point):
    gpu = EmulatedGPU(0)
    seen = []
    with _hook(point, gpu=gpu) as hook:
        hook.on_step_begin()
        for name in ORDER:
            hook.on_instruction_begin(name)
            start = time.perf_counter()
            hook.on_instruction_end(name)
            seen.append((gpu.current_sm_clock_mhz(), time.perf_counter() - start))
        hook.on_step_end()
        assert gpu.current_sm_clock_mhz() == 1005
    assert [f for f, _ in seen] == [1005, 705, 1200, 1005]
    # Lower clocks really take longer: nominal × f_max / f.
    for (freq, took), name in zip(seen, ORDER, strict=True):
        assert took >= NOMINAL[name] * 1410 / freq * 0.99
    assert gpu.current_sm_clock_mhz() == gpu.spec.max_sm_clock_mhz  # reset on exit


def test_an_instruction_out_of_schedule_is_a_clear_error(all_max):
    with _hook(all_max) as hook:
        hook.on_step_begin()
        hook.on_instruction_begin("forward")
        hook.on_instruction_end("forward")
        with pytest.raises(
            ScheduleError,
            match=r"executed 'forward' as instruction #1 but the schedule says 'backward'",
        ):
            hook.on_instruction_begin("forward")


def test_too_few_or_too_many_instructions_are_clear_errors(all_max):
    with _hook(all_max) as hook:
        hook.on_step_begin()
        for name in ORDER[:3]:
            hook.on_instruction_begin(name)
            hook.on_instruction_end(name)
        with pytest.raises(
            ScheduleError, match="executed 3 instruction\\(s\\) but the schedule has 4"
        ):
            hook.on_step_end()
    with _hook(all_max) as hook:
        hook.on_step_begin()
        for name in ORDER:
            hook.on_instruction_begin(name)
            hook.on_instruction_end(name)
        with pytest.raises(
            ScheduleError, match="instruction #4 \\('forward'\\) exceeds the schedule"
        ):
            hook.on_instruction_begin("forward")


def test_a_schedule_that_does_not_fit_the_stage_is_rejected_on_arrival(all_max):
    with (
        _hook(all_max, expected_instructions=ORDER * 2) as hook,
        pytest.raises(
            ScheduleError,
            match="the schedule has 4 instruction\\(s\\) per iteration but this stage executes 8",
        ),
    ):
        hook.on_step_begin()


def test_calls_out_of_order_are_rank_errors(all_max):
    with _hook(all_max) as hook:
        with pytest.raises(
            RankError,
            match="on_instruction_begin\\(\\) called waiting for the next round's schedule",
        ):
            hook.on_instruction_begin("forward")
        hook.on_step_begin()
        with pytest.raises(RankError, match="on_step_begin\\(\\) called inside a step"):
            hook.on_step_begin()
    with pytest.raises(RankError, match="closed"):
        hook.on_step_begin()


def test_straggler_announcements_are_checked_and_forwarded(all_max):
    with _hook(all_max) as hook:
        with pytest.raises(ConfigurationError, match="dp_rank=3 must be in \\[0, 1\\)"):
            hook.announce_straggler(3, 1.2)
        with pytest.raises(ConfigurationError, match=r"slowdown=0\.5 must be a number >= 1\.0"):
            hook.announce_straggler(0, 0.5)
        # AllMaxFrequency has no straggler handling: the coordinator says so (400).
        with pytest.raises(
            CoordinatorError, match=f"coordinator at {all_max.url}/straggler/.* answered 400"
        ) as info:
            hook.announce_straggler(0, 1.2)
        assert info.value.status_code == 400


def test_a_gpu_error_reaches_the_training_loop_and_is_not_masked_on_exit(point):
    """As a `PerseusError` (`DeviceError`), the device layer's error its cause."""
    gpu = EmulatedGPU(0, privileged=False)
    with (
        pytest.raises(DeviceError, match="Locking SM clocks needs root") as err,
        _hook(point, gpu=gpu) as hook,
    ):
        hook.on_step_begin()
        hook.on_instruction_begin("forward")
        hook.on_instruction_end("forward")  # the emulator waits for the clock: the error
    assert isinstance(err.value.__cause__, GPUPermissionError)


def test_the_hook_logs_the_schedule_it_deploys(point, caplog):
    caplog.set_level(logging.DEBUG, logger="perseus.client.hook")  # per-GPU lines
    with _hook(point) as hook:
        _step(hook)
        _step(hook)  # the same plan a second round: deployed
    assert (
        "Rank 0: deployed since round 0: 4 instructions, 705–1200 MHz (mean 979)" in caplog.messages
    )


def test_a_validated_layout_builds_the_hook_and_connect_can_wait(all_max):
    """`from_layout` takes a `ParallelLayout` instead of Zeus's nine integers; with
    ``connect=False`` nothing talks to the coordinator until `connect()`."""
    hook = PerseusOptimizer.from_layout(
        ParallelLayout(dp_degree=1, pp_degree=1, tp_degree=1),
        rank=0,
        device_id=0,
        server_url=all_max.url,
        job_metadata="layout",
        gpu=EmulatedGPU(0),
        emulation=EmulationSettings(nominal=True, kinds="uniform"),
        nominal_time_s=NOMINAL,
        connect=False,
    )
    assert (hook.world_size, hook.pp_degree, hook.place.layout.world_size) == (1, 1, 1)
    with pytest.raises(RankError, match=r"on_step_begin\(\) called before connect\(\)"):
        hook.on_step_begin()
    with hook:
        hook.connect()
        assert hook.job_id.endswith("+layout")
        _step(hook)
        with pytest.raises(RankError, match="connect"):
            hook.connect()  # once
    assert hook.finish_report is not None and hook.finish_report.iterations_measured >= 0
    with pytest.raises(ConfigurationError, match=r"pp_rank=1 must be in \[0, 1\)"):
        PerseusOptimizer.from_layout(
            ParallelLayout(1, 1, 1), rank=0, pp_rank=1, device_id=0, server_url=all_max.url
        )
