"""The exact accounting (through `perseus.planning`), plan files, and profile validation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from perseus.domain.plan import Plan
from perseus.domain.profile import InstructionProfile
from perseus.domain.schedule import make_schedule
from perseus.errors import PlanError, ProfileError, ScheduleError
from perseus.io.plan_file import load_plan, save_plan
from perseus.io.profile_csv import load_profile
from perseus.planning import evaluate, evaluate_plan, make_plan, max_frequencies


def _profile() -> InstructionProfile:
    rows = []
    for stage, scale in ((0, 1.0), (1, 2.0)):
        for kind, base in (("forward", 1.0), ("backward", 2.0)):
            rows += [
                (stage, kind, 1000, base * scale, 10 * base * scale),
                (stage, kind, 500, 2 * base * scale, 6 * base * scale),
            ]
    return InstructionProfile.from_frame(
        pd.DataFrame(rows, columns=["stage", "instruction", "frequency", "time", "energy"])
    )


def test_evaluate_by_hand() -> None:
    # S=2, M=1, 1F1B: F@s0 (1) → F@s1 (2) → B@s1 (4) → B@s0 (2): T = 9 at max frequency.
    prof, sched = _profile(), make_schedule("1f1b", 2, 1)
    ev = evaluate(prof, sched, max_frequencies(prof, sched), p2p_power_w=5.0)
    assert ev.iteration_time_s == pytest.approx(9.0)
    assert ev.compute_energy_j == pytest.approx(10 + 20 + 40 + 20)
    # Each stage is busy 3 resp. 6 of the 9 s → blocked 6 + 3 = 9 s at 5 W.
    assert ev.blocking_energy_j == pytest.approx(45.0)
    assert ev.energy_j == pytest.approx(135.0)
    # Slowing stage 0's forward to 500 MHz adds 1 s to the critical path.
    slow = evaluate(prof, sched, [[500, 1000], [1000, 1000]], p2p_power_w=5.0)
    assert slow.iteration_time_s == pytest.approx(10.0)
    assert slow.compute_energy_j == pytest.approx(6 + 20 + 40 + 20)


def test_plan_file_round_trip_and_format(tmp_path: Path) -> None:
    prof, sched = _profile(), make_schedule("1f1b", 2, 2)
    freqs = max_frequencies(prof, sched)
    ev = evaluate(prof, sched, freqs, 5.0)
    plan = Plan.from_frequencies(sched, freqs, p2p_power_w=5.0, evaluation=ev)
    save_plan(plan, tmp_path / "p.json")
    raw = json.loads((tmp_path / "p.json").read_text())
    assert raw["frequencies"][0] == [
        ["forward", 1000],
        ["forward", 1000],
        ["backward", 1000],
        ["backward", 1000],
    ]
    assert raw["schedule"] == "1f1b" and raw["num_stages"] == 2 and raw["num_microbatches"] == 2
    loaded = load_plan(tmp_path / "p.json")
    assert loaded == plan
    assert evaluate_plan(prof, loaded) == ev


def test_plans_from_emulated_profiles_say_so_and_real_plan_files_are_unchanged(
    tmp_path: Path,
) -> None:
    prof, sched = _profile(), make_schedule("1f1b", 2, 2)
    freqs = max_frequencies(prof, sched)
    real = make_plan(prof, sched, freqs, 5.0)
    save_plan(real, tmp_path / "real.json")
    assert "emulated" not in json.loads((tmp_path / "real.json").read_text())  # as before
    assert load_plan(tmp_path / "real.json").emulated is False
    prof.emulated = True  # as `from_rows` sets it for rows measured on emulated GPUs
    plan = make_plan(prof, sched, freqs, 5.0)
    save_plan(plan, tmp_path / "emulated.json")
    assert json.loads((tmp_path / "emulated.json").read_text())["emulated"] is True
    assert load_plan(tmp_path / "emulated.json") == plan and plan.emulated


def _write_plan(tmp_path: Path, **changes: object) -> Path:
    prof, sched = _profile(), make_schedule("1f1b", 2, 2)
    freqs = max_frequencies(prof, sched)
    plan = Plan.from_frequencies(
        sched, freqs, p2p_power_w=5.0, evaluation=evaluate(prof, sched, freqs, 5.0)
    )
    data = json.loads(plan.model_dump_json()) | changes
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


def test_plan_with_wrong_instruction_count(tmp_path: Path) -> None:
    path = _write_plan(tmp_path, frequencies=[[["forward", 1000]], [["forward", 1000]]])
    with pytest.raises(PlanError, match="Stage 0: the plan has 1 instruction"):
        evaluate_plan(_profile(), load_plan(path))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"num_microbatches": 10**9},
            "1f1b schedule with 1000000000 microbatch(es) has 2000000000",
        ),
        ({"num_stages": 10**8}, "lists 2 stage(s) but says num_stages=100000000"),
        (
            {"schedule": "interleaved", "num_chunks": 2},
            "interleaved schedule with 2 microbatch(es) has 8",
        ),
    ],
)
def test_plan_counts_are_checked_before_the_schedule_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: dict, message: str
) -> None:
    # A corrupt size must not lay out a DAG of a billion nodes before it is found out.
    path = _write_plan(tmp_path, **changes)

    def no_schedule(*args: object, **kwargs: object) -> None:
        raise AssertionError("the schedule was built before the counts were checked")

    monkeypatch.setattr("perseus.domain.plan.make_schedule", no_schedule)
    with pytest.raises(PlanError, match=re.escape(message)):
        load_plan(path).pipeline_schedule()


def test_plan_with_unprofiled_frequency(tmp_path: Path) -> None:
    path = _write_plan(tmp_path)
    data = json.loads(path.read_text())
    data["frequencies"][1][2][1] = 777
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="777 MHz is not in the profile"):
        evaluate_plan(_profile(), load_plan(path))


def test_plan_with_wrong_instruction_name(tmp_path: Path) -> None:
    path = _write_plan(tmp_path)
    data = json.loads(path.read_text())
    data["frequencies"][0][0][0] = "backward"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="runs 'forward' there"):
        evaluate_plan(_profile(), load_plan(path))


def test_plan_file_not_json_or_python(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text("frequencies = [[('forward', 1000)]]")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(path)
    path.write_text('{"schedule": "1f1b"}')
    with pytest.raises(PlanError, match="invalid"):
        load_plan(path)
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(PlanError, match="not UTF-8 JSON text"):
        load_plan(path)


def test_profile_stage_count_must_match_schedule() -> None:
    with pytest.raises(ScheduleError, match="profile has 2 stage"):
        evaluate(_profile(), make_schedule("1f1b", 3, 2), [[1000] * 4] * 3, 5.0)


def test_profile_missing_stage_or_instruction() -> None:
    df = _profile().to_frame()
    with pytest.raises(ProfileError, match=r"missing stage\(s\) \[1\]"):
        InstructionProfile.from_frame(df.assign(stage=df["stage"].replace({1: 2})))
    with pytest.raises(ProfileError, match="no backward rows for stage 1"):
        InstructionProfile.from_frame(df[~((df.stage == 1) & (df.instruction == "backward"))])


def test_profile_frame_with_a_repeated_measurement() -> None:
    df = _profile().to_frame()
    twice = pd.concat([df, df.iloc[[3]].assign(time=9.9)])
    with pytest.raises(ProfileError, match=r"1 repeated row.*at 500 MHz of stage 0"):
        InstructionProfile.from_frame(twice)


def test_real_profile_loads(real_profile_path: Path) -> None:
    prof = load_profile(real_profile_path)
    assert prof.num_stages == 8
    opts = prof.options(7, "backward")
    assert opts.freq_mhz[0] == 1740 and opts.freq_mhz[-1] == 855 and len(opts) == 60
