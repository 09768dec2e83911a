"""ZeusMaster with a tiny real training script (numpy SGD on an emulated GPU)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from paths import TESTS

from zeus_power.bso.local import LocalBatchSizeOptimizer
from zeus_power.errors import ZeusConfigError, ZeusMasterError
from zeus_power.master import Job, TrainingEnv, TrainingResult, ZeusMaster

SCRIPT = TESTS / "zeus_assets" / "train_tiny.py"


def _job(**overrides) -> Job:
    fields = {
        "name": "tiny",
        "command": (sys.executable, str(SCRIPT)),
        "default_batch_size": 64,
        "default_learning_rate": 0.01,
        "target_metric": 0.85,
        "max_epochs": 30,
    }
    fields.update(overrides)
    return Job(**fields)


def _master(tmp_path: Path, **kwargs) -> ZeusMaster:
    return ZeusMaster(
        None, tmp_path, max_power_w=300.0, profile_warmup_iters=2, profile_measure_iters=3, **kwargs
    )


def test_run_job_trains_and_returns_energy_time_reached(tmp_path: Path) -> None:
    master = _master(tmp_path)
    logdir = Path(master.build_logdir(_job(), 1, 0.5, 2.0))
    energy, time, reached = master.run_job(
        _job(), 32, _job().scale_lr(32), 1, logdir, rec_i=1, tries=1, eta_knob=0.5, cost_ub=math.inf
    )
    assert reached is True
    assert energy > 0 and time > 0
    # The script trained with the batch size from the environment and reported its epochs.
    log = (logdir / "rec01+try01.train.log").read_text()
    assert "bs 32" in log and "accuracy" in log
    result = TrainingResult.model_validate_json((logdir / "rec01+try01.result.json").read_text())
    assert (result.energy_j, result.time_s, result.reached) == (energy, time, reached)
    # It profiled power limits with the iterations the master passed down.
    profile = json.loads((logdir / "power_profile_bs32.json").read_text())
    assert [m["power_limit_w"] for m in profile["measurements"]] == [300, 250, 200, 150, 100]
    # The script measured emulated GPUs: its result and its power profile say so.
    assert result.emulated is True and profile["emulated"] is True


def test_cost_bound_stops_the_script(tmp_path: Path) -> None:
    master = _master(tmp_path)
    logdir = tmp_path / "bound"
    logdir.mkdir()
    energy, time, reached = master.run_job(
        _job(), 32, 0.01, 1, logdir, rec_i=1, tries=1, eta_knob=0.5, cost_ub=50.0
    )
    assert reached is False
    assert "ZeusCostThresholdExceededError" in (logdir / "rec01+try01.train.log").read_text()
    result = TrainingResult.model_validate_json((logdir / "rec01+try01.result.json").read_text())
    assert result.epochs == 1  # the first epoch's cost already predicts passing the bound
    assert (result.energy_j, result.time_s) == (energy, time)


def test_run_over_recurrences_explores_then_exploits(tmp_path: Path) -> None:
    bso = LocalBatchSizeOptimizer()
    master = ZeusMaster(
        bso, tmp_path, max_power_w=300.0, profile_warmup_iters=1, profile_measure_iters=2
    )
    history = master.run(_job(), 6, [32, 64, 128, 256], beta_knob=2.0, eta_knob=0.5)
    assert [h.rec_i for h in history if h.reached] == [1, 2, 3, 4, 5, 6]
    assert all(h.cost > 0 and h.energy_j > 0 for h in history)
    tried = [h.batch_size for h in history]
    assert tried[:3] == [64, 32, 128]  # default, down (32 is the smallest), then up
    assert len(bso.list_trials("tiny")) == len(history)
    logdir = next(tmp_path.iterdir())
    assert logdir.name.startswith("tiny+x6+eta0.5+beta2.0+")
    lines = (logdir / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["batch_size"] for line in lines] == tried
    assert all(json.loads(line)["emulated"] is True for line in lines)
    assert all(h.emulated for h in history)
    state = bso.get_job("tiny")
    assert state.best_cost == min(h.cost for h in history if h.reached)


def test_script_without_result_is_a_clear_error(tmp_path: Path) -> None:
    job = _job(command=(sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"))
    master = _master(tmp_path)
    with pytest.raises(ZeusMasterError, match=r"(?s)exited with code 3 without writing .*boom"):
        master.run_job(job, 64, 0.01, 1, tmp_path, 1, 1, 0.5, math.inf)


def test_placeholders_are_replaced_verbatim(tmp_path: Path) -> None:
    code = (
        "import sys, json; from zeus_power.master import TrainingResult; "
        "TrainingResult(energy_j=float(sys.argv[1]), time_s=float(sys.argv[2]), reached=True)"
        ".write(sys.argv[3])"
    )
    job = _job(command=(sys.executable, "-c", code, "{batch_size}", "{seed}", "{result_path}"))
    energy, time, reached = _master(tmp_path).run_job(job, 48, 0.01, 7, tmp_path, 2, 3, 0.5, 1e9)
    assert (energy, time, reached) == (48.0, 7.0, True)


def test_bad_inputs(tmp_path: Path) -> None:
    master = _master(tmp_path)
    with pytest.raises(ZeusConfigError, match="eta_knob"):
        master.run(_job(), 2, [32, 64], beta_knob=2.0, eta_knob=1.5)
    with pytest.raises(ZeusConfigError, match="num_recurrence=0"):
        master.run(_job(), 0, [32, 64], beta_knob=2.0, eta_knob=0.5)
    with pytest.raises(ZeusConfigError, match="default_batch_size=0"):
        _job(default_batch_size=0)
    with pytest.raises(ZeusConfigError, match="command is empty"):
        _job(command=())
    with pytest.raises(ZeusConfigError, match="max_power_w"):
        ZeusMaster(None, tmp_path, max_power_w=0.0)


def test_learning_rate_scaling() -> None:
    assert _job(lr_scaling="sqrt").scale_lr(256) == pytest.approx(0.02)
    assert _job(lr_scaling="linear").scale_lr(256) == pytest.approx(0.04)
    assert _job(lr_scaling="none").scale_lr(256) == pytest.approx(0.01)


def test_training_env_names_missing_variables() -> None:
    with pytest.raises(ZeusConfigError, match="ZEUS_JOB_ID is not set"):
        TrainingEnv.from_environ({})
