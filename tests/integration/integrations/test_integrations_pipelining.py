"""`attach` against a real coordinator (server process on loopback), in this process.

The process group is a one-rank gloo group, so a pipeline is one rank holding one stage
(single-stage schedules) or two (multi-stage ones); the stages are real `PipelineStage`s of
a tiny model and the GPU an `EmulatedGPU`. What is checked: the wrapping and unwrapping, the
order check, a failed step, eval(), and every refusal.
"""

from __future__ import annotations

import json

import pytest
from paths import require_module

from perseus.client import EmulationSettings
from perseus.demo import Coordinator
from perseus.errors import ConfigurationError, ScheduleError
from perseus.integrations.pipelining import attach
from zeus_power.device.emulated import EmulatedGPU

torch = require_module("torch")
dist = require_module("torch.distributed")
from torch import nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as ts  # noqa: E402

HIDDEN = 8
M = 2


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory, process_group):
    tmp = tmp_path_factory.mktemp("attach")
    with Coordinator(
        scheduler="AllMaxFrequency",
        scheduler_args={},
        dump_dir=tmp / "dump",
        log_path=tmp / "coordinator.log",
    ) as c:
        yield c


def make(cls: type, stages: int = 1, devices: tuple[str, ...] = ("cpu",), **kwargs):  # type: ignore[no-untyped-def]
    built = []
    for index in range(stages):
        torch.manual_seed(index)
        module = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        device = torch.device(devices[index % len(devices)])
        built.append(PipelineStage(module, index, stages, device))
    single = issubclass(cls, ts.PipelineScheduleSingle)
    kwargs.setdefault("loss_fn", nn.functional.mse_loss)
    return cls(built[0] if single else built, n_microbatches=M, **kwargs)


def options(tmp_path, **extra):  # type: ignore[no-untyped-def]
    return {
        "gpu": EmulatedGPU(0),
        "emulation": EmulationSettings(stretch=False),
        "trace_dir": tmp_path,
        **extra,
    }


def batch():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    return torch.randn(2 * M, HIDDEN, generator=g), torch.randn(2 * M, HIDDEN, generator=g)


def executed(tmp_path, step: int) -> list[tuple]:
    records = [json.loads(line) for line in (tmp_path / "rank0.jsonl").read_text().splitlines()]
    return [
        (r["stage"], r["instruction"], r["microbatch"])
        for r in records
        if r["kind"] == "instruction" and r["step"] == step
    ]


@pytest.mark.parametrize(
    ("cls", "stages"),
    [(ts.ScheduleGPipe, 1), (ts.ScheduleInterleavedZeroBubble, 2), (ts.ScheduleZBVZeroBubble, 2)],
)
def test_attach_measures_each_step_and_close_unwraps(tmp_path, coordinator, cls, stages):
    schedule = make(cls, stages)
    x, y = batch()
    with attach(schedule, server_url=coordinator.url, **options(tmp_path)) as perseus:
        assert "step" in vars(schedule)
        for _ in range(2):
            schedule.step(x, target=y)
        if stages == 1:  # (torch 2.13's eval() fails with adjacent stages on one rank)
            schedule.eval(x, target=y)  # passes through: not an iteration
        assert perseus.hook.step == 2
        order = perseus.order
    assert executed(tmp_path, 0) == order == executed(tmp_path, 1)
    assert len(order) == (2 if cls is ts.ScheduleGPipe else 3) * stages * M
    # Unwrapped: instance attributes gone, the class's methods back; close is idempotent.
    assert "step" not in vars(schedule)
    for stage in schedule._stages if stages > 1 else [schedule._stage]:
        assert not {"forward_one_chunk", "backward_one_chunk"} & set(vars(stage))
    perseus.close()
    schedule.step(x, target=y)  # plain torch again


def test_an_action_out_of_torchs_order_is_a_schedule_error(tmp_path, coordinator):
    schedule = make(ts.ScheduleGPipe)
    order = schedule.pipeline_order
    order[0][0], order[0][1] = order[0][1], order[0][0]  # claim F1 runs before F0
    x, y = batch()
    with attach(schedule, server_url=coordinator.url, **options(tmp_path)) as perseus:
        with pytest.raises(ScheduleError, match=r"executed forward of stage 0, microbatch 0 "
                           r"\(torch: 0F0\) as action #0, but its pipeline_order says forward "
                           r"of stage 0, microbatch 1"):  # fmt: skip
            schedule.step(x, target=y)
        assert perseus.hook.step == 0


def test_a_failed_step_leaves_the_hook_ready_for_the_next(tmp_path, coordinator):
    calls = {"n": 0}

    def flaky_loss(out, target):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 2:  # mid-step: after the first forward's loss
            raise RuntimeError("loss exploded")
        return nn.functional.mse_loss(out, target)

    schedule = make(ts.ScheduleGPipe, loss_fn=flaky_loss)
    x, y = batch()
    with attach(schedule, server_url=coordinator.url, **options(tmp_path)) as perseus:
        with pytest.raises(RuntimeError, match="loss exploded"):
            schedule.step(x, target=y)
        schedule.step(x, target=y)
        schedule.step(x, target=y)
        assert perseus.hook.step == 2
    assert executed(tmp_path, 0)[-1] == (0, "backward", M - 1)


