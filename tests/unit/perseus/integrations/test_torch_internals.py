"""The torch internals `attach` relies on: the list is pinned here, each piece is present in
the installed torch for every schedule class, and a torch without one is refused by name.

The schedules are real ones of a tiny model on a one-rank gloo group (the multi-stage
classes hold two stages on it). "A torch without a piece" is this torch with that piece
removed for the test (`monkeypatch`), which is what a rename in a later release looks like.
"""

from __future__ import annotations

import pytest
from paths import require_module

from perseus.errors import ConfigurationError
from perseus.integrations import _torch_internals as internals
from perseus.integrations.pipelining import attach

torch = require_module("torch")
require_module("torch.distributed")
from torch import nn  # noqa: E402
from torch.distributed.pipelining import PipelineStage  # noqa: E402
from torch.distributed.pipelining import schedules as ts  # noqa: E402

PINNED = [
    "torch.distributed.pipelining.schedules.PipelineScheduleSingle",
    "torch.distributed.pipelining.schedules.PipelineScheduleMulti",
    "torch.distributed.pipelining.schedules._ScheduleForwardOnly",
    "torch.distributed.pipelining.schedules._PipelineScheduleRuntime",
    "torch.distributed.pipelining.schedules._Action",
    "torch.distributed.pipelining.schedules._ComputationType",
    "_Action.stage_index",
    "_Action.computation_type",
    "_Action.microbatch_index",
    "_Action.sub_actions",
    "_ComputationType value 'F'",
    "_ComputationType value 'B'",
    "_ComputationType value 'I'",
    "_ComputationType value 'W'",
    "_ComputationType value 'OVERLAP_F_B'",
    "schedule._n_microbatches",
    "schedule._loss_fn",
    "schedule._has_backward",
    "schedule.pipeline_order or _get_pipeline_order() or get_pipeline_order()",
    "PipelineScheduleSingle._stage",
    "PipelineScheduleMulti._stages",
    "PipelineScheduleMulti._backward_requires_autograd",
    "_PipelineScheduleRuntime._comp_type_to_function_map",
    "stage.stage_index",
    "stage.num_stages",
    "stage.group_rank",
    "stage.group_size",
    "stage.device",
    "stage.forward_one_chunk(fwd_chunk_id, ...)",
    "stage.backward_one_chunk(bwd_chunk_id, loss, full_backward, ...)",
    "stage.backward_weight_one_chunk(bwd_chunk_id, ...)",
]

CLASSES = [
    (ts.ScheduleGPipe, 1),
    (ts.Schedule1F1B, 1),
    (ts.ScheduleInterleaved1F1B, 2),
    (ts.ScheduleLoopedBFS, 2),
    (ts.ScheduleInterleavedZeroBubble, 2),
    (ts.ScheduleZBVZeroBubble, 2),
    (ts.ScheduleDualPipeV, 2),
]


def make(cls: type, stages: int = 1):  # type: ignore[no-untyped-def]
    built = [
        PipelineStage(nn.Linear(4, 4), index, stages, torch.device("cpu"))
        for index in range(stages)
    ]
    single = issubclass(cls, ts.PipelineScheduleSingle)
    return cls(built[0] if single else built, n_microbatches=2, loss_fn=nn.functional.mse_loss)


def test_the_list_of_internals_is_pinned():
    assert [str(piece) for piece in internals.INTERNALS] == PINNED


def test_the_installed_torch_has_every_module_level_piece():
    assert internals.missing() == []


@pytest.mark.parametrize(("cls", "stages"), CLASSES, ids=[c.__name__ for c, _ in CLASSES])
def test_every_schedule_class_of_the_installed_torch_has_every_piece(process_group, cls, stages):
    schedule = make(cls, stages)
    view = internals.TorchSchedule.of(schedule)
    assert internals.missing(schedule, view.stages) == []
    assert len(view.stages) == stages and view.single == (stages == 1)
    assert view.n_microbatches == 2 and view.has_backward and view.backward_requires_autograd
    assert view.pipeline_order() and view.custom_function_types() == []


def test_a_torch_without_a_class_is_refused_naming_the_version_and_the_piece(
    process_group, monkeypatch
):
    schedule = make(ts.ScheduleGPipe)
    monkeypatch.delattr(ts, "_ScheduleForwardOnly")
    with pytest.raises(ConfigurationError) as info:
        attach(schedule, server_url="http://127.0.0.1:9")
    message = str(info.value)
    assert f"this torch ({torch.__version__}) does not have" in message
    assert "torch.distributed.pipelining.schedules._ScheduleForwardOnly (tells a forward-only" in (
        message
    )
    assert "verified on torch 2.13" in message
    assert "step" not in vars(schedule)  # nothing wrapped


def test_a_renamed_flag_is_refused_not_read_with_a_default(process_group):
    schedule = make(ts.ScheduleInterleaved1F1B, 2)
    vars(schedule)["_n_mb"] = vars(schedule).pop("_has_backward")  # a rename in torch
    with pytest.raises(ConfigurationError, match=r"for its ScheduleInterleaved1F1B: "
                       r"schedule\._has_backward \(whether a step runs backward\)"):  # fmt: skip
        attach(schedule, server_url="http://127.0.0.1:9")


def test_a_changed_stage_method_signature_is_refused(process_group, monkeypatch):
    def backward_one_chunk(self, bwd_chunk_id, full_backward=True, loss=None):  # type: ignore[no-untyped-def]
        raise AssertionError("never called")

    monkeypatch.setattr(PipelineStage, "backward_one_chunk", backward_one_chunk)
    with pytest.raises(ConfigurationError, match=r"stages of its ScheduleGPipe: stage\."
                       r"backward_one_chunk\(bwd_chunk_id, loss, full_backward, \.\.\.\)"):  # fmt: skip
        attach(make(ts.ScheduleGPipe), server_url="http://127.0.0.1:9")
