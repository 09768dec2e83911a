"""The broken plans the e2e tests are shown failing on (`tests/broken_plans.py`) do break
the promise: in virtual time, on the job of `test_schedulers_guard.py`, each announces the
plan Perseus chose and runs another, and the guard measures it."""

from __future__ import annotations

import pytest
from broken_plans import NoSaving, SlowPlan

from perseus.demo.virtual import VirtualCluster, run_rounds
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.io.profile_csv import save_profile
from perseus.schedulers.base import build_scheduler
from perseus.schedulers.perseus_scheduler.scheduler import Perseus
from perseus.schedulers.registry import resolve_scheduler
from perseus.settings import PerseusSettings
from perseus.synth import stage_workloads, synthesize_profile

GPU = "A100-SXM"
WORK = [1.0, 1.6, 1.0, 1.2]


def _run(cls: type[Perseus], tmp_path) -> list[dict]:
    workloads = {}
    for stage, (fwd, bwd) in enumerate(stage_workloads(GPU, WORK, base_forward_ms=10.0)):
        workloads[stage, "forward"], workloads[stage, "backward"] = fwd, bwd
    cluster = VirtualCluster(
        make_schedule("1f1b", 4, 8), workloads, gpu_type=GPU, hop_latency_s=0.001
    )
    profile = tmp_path / "profile.csv"
    frame = synthesize_profile(GPU, stage_workloads(GPU, WORK, base_forward_ms=10.0))
    save_profile(InstructionProfile.from_frame(frame), profile)
    args = {
        "max_slowdown": 0.01,
        "profile_path": str(profile),
        "p2p_power": cluster.gpus[0].p2p_block_power_w,
    }
    settings = PerseusSettings(scheduler=cls.__name__, dump_dir=str(tmp_path))
    s = build_scheduler(cls, cluster.job_record(), cluster.rank_infos(), settings, args)
    events: list[dict] = []
    run_rounds(s, cluster, 40, on_round=lambda *_: events.extend(s.promise_events()))
    return events


def test_the_coordinator_loads_them_as_plugins():
    assert resolve_scheduler("broken_plans:SlowPlan") is SlowPlan
    assert issubclass(resolve_scheduler("broken_plans:NoSaving"), Perseus)


@pytest.mark.parametrize("cls", [SlowPlan, NoSaving])
def test_each_deploys_a_promise_it_does_not_keep_and_the_guard_falls_back(cls, tmp_path):
    events = _run(cls, tmp_path)
    kinds = [e["event"] for e in events]
    assert kinds.index("deployed") < kinds.index("fallback"), kinds
    deployed = next(e for e in events if e["event"] == "deployed")
    assert deployed["predicted_saving"] > 0.02 and deployed["predicted_slowdown"] <= 0.01
    # The guard's first measurement of the deployed plan, against the all-max rounds.
    checked = next(e for e in events if e.get("measured_slowdown") is not None)
    if cls is SlowPlan:
        assert checked["measured_slowdown"] > 0.1, checked
    else:
        assert abs(checked["measured_saving"]) < 0.01, checked
