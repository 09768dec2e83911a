"""The command line: bad input gets one clear line and exit 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from perseus.cli import app

runner = CliRunner()

GOOD = (
    "stage,instruction,frequency,time,energy\n"
    "0,forward,1000,1.0,10\n0,forward,500,2.0,6\n0,backward,1000,2.0,20\n0,backward,500,4.0,12\n"
    "1,forward,1000,2.0,20\n1,forward,500,4.0,12\n1,backward,1000,4.0,40\n1,backward,500,8.0,24\n"
)


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def _stdout(*args: str) -> tuple[int, str]:
    """Exit status and stdout alone (what `$(perseus ...)` captures)."""
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout


def _profile(tmp_path: Path, text: str = GOOD) -> Path:
    path = tmp_path / "profile.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("energy\n", "joules\n", 1), "lacks column(s) energy"),
        (
            GOOD.replace("0,forward,500,2.0,6", "0,forward,500,nan,6"),
            "time must be a positive number",
        ),
        (
            GOOD.replace("0,forward,500,2.0,6", "0,forward,500,-2.0,6"),
            "time must be a positive number",
        ),
        (GOOD.replace("1,", "2,"), "missing stage(s) [1]"),
        (
            "\n".join(line for line in GOOD.splitlines() if not line.startswith("1,backward"))
            + "\n",
            "no backward rows for stage 1",
        ),
    ],
    ids=["missing-column", "nan-time", "negative-time", "missing-stage", "missing-instruction"],
)
def test_solve_rejects_bad_profiles(tmp_path: Path, text: str, message: str) -> None:
    code, out = _run(
        "solve", _profile(tmp_path, text), "--microbatches", "2", "--out", tmp_path / "o"
    )
    assert code == 2, out
    assert message in " ".join(out.split()), out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "0", "--microbatches", "2"], "stages must be at least 1"),
        (["--microbatches", "0"], "microbatches must be at least 1"),
        (["--stages", "3", "--microbatches", "2"], "profile has 2 stage(s)"),
        (["--microbatches", "2", "--schedule", "zigzag"], "Unknown pipeline schedule"),
    ],
)
def test_solve_rejects_bad_parameters(tmp_path: Path, args: list[str], message: str) -> None:
    code, out = _run("solve", _profile(tmp_path), *args, "--out", tmp_path / "o")
    assert code == 2, out
    assert message in " ".join(out.split()), out
    assert not (tmp_path / "o").exists()


def test_missing_profile_names_shipped_ones(tmp_path: Path) -> None:
    code, out = _run("solve", tmp_path / "nope.csv", "--microbatches", "2", "--out", tmp_path / "o")
    assert code == 2 and "neither a file nor a shipped profile" in " ".join(out.split())


def _plan(tmp_path: Path) -> Path:
    plan = {
        "schedule": "1f1b",
        "num_stages": 2,
        "num_microbatches": 1,
        "p2p_power": 5.0,
        "iteration_time": 9.0,
        "energy": 135.0,
        "frequencies": [
            [["forward", 1000], ["backward", 1000]],
            [["forward", 1000], ["backward", 1000]],
        ],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def test_evaluate_prints_exact_numbers(tmp_path: Path) -> None:
    code, out = _run("evaluate", _profile(tmp_path), _plan(tmp_path))
    assert code == 0, out
    data = json.loads(out)
    assert data["iteration_time"] == pytest.approx(9.0)
    assert data["energy"] == pytest.approx(135.0)


def test_evaluate_rejects_bad_plans(tmp_path: Path) -> None:
    path = _plan(tmp_path)
    data = json.loads(path.read_text())
    data["frequencies"][0] = [["forward", 1000]]
    path.write_text(json.dumps(data))
    code, out = _run("evaluate", _profile(tmp_path), path)
    assert code == 2 and "Stage 0: the plan has 1 instruction(s)" in " ".join(out.split())
    data["frequencies"][0] = [["forward", 1000], ["backward", 999]]
    path.write_text(json.dumps(data))
    code, out = _run("evaluate", _profile(tmp_path), path)
    assert code == 2 and "999 MHz is not in the profile" in out
    assert "Traceback" not in out


def test_choose_from_frontier_csv(tmp_path: Path) -> None:
    pd.DataFrame(
        {
            "index": [0, 1, 2],
            "iteration_time": [10.0, 10.4, 11.0],
            "energy": [100.0, 90.0, 80.0],
            "lower_bound": [99.0, 89.0, 79.0],
            "plan": [f"plans/plan_{i:05d}.json" for i in range(3)],
        }
    ).to_csv(tmp_path / "frontier.csv", index=False)
    assert _stdout("choose", tmp_path, "--max-slowdown", "0.05") == (
        0,
        f"{tmp_path}/plans/plan_00001.json\n",
    )
    assert _stdout("choose", tmp_path, "--max-slowdown", "0") == (
        0,
        f"{tmp_path}/plans/plan_00000.json\n",
    )
    assert _stdout("choose", tmp_path, "--deadline", "20") == (
        0,
        f"{tmp_path}/plans/plan_00002.json\n",
    )
    code, out = _run("choose", tmp_path, "--deadline", "5")
    assert code == 2 and "No plan meets" in out
    # Rows are taken in index order, not file order: of two equal energies, the faster.
    lines = (tmp_path / "frontier.csv").read_text().splitlines()
    lines[2] = lines[2].replace(",90.0,", ",80.0,")  # index 1 now ties with index 2
    (tmp_path / "frontier.csv").write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    assert _stdout("choose", tmp_path, "--deadline", "20") == (
        0,
        f"{tmp_path}/plans/plan_00001.json\n",
    )
    code, out = _run("choose", tmp_path / "empty", "--deadline", "5")
    assert code == 2 and "run `perseus solve" in " ".join(out.split())


def test_choose_prints_the_plans_figures_beside_its_path(tmp_path: Path) -> None:
    """The path alone on stdout; on stderr the plan's time, energy, and its saving and
    slowdown against the all-max plan, recomputed here from the files."""
    out = tmp_path / "f"
    code, text = _run("solve", _profile(tmp_path), "--microbatches", "2", "--out", out, "--no-plots")
    assert code == 0, text
    result = runner.invoke(app, ["choose", str(out), "--max-slowdown", "0.5"])
    assert result.exit_code == 0, result.output
    path = Path(result.stdout.strip())
    assert path.is_file() and result.stdout == f"{path}\n"
    plan, base = json.loads(path.read_text()), json.loads((out / "all_max.json").read_text())
    saving = 100 * (1 - plan["energy"] / base["energy"])
    slowdown = 100 * (plan["iteration_time"] / base["iteration_time"] - 1)
    assert result.stderr.strip() == (
        f"{path.name}: {plan['iteration_time']:.4f} s, {plan['energy']:.1f} J per iteration; "
        f"{saving:.2f} % energy saved at {slowdown:+.2f} % time against all-max "
        f"({base['iteration_time']:.4f} s, {base['energy']:.1f} J)"
    )
    assert saving > 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"index,iteration_time,energy,lower_bound,plan\n0,abc,1,1,p.json\n",
            "line 2: iteration_time",
        ),
        (b"index,iteration_time,energy,lower_bound,plan\n", "lists no plans"),
        (b"\xff\xfe\x00\x01", "not a frontier CSV"),
    ],
)
def test_choose_rejects_a_corrupt_frontier(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "frontier.csv").write_bytes(content)
    for command in (["choose", tmp_path, "--max-slowdown", "0.1"], ["plot", "frontier", tmp_path]):
        code, out = _run(*command)
        assert code == 2 and message in " ".join(out.split()), out
        assert "Traceback" not in out


def test_plot_commands_write_the_images_they_name(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    code, out = _run("solve", profile, "-m", "2", "--out", tmp_path / "f", "--no-plots")
    assert code == 0, out
    plan = tmp_path / "f" / "plans" / "plan_00000.json"
    png = b"\x89PNG\r\n\x1a\n"
    for command, written in (
        (["plot", "frontier", tmp_path / "f"], tmp_path / "f" / "frontier.png"),
        (["plot", "timeline", plan, "--profile", profile], plan.with_suffix(".png")),
        # No suffix: matplotlib writes PNG at name.png, and that is the path printed.
        (["plot", "timeline", plan, "-p", profile, "--out", tmp_path / "t"], tmp_path / "t.png"),
    ):
        code, out = _run(*command)
        assert code == 0, out
        assert out.strip() == str(written)
        assert written.read_bytes()[:8] == png
    code, out = _run("plot", "timeline", plan, "-p", profile, "--out", tmp_path / "f")
    assert code == 2 and "is a directory" in out, out


def test_solve_refuses_an_out_that_is_a_file_before_solving(tmp_path: Path) -> None:
    target = tmp_path / "results"
    target.write_text("keep me")
    code, out = _run("solve", _profile(tmp_path), "-m", "2", "--out", target, "--no-plots")
    assert code == 2 and "is a file" in out, out
    assert target.read_text() == "keep me"


def test_solve_refuses_a_frontier_too_big_for_memory_before_solving(tmp_path: Path) -> None:
    from perseus.memory import available_memory_bytes

    room = available_memory_bytes()
    if room is None:
        pytest.skip("this platform does not tell the available memory")
    profile = _profile(tmp_path)
    stages = pd.read_csv(profile)["stage"].nunique()
    # 1.5× more instructions than fit at the solver's ~100 KB each; the schedule alone fits.
    microbatches = int(1.5 * room / (100 * 1024 * 2 * stages)) + 1
    code, out = _run("solve", profile, "-m", microbatches, "--out", tmp_path / "f")
    assert code == 2 and "GiB of memory, but only" in " ".join(out.split()), out
    assert not (tmp_path / "f").exists()


def test_solve_reports_the_gap_above_the_lp_bound(tmp_path: Path) -> None:
    code, out = _run("solve", _profile(tmp_path), "-m", "3", "--out", tmp_path / "f", "--no-plots")
    assert code == 0, out
    frontier = pd.read_csv(tmp_path / "f" / "frontier.csv")
    gaps = frontier["energy"] / frontier["lower_bound"] - 1
    text = " ".join(out.split())
    assert f"median {100 * gaps.median():.2f} %, worst {100 * gaps.max():.2f} %" in text, text
    # The no-slowdown row is the fastest point (index 0) and ends with its own gap.
    row = next(line for line in out.splitlines() if "no slowdown" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[-1] == f"{100 * gaps[0]:.2f} %", row


def test_polish_writes_a_plan_no_slower_and_no_costlier(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    code, out = _run("solve", profile, "-m", "3", "--out", tmp_path / "f", "--no-plots")
    assert code == 0, out
    plans = sorted((tmp_path / "f" / "plans").glob("plan_*.json"))
    for plan in plans[:3]:
        before = json.loads(_run("evaluate", profile, plan)[1])
        code, out = _run("polish", profile, plan, "--out", tmp_path / "p.json", "--window", "3")
        assert code == 0, out
        assert "windows improved" in out and "above the LP lower bound" in out
        after = json.loads(_run("evaluate", profile, tmp_path / "p.json")[1])
        assert after["iteration_time"] <= before["iteration_time"]
        assert after["energy"] <= before["energy"] + 1e-9


def test_polish_rejects_a_plan_the_profile_cannot_run(tmp_path: Path) -> None:
    path = _plan(tmp_path)
    data = json.loads(path.read_text())
    data["frequencies"][1] = [["forward", 1000], ["backward", 999]]
    path.write_text(json.dumps(data))
    code, out = _run("polish", _profile(tmp_path), path, "--out", tmp_path / "p.json")
    assert code == 2 and "999 MHz" in out and "Traceback" not in out
    assert not (tmp_path / "p.json").exists()


def test_solve_plans_zero_bubble_from_split_rows_or_with_split_backward(tmp_path: Path) -> None:
    plain = _profile(tmp_path)
    code, out = _run("solve", plain, "-m", "3", "--schedule", "zb", "--out", tmp_path / "a")
    assert code == 2 and "--split-backward 0.5" in " ".join(out.split())
    code, out = _run(
        "solve", plain, "-m", "3", "--schedule", "zb", "--split-backward", "0.5",
        "--out", tmp_path / "b", "--no-plots",
    )  # fmt: skip
    assert code == 0, out
    halves = "".join(
        f"{s},{k},{f},{t / 2},{e / 2}\n"
        for s, f, t, e in (
            (0, 1000, 2.0, 20),
            (0, 500, 4.0, 12),
            (1, 1000, 4.0, 40),
            (1, 500, 8.0, 24),
        )
        for k in ("backward_input", "backward_weight")
    )
    split = tmp_path / "split.csv"
    split.write_text(GOOD + halves)
    code, out = _run(
        "solve", split, "-m", "3", "--schedule", "zb", "--out", tmp_path / "c", "--no-plots"
    )
    assert code == 0, out
    assert (tmp_path / "b" / "frontier.csv").read_text() == (
        tmp_path / "c" / "frontier.csv"
    ).read_text()
    plan = json.loads((tmp_path / "c" / "plans" / "plan_00000.json").read_text())
    kinds = {name for stage in plan["frequencies"] for name, _ in stage}
    assert kinds == {"forward", "backward_input", "backward_weight"}
    code, out = _run("solve", plain, "-m", "3", "--split-backward", "1.5", "--out", tmp_path / "d")
    assert code == 2 and "must be in (0, 1)" in out


def test_solve_interleaved_from_a_profile_with_one_stage_per_virtual_stage(tmp_path: Path) -> None:
    rows = "".join(
        f"{s},{k},{f},{(1 + s) * m * x},{(100 + 10 * s) * m * y}\n"
        for s in range(4)
        for k, m in (("forward", 1.0), ("backward", 2.0))
        for f, x, y in ((1000, 1.0, 1.0), (500, 2.0, 0.6))
    )
    profile = _profile(tmp_path, "stage,instruction,frequency,time,energy\n" + rows)
    code, out = _run(
        "solve", profile, "-m", "4", "--schedule", "interleaved", "--chunks", "2",
        "--stages", "2", "--out", tmp_path / "f", "--no-plots",
    )  # fmt: skip
    assert code == 0, out
    assert "S=2 (4 stages)" in out
    plan = json.loads((tmp_path / "f" / "plans" / "plan_00000.json").read_text())
    assert plan["num_stages"] == 2 and plan["num_chunks"] == 2


def _scaled_profile(tmp_path: Path, column: str) -> Path:
    frame = pd.read_csv(_profile(tmp_path))
    frame[column] = frame[column] * 1000
    path = tmp_path / f"{column}_x1000.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    ("column", "mistake"),
    [("time", "times in ms instead of s?"), ("energy", "energies in mJ instead of J?")],
    ids=["ms", "mJ"],
)
def test_solve_refuses_a_profile_in_ms_or_mj_unless_overridden(
    tmp_path: Path, column: str, mistake: str
) -> None:
    path = _scaled_profile(tmp_path, column)
    code, out = _run("solve", path, "-m", "2", "--out", tmp_path / "o", "--no-plots")
    flat = " ".join(out.split())
    assert code == 2, out
    assert mistake in flat and "implied power" in flat and " MHz: time " in flat, out
    for command in (("evaluate", path, tmp_path / "missing.json"),):
        code, out = _run(*command)
        assert code == 2 and mistake in " ".join(out.split()), out
    code, out = _run(
        "solve", path, "-m", "2", "--out", tmp_path / "o", "--no-plots",
        "--allow-implausible-power",
    )  # fmt: skip
    assert code == 0, out


def test_solve_prints_the_blocking_power_it_used_and_refuses_one_out_of_range(
    tmp_path: Path,
) -> None:
    code, out = _run("solve", "bloom_a40_8stage", "-m", "8", "--out", tmp_path / "a", "--no-plots")
    assert code == 0, out
    assert "70.38 W: the A40 spec's (profile clocks match the A40)" in " ".join(out.split())
    code, out = _run(
        "solve", "gpt3-xl_a100_4stage", "-m", "4", "--out", tmp_path / "b", "--no-plots"
    )
    assert code == 0 and "83.64 W: the A100-SXM spec's" in " ".join(out.split()), out
    code, out = _run(
        "solve", _profile(tmp_path), "-m", "2", "--out", tmp_path / "c", "--no-plots",
        "--p2p-power", "60",
    )  # fmt: skip
    assert code == 0 and "60 W: --p2p-power" in out, out
    code, out = _run(
        "solve", "bloom_a40_8stage", "-m", "8", "--out", tmp_path / "d", "--no-plots",
        "--p2p-power", "5000",
    )  # fmt: skip
    assert code == 2 and "outside A40's power range" in " ".join(out.split()), out
    code, out = _run(
        "solve", _profile(tmp_path), "-m", "2", "--out", tmp_path / "e", "--gpu", "B200",
    )  # fmt: skip
    assert code == 2 and "Unknown emulated GPU type" in out, out


def test_max_slowdown_above_one_is_refused_by_choose_and_demo(tmp_path: Path) -> None:
    code, out = _run("solve", _profile(tmp_path), "-m", "2", "--out", tmp_path / "f", "--no-plots")
    assert code == 0, out
    code, out = _run("choose", tmp_path / "f", "--max-slowdown", "5")
    assert code == 2 and "for 5 % pass 0.05" in " ".join(out.split()), out
    code, out = _run("choose", tmp_path / "f", "--max-slowdown", "0.05")
    assert code == 0, out
    code, out = _run("demo", "--out", tmp_path / "demo", "--max-slowdown", "5")
    assert code == 2 and "5 means 500 %" in " ".join(out.split()), out


def test_solve_and_choose_offer_plans_faster_than_all_max(tmp_path: Path) -> None:
    """Bloom's A40 top clock is power-capped: the fastest plan beats all-max (a negative
    slowdown), and `choose --max-slowdown 0` picks the cheapest plan no slower than
    all-max, measured against the frontier's all_max.json."""
    from paths import SHARED_DATA, require_data

    from perseus.io.plan_file import load_plan
    from perseus.planning import Frontier

    profile = require_data(SHARED_DATA / "sosp24_bloom-176b_a40_8stage.csv")
    out_dir = tmp_path / "f"
    code, out = _run("solve", profile, "-m", "4", "--out", out_dir, "--no-plots")
    assert code == 0, out
    rows = {
        cells[0]: cells
        for line in out.splitlines()
        if "│" in line
        for cells in [[c.strip() for c in line.strip("│ ").split("│")]]
    }
    slowdown = {label: float(rows[label][3].rstrip(" %")) for label in ("fastest", "no slowdown")}
    assert slowdown["fastest"] < 0 and slowdown["no slowdown"] <= 0, rows  # vs all-max
    frontier = Frontier.read(out_dir)
    all_max = load_plan(out_dir / "all_max.json")
    assert frontier.points[0].iteration_time_s < all_max.iteration_time
    code, out = _stdout("choose", out_dir, "--max-slowdown", "0")
    assert code == 0, out
    chosen = load_plan(Path(out.strip()))
    assert chosen.iteration_time <= all_max.iteration_time
    assert chosen.energy == frontier.choose(max_slowdown=0.0).energy_j
    assert chosen.energy == min(
        p.energy_j for p in frontier.points if p.iteration_time_s <= all_max.iteration_time
    )
    code, out = _run("plot", "frontier", out_dir)  # marks all-max and no slowdown
    assert code == 0 and (out_dir / "frontier.png").read_bytes()[:4] == b"\x89PNG", out
    # A frontier directory from before all_max.json: its first row is the reference.
    (out_dir / "all_max.json").unlink()
    assert _stdout("choose", out_dir, "--max-slowdown", "0") == (
        0,
        f"{out_dir}/plans/plan_00000.json\n",
    )
    (out_dir / "all_max.json").write_text('{"iteration_time": "soon"}')
    for command in (["choose", out_dir, "--max-slowdown", "0"], ["plot", "frontier", out_dir]):
        code, out = _run(*command)
        assert code == 2 and "all_max.json" in out and "Traceback" not in out, out


