"""Profile rows whose time is not their clock's are left out below the max clock
(`perseus.schedulers.sweep.row_times`)."""

from __future__ import annotations

from perseus.domain.rows import ProfileRow
from perseus.schedulers.sweep.row_times import (
    LANDING_ONLY,
    MAX_SPEEDUP_BELOW,
    untrusted_times,
)


def rows_of(times: dict[int, float], stage: int = 0, kind: str = "forward") -> list[ProfileRow]:
    return [ProfileRow(0, 0, 0, 0, stage, kind, f, t, 100.0 * t) for f, t in times.items()]


# A forward's time at each clock, the shape of the emulator's A100 (15 ms at 1410 MHz).
CURVE = {1410: 0.0150, 1260: 0.0159, 1110: 0.0171, 960: 0.0190, 810: 0.0208, 690: 0.0232}


def test_a_physical_curve_keeps_every_row():
    assert untrusted_times(rows_of(CURVE), set()) == {}


def test_a_lower_clock_measured_faster_is_left_out_and_only_it():
    # 705 MHz read at the max clock's time: what a unit whose every instruction started
    # while the change landed measures (the GPU stayed at 1410 MHz).
    times = {**CURVE, 705: 0.0154}
    out = untrusted_times(rows_of(times), set())
    assert set(out) == {(0, "forward", 705)}
    assert "faster than at" in out[0, "forward", 705] and "MHz" in out[0, "forward", 705]


def test_the_fewest_rows_are_left_out_whichever_side_is_wrong():
    # One clock read too slow (a change from a lower clock landing during it): every clock
    # below it would look faster; the one row is what goes.
    times = {**CURVE, 1200: 0.0240}
    out = untrusted_times(rows_of(times), set())
    assert set(out) == {(0, "forward", 1200)}
    assert "slower than" in out[0, "forward", 1200]


def test_a_power_caps_small_speedup_is_kept():
    # Under a power cap a lower clock can run a little faster (2 % on the Bloom A40).
    capped = {1410: 0.0150, 1350: 0.0147, 1290: 0.0148, 1200: 0.0152}
    assert MAX_SPEEDUP_BELOW > 0.02
    assert untrusted_times(rows_of(capped), set()) == {}


def test_the_max_clock_row_is_never_left_out():
    # Even when it is the odd one: every plan needs it (the scheduler's checks judge it).
    times = {1410: 0.030, 1260: 0.0159, 1110: 0.0171}
    out = untrusted_times(rows_of(times), {(0, "forward", 1410)})
    assert (0, "forward", 1410) not in out


def test_landing_only_rows_are_left_out_with_their_reason():
    landing = {(0, "forward", 960), (1, "forward", 810)}
    rows = rows_of(CURVE) + rows_of(CURVE, stage=1)
    out = untrusted_times(rows, landing)
    assert out == {key: LANDING_ONLY for key in landing}


def test_each_kind_is_judged_on_its_own():
    # A backward slower than the forward at a higher clock says nothing about either.
    rows = rows_of(CURVE) + rows_of({f: 2 * t for f, t in CURVE.items()}, kind="backward")
    assert untrusted_times(rows, set()) == {}
