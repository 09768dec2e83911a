"""The `Perseus` scheduler's profiler on what emulated GPUs show, in virtual time.

The simulated ranks of `benchmarks/bench_sensors.py` (their instruction powers told to an
`EmulatedGPU` with the default, real sensors; counter polled, energy windows cut as a rank
cuts them) drive the real scheduler, round by round, until it deploys. A 2-stage pipeline
with 10 ms instructions and 5 clocks: seconds of CPU, not minutes (the 4-rank torchrun
version is `tests/e2e/test_e2e_sensors.py`).
"""

from __future__ import annotations

import argparse
import sys

import pytest
from paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_sensors


def _cell(sensors: str, profiler: str) -> bench_sensors.Cell:
    args = argparse.Namespace(stages=2, microbatches=4, freq_step=20, seed=1, round_ticks=None)
    return bench_sensors.run_cell(sensors, "10ms", profiler, args)


def test_windows_give_every_rows_energy_and_the_blocking_power():
    cell = _cell("100ms", "ours")
    assert cell.failed is None
    assert cell.err_median <= 0.02 and cell.err_p95 <= 0.05, cell
    assert abs(cell.block_err) <= 0.05, cell
    assert cell.plan_gap <= 0.01, cell
    assert cell.iterations > 2 * cell.rounds  # long rounds: about 1.2 s each


def test_a_sensor_sampling_a_quarter_of_each_period_is_recognised():
    cell = _cell("100ms-25%", "ours")
    assert cell.err_median <= 0.02 and cell.err_p95 <= 0.05, cell


def test_todays_profiler_on_the_same_sensors_is_far_off():
    cell = _cell("100ms", "today's")
    assert cell.failed is not None or cell.err_median > 0.1 or abs(cell.block_err) > 0.5, cell


@pytest.mark.parametrize("profiler", ["ours", "today's"])
def test_on_ideal_sensors_both_profilers_are_exact(profiler):
    cell = _cell("ideal", profiler)
    assert cell.err_p95 <= 0.005 and abs(cell.block_err) <= 0.005, cell
