"""`ScheduleValidator`: a rank's schedule on arrival, then the instruction order it executes."""

from __future__ import annotations

import pytest

from perseus.client import ScheduleValidator
from perseus.errors import ScheduleError
from perseus.protocol import FrequencySchedule

ORDER = ["forward", "backward", "forward", "backward"]
FREQS = [1410, 1200, 1005, 705]


def _validator(expected=None) -> ScheduleValidator:
    return ScheduleValidator(
        rank=3, pp_rank=1, available_frequencies=FREQS, expected_instructions=expected
    )


def _schedule(names=ORDER, freqs=(1410, 705, 1200, 1005), rank=3) -> FrequencySchedule:
    return FrequencySchedule(rank=rank, frequencies=list(zip(names, freqs, strict=True)))


def test_an_accepted_schedule_is_followed_in_order():
    v = _validator(expected=ORDER)
    assert v.accept(_schedule(), 0) == [
        ("forward", 1410),
        ("backward", 705),
        ("forward", 1200),
        ("backward", 1005),
    ]
    for _ in range(2):  # two steps with the same schedule
        v.start_step()
        clocks = []
        for name in ORDER:
            clocks.append(v.begin(name, step=0))
            assert v.end(name, step=0) == clocks[-1]
            v.advance()
        v.finish_step(step=0)
        assert clocks == [1410, 705, 1200, 1005]


@pytest.mark.parametrize(
    ("schedule", "expected", "message"),
    [
        (_schedule(rank=2), None, r"Rank 3 \(stage 1\), round 5: received the schedule of rank 2"),
        (FrequencySchedule(rank=3, frequencies=[]), None, "received an empty schedule"),
        (
            _schedule(names=["forward", "optimizer", "forward", "backward"]),
            None,
            "entry #1 names instruction 'optimizer'; expected one of forward, backward",
        ),
        (
            _schedule(freqs=(1410, 705, 1300, 1005)),
            None,
            r"entry #2 asks for 1300 MHz, which this GPU does not support \(705..1410 MHz\)",
        ),
        (
            _schedule(),
            ORDER * 2,
            r"the schedule has 4 instruction\(s\) per iteration but this stage executes 8",
        ),
        (
            _schedule(),
            ["forward", "forward", "backward", "backward"],
            "entry #1 is 'backward' but this stage executes 'forward' there",
        ),
    ],
)
def test_a_bad_schedule_is_rejected_on_arrival(schedule, expected, message):
    v = _validator(expected=expected)
    with pytest.raises(ScheduleError, match=message):
        v.accept(schedule, 5)
    assert v.frequencies == []  # nothing half-accepted


def test_executing_out_of_schedule_is_named():
    v = _validator()
    v.accept(_schedule(), 0)
    v.start_step()
    with pytest.raises(
        ScheduleError,
        match=r"Rank 3 \(stage 1\), step 7: executed 'backward' as instruction #0 but the "
        "schedule says 'forward'",
    ):
        v.begin("backward", step=7)
    v.begin("forward", step=7)
    with pytest.raises(
        ScheduleError,
        match=r"on_instruction_end\('backward'\) does not match on_instruction_begin\('forward'\)",
    ):
        v.end("backward", step=7)
    v.end("forward", step=7)
    v.advance()
    with pytest.raises(ScheduleError, match=r"executed 1 instruction\(s\) but the schedule has 4"):
        v.finish_step(step=7)
    for name in ORDER[1:]:
        v.begin(name, step=7)
        v.advance()
    with pytest.raises(ScheduleError, match=r"instruction #4 \('forward'\) exceeds the schedule"):
        v.begin("forward", step=7)
    v.finish_step(step=7)
