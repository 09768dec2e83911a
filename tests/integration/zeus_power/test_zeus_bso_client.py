"""BatchSizeOptimizer (client) against a real server, measuring emulated GPUs in virtual time."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from zeus_assets.bso_server import running_server

from zeus_power.bso.client import BatchSizeOptimizer
from zeus_power.bso.models import JobSpec, TrialList
from zeus_power.device.emulated import EmulatedGPU, VirtualClock, Workload
from zeus_power.errors import (
    ZeusBSOConfigError,
    ZeusBSOOperationOrderError,
    ZeusBSORuntimeError,
    ZeusBSORuntimError,
    ZeusBSOTrainFailError,
    ZeusBSOTrialNotFoundError,
    ZeusConfigError,
)
from zeus_power.metric import zeus_cost
from zeus_power.monitor import ZeusMonitor


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "bso.db"


@pytest.fixture
def server(db_path: Path) -> Iterator[str]:
    with running_server(f"sqlite:///{db_path}") as url:
        yield url


_OPEN: list[BatchSizeOptimizer] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


class Session:
    """One training session: an emulated A40 on a virtual clock, and the client."""

    def __init__(self, server: str, job: JobSpec, rank: int = 0) -> None:
        self.clock = VirtualClock()
        self.gpu = EmulatedGPU(0, gpu_type="A40", clock=self.clock)
        self.monitor = ZeusMonitor(gpus=[self.gpu], time_fn=self.clock)
        self.bso = BatchSizeOptimizer(self.monitor, server, job, rank=rank)
        _OPEN.append(self.bso)

    def epoch(self, batch_size: int) -> None:
        """One epoch of 10 steps whose work grows with the batch size."""
        for _ in range(10):
            self.gpu.execute(Workload(compute_s_at_max=1e-3 * batch_size, memory_s=0.01))


def _records(server: str, job_id: str):
    return TrialList.validate_python(httpx.get(f"{server}/jobs/{job_id}/trials").json())


def test_converging_session_reports_its_measured_energy_and_time(server: str) -> None:
    job = JobSpec(job_id="flow", batch_sizes=[32, 64, 128], default_batch_size=64, eta_knob=0.5)
    s = Session(server, job)
    assert s.bso.job.max_power_w == 300.0 and s.bso.job.number_of_gpus == 1
    assert "A40" in s.bso.job.gpu_model
    bs = s.bso.get_batch_size()
    assert bs == 64
    assert s.bso.get_batch_size() == 64  # asking again does not open another trial
    start_s = s.clock()
    energy0 = s.gpu.total_energy_mj()
    s.bso.on_train_begin()
    s.epoch(bs)
    assert s.bso.on_evaluate(0.3) is False
    s.epoch(bs)
    assert s.bso.on_evaluate(0.6) is True  # target 0.5 reached
    (record,) = _records(server, "flow")
    assert record.status == "succeeded" and record.epochs == 2 and record.batch_size == 64
    assert record.time_s == pytest.approx(s.clock() - start_s)
    assert record.energy_j == pytest.approx((s.gpu.total_energy_mj() - energy0) / 1000, abs=1e-2)
    assert record.cost == pytest.approx(zeus_cost(record.energy_j, record.time_s, 0.5, 300.0))
    with pytest.raises(ZeusBSOOperationOrderError, match="already ended"):
        s.bso.on_evaluate(0.9)


def test_a_trial_lost_on_the_server_is_a_trial_not_found_error(server: str, db_path: Path) -> None:
    job = JobSpec(job_id="lost", batch_sizes=[32, 64], default_batch_size=32)
    s = Session(server, job)
    s.bso.get_batch_size()
    s.bso.on_train_begin()
    with sqlite3.connect(db_path) as db:  # e.g. the database was restored from a backup
        db.execute("DELETE FROM bso_trials WHERE job_id = 'lost'")
    with pytest.raises(ZeusBSOTrialNotFoundError, match="has no trial 1"):
        s.bso.on_evaluate(0.9)


def test_lower_is_better_metric(server: str) -> None:
    job = JobSpec(
        job_id="loss",
        batch_sizes=[32],
        default_batch_size=32,
        target_metric=0.1,
        higher_is_better_metric=False,
    )
    s = Session(server, job)
    s.bso.get_batch_size()
    s.bso.on_train_begin()
    assert s.bso.on_evaluate(0.5) is False
    assert s.bso.on_evaluate(0.09) is True


def test_max_epochs_fails_the_trial(server: str) -> None:
    job = JobSpec(job_id="maxep", batch_sizes=[32, 64], default_batch_size=32, max_epochs=2)
    s = Session(server, job)
    s.bso.get_batch_size()
    s.bso.on_train_begin()
    assert s.bso.on_evaluate(0.1) is False
    with pytest.raises(ZeusBSOTrainFailError, match="max_epochs=2 reached"):
        s.bso.on_evaluate(0.2)
    (record,) = _records(server, "maxep")
    assert record.status == "failed" and record.converged is False
    # The next session gets another batch size: the failed one is not retried in pruning.
    assert Session(server, job).bso.get_batch_size() == 64


def test_early_stop_when_cost_passes_beta_times_best(server: str) -> None:
    job = JobSpec(
        job_id="early", batch_sizes=[16, 256], default_batch_size=16, beta_knob=1.2, max_epochs=50
    )
    first = Session(server, job)
    assert first.bso.get_batch_size() == 16
    first.bso.on_train_begin()
    first.epoch(16)
    assert first.bso.on_evaluate(0.9) is True  # converged in one epoch: the best cost
    best = _records(server, "early")[0].cost

    second = Session(server, job)
    bs = second.bso.get_batch_size()
    assert bs == 256 and second.bso.trial.cost_ub == pytest.approx(1.2 * best)
    second.bso.on_train_begin()
    with pytest.raises(ZeusBSOTrainFailError, match="passed the early-stop bound"):
        for _ in range(50):
            second.epoch(bs)
            second.bso.on_evaluate(0.0)
    failed = _records(server, "early")[1]
    assert failed.status == "failed" and failed.cost > 1.2 * best
    assert failed.epochs is not None and failed.epochs < 50


def test_operation_order_errors(server: str) -> None:
    job = JobSpec(job_id="order", batch_sizes=[32], default_batch_size=32)
    s = Session(server, job)
    with pytest.raises(ZeusBSOOperationOrderError, match="before get_batch_size"):
        s.bso.on_train_begin()
    with pytest.raises(ZeusBSOOperationOrderError, match="before on_train_begin"):
        s.bso.on_evaluate(0.1)
    s.bso.get_batch_size()
    s.bso.on_train_begin()
    with pytest.raises(ZeusBSOOperationOrderError, match="already called"):
        s.bso.on_train_begin()


def test_only_rank_zero_talks_to_the_server(server: str) -> None:
    job = JobSpec(job_id="ranks", batch_sizes=[32], default_batch_size=32)
    other = Session(server, job, rank=1)
    with pytest.raises(ZeusBSOOperationOrderError, match="Only rank 0"):
        other.bso.get_batch_size()
    other.bso.on_train_begin()
    assert other.bso.on_evaluate(1.0) is False
    assert _records(server, "ranks") == []
    with pytest.raises(ZeusConfigError, match="rank must be >= 0"):
        Session(server, job, rank=-1)


def test_a_different_spec_under_a_registered_id_is_refused(server: str) -> None:
    Session(server, JobSpec(job_id="same", batch_sizes=[32, 64], default_batch_size=32))
    with pytest.raises(ZeusBSOConfigError, match="different config"):
        Session(server, JobSpec(job_id="same", batch_sizes=[32, 64], default_batch_size=64))


def test_unreachable_server_names_the_url() -> None:
    job = JobSpec(job_id="nowhere", batch_sizes=[32], default_batch_size=32)
    with pytest.raises(ZeusBSORuntimeError, match=r"http://127\.0\.0\.1:9/jobs failed"):
        Session("http://127.0.0.1:9", job)
    assert ZeusBSORuntimError is ZeusBSORuntimeError  # Zeus's spelling still works


def test_bad_spec_is_refused_before_any_request() -> None:
    with pytest.raises(ValueError, match="default_batch_size=48 is not one of"):
        JobSpec(job_id="x", batch_sizes=[32, 64], default_batch_size=48)
    with pytest.raises(ValueError, match="eta_knob"):
        JobSpec(job_id="x", batch_sizes=[32], default_batch_size=32, eta_knob=2.0)