def test_an_emulated_profile_is_said_so_by_solve_evaluate_and_its_plans(tmp_path: Path) -> None:
    """`perseus profile synth` marks its rows emulated (they are the emulator's model);
    everything made from them says so, and a profile from real GPUs says nothing."""
    emulated = tmp_path / "emulated.csv"
    code, out = _run("profile", "synth", "--gpu", "A40", "--stages", "2", "--out", emulated)
    assert code == 0 and "marked emulated" in " ".join(out.split())
    assert emulated.read_text().splitlines()[0].endswith(",emulated")
    code, out = _run("solve", emulated, "-m", "2", "--out", tmp_path / "fr", "--no-plots")
    assert code == 0, out
    assert "Profile measured on emulated GPUs" in " ".join(out.split())
    plans = sorted((tmp_path / "fr" / "plans").glob("*.json"))
    assert plans and all(json.loads(p.read_text())["emulated"] is True for p in plans)
    assert json.loads((tmp_path / "fr" / "all_max.json").read_text())["emulated"] is True
    code, out = _run("evaluate", emulated, plans[0])
    assert code == 0 and json.loads(out)["emulated"] is True
    code, out = _run(
        "solve", _profile(tmp_path), "-m", "2", "--out", tmp_path / "real", "--no-plots"
    )
    assert code == 0 and "Profile measured on emulated GPUs" not in " ".join(out.split())
    plans = sorted((tmp_path / "real" / "plans").glob("*.json"))
    assert all("emulated" not in json.loads(p.read_text()) for p in plans)
    code, out = _run("evaluate", _profile(tmp_path), plans[0])
    assert code == 0 and "emulated" not in json.loads(out)


