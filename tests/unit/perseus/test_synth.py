"""Profile synthesis, the `perseus profile synth` command, and the shipped profiles."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from perseus import profiles
from perseus.cli.profile import app
from perseus.domain.profile import InstructionProfile
from perseus.errors import ConfigurationError, ProfileError
from perseus.io.profile_csv import load_profile
from perseus.synth import (
    COLUMNS,
    MODEL_PRESETS,
    fit_stage_workloads,
    stage_workloads,
    synthesize_profile,
)
from zeus_power.device.base import GPUValueError
from zeus_power.device.emulated import DVFSModel, Workload

README = Path(profiles.__file__).with_name("README.md")


def test_table_layout_and_model_agreement():
    pairs = [
        (Workload(0.05, 0.02), Workload(0.1, 0.04)),
        (Workload(0.03, 0.01), Workload(0.06, 0.02)),
    ]
    frame = synthesize_profile("A40", pairs)
    assert list(frame.columns) == COLUMNS
    model = DVFSModel("A40")
    clocks = model.supported_sm_clocks_mhz()
    assert len(frame) == 2 * 2 * len(clocks)
    for (stage, instruction), group in frame.groupby(["stage", "instruction"]):
        assert group["frequency"].tolist() == clocks  # every clock, descending
        workload = pairs[stage][0 if instruction == "forward" else 1]
        sweep = model.sweep(workload, clocks, 300.0)
        np.testing.assert_allclose(group["time"], sweep.time_s)
        np.testing.assert_allclose(group["energy"], sweep.energy_j)


def test_work_factors_set_stage_times():
    work = [1.0, 1.3, 0.6]
    pairs = stage_workloads("H100-SXM", work, base_forward_ms=40.0, memory_fraction=0.2)
    frame = synthesize_profile("H100-SXM", pairs)
    top = frame[frame["frequency"] == 1980].set_index(["stage", "instruction"])["time"]
    for stage, factor in enumerate(work):
        assert top[stage, "forward"] == pytest.approx(0.040 * factor)
        assert top[stage, "backward"] == pytest.approx(0.080 * factor)
    # Lower clocks are slower and, down to the energy optimum, cheaper.
    stage0 = frame[(frame["stage"] == 0) & (frame["instruction"] == "forward")]
    assert stage0["time"].is_monotonic_increasing
    assert stage0["energy"].iloc[0] > stage0["energy"].min() * 1.05


def test_work_factor_form_uses_the_preset():
    frame = synthesize_profile("A40", [1.0, 0.5], preset="bloom", min_freq_mhz=855)
    assert frame["frequency"].min() == 855 and frame["frequency"].max() == 1740
    top = frame[(frame["frequency"] == 1740) & (frame["instruction"] == "forward")]
    assert top["time"].tolist() == pytest.approx([0.130, 0.065])


def test_noise_is_seeded():
    a = synthesize_profile("A100-SXM", [1.0], seed=1, noise=0.02)
    b = synthesize_profile("A100-SXM", [1.0], seed=1, noise=0.02)
    exact = synthesize_profile("A100-SXM", [1.0])
    pd.testing.assert_frame_equal(a, b)
    ratio = a["time"] / exact["time"]
    assert 0.005 < ratio.std() < 0.05
    assert not a.equals(synthesize_profile("A100-SXM", [1.0], seed=2, noise=0.02))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("A40", []), ConfigurationError, "at least one stage"),
        (("A40", [1.0, 0.0]), ConfigurationError, "stage 1 is 0.0"),
        (("A40", [1.0, float("nan")]), ConfigurationError, "stage 1"),
        (("V100", [1.0]), GPUValueError, "valid types"),
        (("A40", ["x"]), ConfigurationError, "Workload pairs"),
    ],
)
def test_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        synthesize_profile(*args)


def test_bad_options():
    with pytest.raises(ConfigurationError, match="valid presets"):
        synthesize_profile("A40", [1.0], preset="llama")
    with pytest.raises(ConfigurationError, match="noise"):
        synthesize_profile("A40", [1.0], noise=-1)


def test_fit_stage_workloads_inverts_synthesis():
    frame = synthesize_profile("A40", [1.0, 0.7], preset="gpt3")
    pairs = fit_stage_workloads(frame, "A40")
    again = synthesize_profile("A40", pairs)
    np.testing.assert_allclose(again["time"], frame["time"], rtol=0.01)
    np.testing.assert_allclose(again["energy"], frame["energy"], rtol=0.01)
    with pytest.raises(ProfileError, match=r"0\.\.S-1"):
        fit_stage_workloads(frame.assign(stage=frame["stage"] + 1), "A40")


def test_presets_are_valid():
    for name in MODEL_PRESETS:
        frame = synthesize_profile("A100-SXM", [1.0], preset=name)
        profile = InstructionProfile.from_frame(frame, source=name)
        fwd, bwd = profile.options(0, "forward"), profile.options(0, "backward")
        assert profile.num_stages == 1
        # The backward does more work than the forward at every clock.
        assert (bwd.time_s > fwd.time_s).all(), name
        # Energy vs clock is U-shaped: its minimum lies strictly inside the clock range.
        assert 0 < fwd.energy_j.argmin() < len(fwd) - 1, name


# ---------------------------------------------------------------- the CLI

runner = CliRunner()


def test_cli_writes_a_loadable_profile(tmp_path):
    out = tmp_path / "sub" / "p.csv"
    result = runner.invoke(
        app,
        ["synth", "--gpu", "A40", "--stages", "3", "--work", "1,1,0.6", "--base-forward-ms", "100",
         "--memory-fraction", "0.3", "--noise", "0.01", "--seed", "0", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "3 stages" in result.output
    profile = load_profile(out)
    assert profile.num_stages == 3 and profile.frequencies()[0] == 1740


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--gpu", "V100", "--stages", "2"], "valid types: A100-SXM, A40, H100-SXM"),
        (["--stages", "3", "--work", "1,1"], "--stages 3 but --work has 2"),
        (["--work", "1,-1"], "stage 1 is -1.0"),
        (["--work", "1,a"], "comma-separated"),
        ([], "Give --stages, --work"),
        (["--work", "1", "--model", "llama"], "valid presets"),
        (["--stages", "100000000"], "A profile of 100,000,000 stages needs about"),
    ],
)
def test_cli_errors_exit_2_without_traceback(tmp_path, args, match):
    out = tmp_path / "p.csv"
    result = runner.invoke(app, ["synth", *args, "--out", str(out)])
    assert result.exit_code == 2
    assert match in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("name", "match"), [("p.txt", "must end with '.csv'"), ("d.csv", "is a directory")]
)
def test_cli_out_must_be_a_csv_file(tmp_path, name, match):
    (tmp_path / "d.csv").mkdir()
    result = runner.invoke(app, ["synth", "--stages", "2", "--out", str(tmp_path / name)])
    assert result.exit_code == 2
    assert match in " ".join(result.output.split())
    assert [p.name for p in tmp_path.iterdir()] == ["d.csv"]


# ---------------------------------------------------------------- shipped profiles


def _readme_commands() -> dict[str, list[str]]:
    commands = {}
    for line in README.read_text().splitlines():
        found = re.search(r"`perseus profile (synth [^`]+)`", line)
        if found:
            argv = shlex.split(found.group(1))
            commands[Path(argv[argv.index("--out") + 1]).stem] = argv
    return commands


def test_every_shipped_profile_has_its_command():
    assert set(_readme_commands()) == set(profiles.available())
    assert {"gpt3-xl_a100_4stage", "bloom_a40_8stage", "t5_a100_4stage_imbalanced"} <= set(
        profiles.available()
    )


@pytest.mark.parametrize("name", profiles.available())
def test_shipped_profile_is_reproducible_and_valid(tmp_path, name):
    argv = _readme_commands()[name]
    out = tmp_path / f"{name}.csv"
    argv[argv.index("--out") + 1] = str(out)
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == profiles.path(name).read_bytes()
    profile = load_profile(profiles.path(name))
    frame = profile.to_frame()
    for (_, _), group in frame.groupby(["stage", "instruction"]):
        assert (
            group["time"].is_monotonic_increasing
            or group["time"].iloc[::-1].is_monotonic_decreasing
        )


def test_shipped_profiles_have_the_stated_imbalance():
    def forward_top(name):
        frame = pd.read_csv(profiles.path(name))
        fmax = frame["frequency"].max()
        rows = frame[(frame["frequency"] == fmax) & (frame["instruction"] == "forward")]
        return rows.sort_values("stage")["time"].to_numpy()

    bloom = forward_top("bloom_a40_8stage")
    assert len(bloom) == 8 and bloom[-1] == pytest.approx(0.6 * bloom[0])
    t5 = forward_top("t5_a100_4stage_imbalanced")
    np.testing.assert_allclose(t5 / t5[0], [1.0, 1.6, 0.7, 1.3])
    gpt = forward_top("gpt3-xl_a100_4stage")
    assert len(gpt) == 4 and 1.0 < gpt.max() / gpt.min() < 1.2


def test_backward_split_writes_both_halves_summing_to_the_backward():
    plain = synthesize_profile("A40", [1.0, 1.5], noise=0.02, seed=3)
    split = synthesize_profile("A40", [1.0, 1.5], noise=0.02, seed=3, backward_split=0.4)
    by = {k: g.set_index(["stage", "frequency"]) for k, g in split.groupby("instruction")}
    assert set(by) == {"forward", "backward", "backward_input", "backward_weight"}
    kept = split[split["instruction"].isin(["forward", "backward"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, plain)  # same noise draws: the split adds rows only
    for col in ("time", "energy"):
        b = by["backward"][col]
        np.testing.assert_allclose(by["backward_input"][col], 0.4 * b, rtol=1e-12)
        np.testing.assert_allclose(by["backward_weight"][col], 0.6 * b, rtol=1e-12)
    profile = InstructionProfile.from_frame(split)
    assert profile.kinds() == ["forward", "backward", "backward_input", "backward_weight"]
    for bad in (0.0, 1.0, -0.5, float("nan")):
        with pytest.raises(ConfigurationError, match="backward_split"):
            synthesize_profile("A40", [1.0], backward_split=bad)


def test_cli_split_backward_rows_serve_a_zero_bubble_solve(tmp_path):
    out = tmp_path / "zb.csv"
    result = runner.invoke(
        app, ["synth", "--gpu", "A40", "--work", "1,1.3", "--split-backward", "0.5",
              "--min-freq", "1500", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    for stage in (0, 1):
        b = profile.options(stage, "backward")
        for half in ("backward_input", "backward_weight"):
            np.testing.assert_allclose(profile.options(stage, half).time_s, b.time_s / 2, rtol=1e-6)
