"""The hook's deploy and saving log lines (`perseus.client.savings`), fed round by round."""

from __future__ import annotations

import logging

from perseus.client.savings import SavingsLog

MAX = 1410


def _log(caplog) -> SavingsLog:
    caplog.set_level(logging.DEBUG, logger="test.savings")  # per-GPU lines are DEBUG
    return SavingsLog(3, MAX, logging.getLogger("test.savings"))


def test_a_repeated_schedule_is_deployed_and_its_saving_against_all_max_is_logged(caplog):
    log = _log(caplog)
    log.schedule(0, [MAX] * 4)
    log.measured([1.0, 1.0], [100.0, 100.0])  # the all-max baseline
    log.schedule(1, [1200, 900, 1200, 900])  # a new schedule: not deployed yet
    log.measured([1.05], [80.0])
    assert caplog.messages == []
    log.schedule(2, [1200, 900, 1200, 900])
    assert caplog.messages == [
        "Rank 3: deployed since round 1: 4 instructions, 900–1200 MHz (mean 1050)"
    ]
    log.measured([1.05, 1.05], [80.0, 80.0])
    assert caplog.messages[1] == (
        "Rank 3: saves 20.0 % energy per iteration against all-max (80.000 J vs 100.000 J); "
        "iteration time +5.0 % (1.0500 s vs 1.0000 s)"
    )
    log.schedule(3, [1200, 900, 1200, 900])
    log.measured([1.05], [80.0])
    assert len(caplog.messages) == 2  # once per deployed schedule


def test_a_sweep_logs_nothing_and_all_max_deploys_without_a_saving(caplog):
    log = _log(caplog)
    for r, f in enumerate((1410, 1395, 1380)):
        log.schedule(r, [f] * 4)
        log.measured([1.0], [100.0])
    assert caplog.messages == []  # every round a new schedule: a sweep
    log.schedule(3, [1380] * 4)
    log.schedule(4, [MAX] * 4)
    log.schedule(5, [MAX] * 4)
    log.measured([1.0], [100.0])
    assert caplog.messages[-1] == (
        "Rank 3: deployed since round 4: 4 instructions, every instruction at the max clock"
    )
    log.log_saving()  # no deployed schedule other than all-max: nothing to say
    assert not any("saves" in m for m in caplog.messages)


def test_no_baseline_no_saving_and_non_finite_iterations_are_ignored(caplog):
    log = _log(caplog)
    log.schedule(0, [900] * 2)
    log.schedule(1, [900] * 2)
    log.measured([float("nan")], [float("inf")])
    log.measured([1.0], [50.0])
    log.log_saving()
    assert [m for m in caplog.messages if "saves" in m] == []
    assert log.deployed == (1.0, 50.0)