def test_dualpipev_with_a_custom_overlap_function_is_refused(tmp_path, coordinator):
    schedule = make(ts.ScheduleDualPipeV, 2)
    schedule.register_custom_function(ts.OVERLAP_F_B, lambda action, ctx: None)
    with pytest.raises(ConfigurationError, match="cannot each get their own clock"):
        attach(schedule, server_url=coordinator.url, **options(tmp_path))
    assert "step" not in vars(schedule)


class NoOrder(ts.PipelineScheduleSingle):
    """A user's schedule class that does not say its order."""

    def _step_microbatches(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: make(ts._ScheduleForwardOnly, loss_fn=None), "forward-only"),
        (lambda: make(ts.Schedule1F1B, loss_fn=None), "has no loss_fn"),
        (lambda: make(NoOrder), "NoOrder has no pipeline_order"),
        (lambda: object(), "needs a torch.distributed.pipelining schedule"),
    ],
    ids=["forward-only", "no-loss", "no-order", "not-a-schedule"],
)
def test_schedules_perseus_cannot_plan_are_refused(tmp_path, coordinator, build, message):
    with pytest.raises(ConfigurationError, match=message):
        attach(build(), server_url=coordinator.url, **options(tmp_path))


def test_attaching_twice_or_overriding_the_pipeline_is_refused(tmp_path, coordinator):
    schedule = make(ts.ScheduleGPipe)
    with pytest.raises(ConfigurationError, match="sets pipeline itself"):
        attach(schedule, server_url=coordinator.url, pipeline=None, **options(tmp_path))
    with (
        attach(schedule, server_url=coordinator.url, **options(tmp_path)),
        pytest.raises(ConfigurationError, match="already attached"),
    ):
        attach(schedule, server_url=coordinator.url, **options(tmp_path / "2"))


# Which GPU a rank drives. Stages "on" cuda:N are real PipelineStages built for that device
# (this CPU torch builds them; no step runs); the GPU opened is the emulated one of that index.


@pytest.mark.parametrize(
    ("devices", "local_rank", "expected"),
    [(("cuda:1",), None, 1), (("cuda:2",), "0", 2), (("cpu",), "3", 3)],
    ids=["stage-device", "stage-device-over-local-rank", "cpu-stages-local-rank"],
)
def test_the_gpu_comes_from_the_stages_else_local_rank(
    tmp_path, coordinator, monkeypatch, devices, local_rank, expected
):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    schedule = make(ts.ScheduleGPipe, devices=devices)
    opts = options(tmp_path)
    del opts["gpu"]  # attach opens the GPU itself
    with attach(schedule, server_url=coordinator.url, **opts) as perseus:
        assert perseus.hook.device_id == expected
        assert perseus.hook.gpu.index == expected


def test_without_a_cuda_stage_or_local_rank_attach_refuses_to_guess_the_gpu(
    tmp_path, coordinator, monkeypatch
):
    """SLURM and mpirun set no LOCAL_RANK: every rank of a node would have driven GPU 0."""
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    schedule = make(ts.ScheduleGPipe)
    opts = options(tmp_path)
    del opts["gpu"]
    with pytest.raises(ConfigurationError) as info:
        attach(schedule, server_url=coordinator.url, **opts)
    message = str(info.value)
    assert "cannot tell which GPU this rank drives: its stages are on ['cpu']" in message
    assert "LOCAL_RANK is not set" in message and "device_id=" in message
    assert "step" not in vars(schedule)  # nothing wrapped, nothing registered
    with attach(schedule, server_url=coordinator.url, device_id=5, **opts) as perseus:
        assert perseus.hook.device_id == 5  # the explicit argument tells it


@pytest.mark.parametrize(
    ("devices", "extra", "message"),
    [
        (("cuda:0", "cuda:1"), {}, r"stages are on GPUs \[0, 1\]: Perseus drives one GPU"),
        (("cuda:1",), {"device_id": 0}, "given GPU 0, but this rank's stages run on cuda:1"),
        (("cuda:1",), {"gpu": EmulatedGPU(0)}, "given GPU 0, but this rank's stages run on cuda:1"),
    ],
    ids=["stages-on-two-gpus", "device-id-disagrees", "gpu-disagrees"],
)
def test_a_gpu_the_stages_contradict_is_refused(tmp_path, coordinator, devices, extra, message):
    schedule = make(ts.ScheduleInterleaved1F1B if len(devices) > 1 else ts.ScheduleGPipe,
                    len(devices), devices=devices)  # fmt: skip
    opts = {**options(tmp_path), **extra}
    if "gpu" not in extra:
        del opts["gpu"]
    with pytest.raises(ConfigurationError, match=message):
        attach(schedule, server_url=coordinator.url, **opts)
