"""GlobalPowerLimitOptimizer over a real 2-process gloo group: windows are all-reduced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import require_module

torch = require_module("torch")
mp = require_module("torch.multiprocessing")

from zeus_assets.dist_worker import rank_workload, run_rank  # noqa: E402

from zeus_power.device.emulated import DVFSModel  # noqa: E402


def test_two_ranks_agree_on_max_time_and_summed_energy(tmp_path: Path) -> None:
    mp.spawn(run_rank, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0 == rank1  # every rank selects from the same aggregated measurements
    model = DVFSModel("A40")
    for m in rank0:
        runs = [
            model.run(rank_workload(r), model.spec.max_sm_clock_mhz, m["power_limit_w"])
            for r in (0, 1)
        ]
        assert m["time_s"] == pytest.approx(3 * max(run.time_s for run in runs))
        assert m["energy_j"] == pytest.approx(3 * sum(run.energy_j for run in runs), abs=1e-2)
    # Only rank 0 writes the profile, and it holds the aggregated measurements.
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved["measurements"] == rank0
