"""Profiles of pipeline (virtual) stages and split backwards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perseus.domain.profile import InstructionOptions, InstructionProfile
from perseus.errors import ProfileError
from perseus.io.profile_csv import load_profile

LONG = "rank,dp_rank,pp_rank,tp_rank,stage,instruction,frequency,time,energy\n"


def _opts(t: float) -> InstructionOptions:
    return InstructionOptions(np.array([1000, 500]), np.array([t, 2 * t]), np.array([10 * t, 6 * t]))


def test_split_backward_adds_both_halves_and_keeps_measured_ones() -> None:
    profile = InstructionProfile(
        {
            (0, "forward"): _opts(1.0),
            (0, "backward"): _opts(2.0),
            (1, "forward"): _opts(1.0),
            (1, "backward_input"): _opts(0.7),
            (1, "backward_weight"): _opts(0.9),
        }
    )
    split = profile.split_backward(0.25)
    np.testing.assert_allclose(split.options(0, "backward_input").time_s, [0.5, 1.0])
    np.testing.assert_allclose(split.options(0, "backward_weight").energy_j, [15.0, 9.0])
    assert split.options(1, "backward_input") is profile.options(1, "backward_input")
    assert not split.has(1, "backward")
    assert not profile.has(0, "backward_input")  # the original is unchanged
    for bad in (0.0, 1.0, float("inf")):
        with pytest.raises(ProfileError, match=r"in \(0, 1\)"):
            profile.split_backward(bad)


def test_a_rank_holding_two_stages_has_rows_for_each(tmp_path: Path) -> None:
    rows = "".join(
        f"{r},0,{r},0,{s},{k},1000,{0.1 * (s + 1)},{s + 1}\n"
        for s, r in ((0, 0), (1, 1), (2, 1), (3, 0))
        for k in ("forward", "backward")
    )
    path = tmp_path / "p.csv"
    path.write_text(LONG + rows)
    profile = load_profile(path)
    assert profile.num_stages == 4
    assert profile.lookup(3, "forward", 1000) == pytest.approx((0.4, 4.0))
    path.write_text(LONG + rows + "0,0,0,0,3,forward,1000,0.4,4\n")
    with pytest.raises(ProfileError, match="a second row for forward at 1000 MHz of stage 3"):
        load_profile(path)