def test_solve_and_evaluate_count_clock_changes_and_their_latency(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    args = ["-m", "3", "--out", tmp_path / "f", "--no-plots", "--switch-latency-ms", "500"]
    code, out = _run("solve", profile, *args)
    assert code == 0, out
    assert "Clock changes take 500 ms" in " ".join(out.split())
    changed = 0
    for path in sorted((tmp_path / "f" / "plans").glob("plan_*.json")):
        plan = json.loads(path.read_text())
        assert plan["switch_latency"] == 0.5
        freqs = [[f for _, f in stage] for stage in plan["frequencies"]]
        assert plan["clock_changes"] == sum(
            sum(1 for k in range(len(f)) if f[k] != f[k - 1]) for f in freqs
        )
        report = json.loads(_run("evaluate", profile, path)[1])  # at the plan's own latency
        assert report["clock_changes"] == plan["clock_changes"]
        assert report["switch_latency"] == 0.5
        assert report["iteration_time"] == pytest.approx(plan["iteration_time"], rel=1e-9)
        assert report["energy"] == pytest.approx(plan["energy"], rel=1e-9)
        free = json.loads(_run("evaluate", profile, path, "--switch-latency-ms", "0")[1])
        changed += free["iteration_time"] != pytest.approx(plan["iteration_time"], rel=1e-9)
    assert changed, "some plan changes clocks, and its numbers count the switches"
    code, out = _run("solve", profile, *args[:-1], "-1")
    assert code == 2 and "Traceback" not in out


def test_solve_plans_for_the_hop_latency_and_evaluate_rescores_at_it(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    args = ["-m", "3", "--no-plots", "--hop-latency-ms", "500"]
    code, out = _run("solve", profile, *args, "--out", tmp_path / "f")
    assert code == 0, out
    assert "P2P hop between ranks takes 500 ms" in " ".join(out.split())
    code, out = _run("solve", profile, *args[:-2], "--out", tmp_path / "free")
    assert code == 0, out
    free_fastest = json.loads((tmp_path / "free" / "plans" / "plan_00000.json").read_text())
    plans = sorted((tmp_path / "f" / "plans").glob("plan_*.json"))
    for path in plans:
        plan = json.loads(path.read_text())
        assert plan["hop_latency"] == 0.5
        report = json.loads(_run("evaluate", profile, path)[1])  # at the plan's own latency
        assert report["hop_latency"] == 0.5
        assert report["iteration_time"] == pytest.approx(plan["iteration_time"], rel=1e-12)
        assert report["energy"] == pytest.approx(plan["energy"], rel=1e-12)
    # 1F1B on 2 ranks, one hop each way per microbatch on the critical path at least.
    fastest = json.loads(plans[0].read_text())
    assert fastest["iteration_time"] >= free_fastest["iteration_time"] + 2 * 0.5 - 1e-9
    code, out = _run("evaluate", profile, plans[0], "--hop-latency-ms", "0")
    assert code == 0 and json.loads(out)["iteration_time"] < fastest["iteration_time"]
    code, out = _run("solve", profile, *args[:-1], "-1", "--out", tmp_path / "bad")
    assert code == 2 and "Traceback" not in out
    # Polish keeps the plan's hop latency (its windows are solved with it).
    code, out = _run("polish", profile, plans[-1], "--out", tmp_path / "p.json", "--window", "3")
    assert code == 0, out
    polished = json.loads((tmp_path / "p.json").read_text())
    slowest = json.loads(plans[-1].read_text())
    assert polished["hop_latency"] == 0.5
    assert polished["iteration_time"] <= slowest["iteration_time"]
    assert polished["energy"] <= slowest["energy"] + 1e-9
