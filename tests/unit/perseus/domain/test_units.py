"""Unit sanity: implausible profile powers, slowdowns given in per cent, blocking powers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from paths import REPO
from pydantic import ValidationError

from perseus.domain.profile import InstructionProfile
from perseus.domain.units import max_slowdown_problem
from perseus.errors import ConfigurationError, ProfileError, SolverError
from perseus.io.profile_csv import load_profile
from perseus.planning import choose_index
from perseus.planning.gpu import blocking_power, gpu_of_profile
from perseus.schedulers.args import ProfileSourceArgs
from perseus.schedulers.perseus_scheduler.scheduler import PerseusArgs

A100 = REPO / "perseus" / "profiles" / "gpt3-xl_a100_4stage.csv"
A40 = REPO / "perseus" / "profiles" / "bloom_a40_8stage.csv"


def _scaled(tmp_path: Path, column: str, factor: float) -> Path:
    frame = pd.read_csv(A100)
    frame[column] = frame[column] * factor
    path = tmp_path / f"{column}.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    ("column", "mistake"),
    [("time", "times in ms instead of s?"), ("energy", "energies in mJ instead of J?")],
    ids=["ms", "mJ"],
)
def test_a_profile_in_ms_or_mj_is_refused_naming_a_row_and_the_mistake(
    tmp_path: Path, column: str, mistake: str
) -> None:
    path = _scaled(tmp_path, column, 1000.0)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert mistake in message
    assert "stage " in message and " MHz: time " in message and "implied power" in message
    with pytest.raises(ProfileError, match="instead of"):
        InstructionProfile.from_frame(pd.read_csv(path))
    # The override accepts the same numbers.
    assert load_profile(path, check_power=False).num_stages == 4
    assert InstructionProfile.from_frame(pd.read_csv(path), check_power=False).num_stages == 4


def test_shipped_profiles_are_plausible() -> None:
    for path in (REPO / "perseus" / "profiles").glob("*.csv"):
        load_profile(path)


def test_max_slowdown_above_one_is_refused_with_a_hint() -> None:
    assert max_slowdown_problem(0.05) is None and max_slowdown_problem(1.0) is None
    problem = max_slowdown_problem(5.0)
    assert problem is not None and "5 means 500 %" in problem and "pass 0.05" in problem
    with pytest.raises(SolverError, match=r"pass 0\.05"):
        choose_index([1.0, 2.0], [2.0, 1.0], max_slowdown=5.0)
    with pytest.raises(ValidationError, match=r"pass 0\.05"):
        PerseusArgs(max_slowdown=5.0)


def test_blocking_power_defaults_to_the_matched_gpu_and_refuses_out_of_range() -> None:
    a100, a40 = load_profile(A100), load_profile(A40)
    assert gpu_of_profile(a100).gpu_type == "A100-SXM"  # type: ignore[union-attr]
    assert gpu_of_profile(a40).gpu_type == "A40"  # type: ignore[union-attr]
    used = blocking_power(a100)
    assert used.watts == 83.64 and "A100-SXM" in used.reason
    assert blocking_power(a40).watts == 70.38
    assert blocking_power(a40, gpu="H100").watts == 119.0
    assert blocking_power(a40, 80.0).reason == "--p2p-power"
    with pytest.raises(ConfigurationError, match="outside A40's power range"):
        blocking_power(a40, 5000.0)
    with pytest.raises(ValidationError, match="outside"):
        ProfileSourceArgs(p2p_power=5000.0)
    assert ProfileSourceArgs(p2p_power=70.0, allow_implausible_power=True).p2p_power == 70.0
