"""Per-instruction power fitted to energy windows: recovery, uncertainty, sampling model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perseus.schedulers.measurement import WindowRow
from perseus.schedulers.sweep.power_fit import MODELS, PowerRegression

F, B = (0, "forward", 1410), (0, "backward", 1410)
POWER = {F: 380.0, B: 330.0}
IDLE_W = 60.0


def _timeline(rng: np.random.Generator, seconds: float) -> list[tuple[float, float, tuple]]:
    """A stage's instructions back to back with gaps: warm-up forwards, alternation,
    cool-down backwards (what makes F and B separable), repeated."""
    out, t = [], 0.0
    while t < seconds:
        for unit in [F, F, F, F, B, F, B, F, B, B, B, B]:
            d = 0.012 if unit == F else 0.024
            out.append((t, t + d, unit))
            t += d + float(rng.uniform(0.0, 0.004))
        t += 0.03  # a bubble
    return out


def _windows(
    timeline, period: float, *, tail: float = 1.0, noise: float = 0.0, rng=None
) -> list[WindowRow]:
    """What a rank reports: energy between refreshes (sampling the last `tail` of each
    period, scaled up), and each unit's seconds in the window and in its last quarter."""

    def energy(a: float, b: float) -> float:
        e = IDLE_W * (b - a)
        for s, f, u in timeline:
            e += max(0.0, min(f, b) - max(s, a)) * (POWER[u] - IDLE_W)
        return e

    def busy(a: float, b: float) -> dict:
        out: dict = {}
        for s, f, u in timeline:
            o = max(0.0, min(f, b) - max(s, a))
            if o > 0:
                out[u] = out.get(u, 0.0) + o
        return out

    rows = []
    end = timeline[-1][1]
    for a in np.arange(0.0137, end - period, period):
        b = a + period
        e = energy(b - tail * period, b) / tail
        if noise:
            e *= 1 + noise * rng.standard_normal()
        rows.append(WindowRow(e, period, busy(a, b), 0.25 * period, busy(b - 0.25 * period, b)))
    return rows


def test_exact_windows_give_exact_powers():
    reg = PowerRegression()
    reg.add(0, _windows(_timeline(np.random.default_rng(0), 3.0), 0.1))
    reg.add_time(0, F, 0.012 * 10, 10)
    fit = reg.fit()[0]
    assert fit.model == MODELS[0]
    for unit, power in POWER.items():
        assert fit.units[unit].power_w == pytest.approx(power, rel=1e-6)
    assert fit.block.power_w == pytest.approx(IDLE_W, rel=1e-6)
    assert reg.unit_energy(0, F) == (
        pytest.approx(380.0 * 0.012, rel=1e-6),
        pytest.approx(0, abs=1e-3),
    )
    assert reg.unit_energy(0, B) is None  # no time recorded for it
    assert reg.unit_energy(1, F) is None  # no such GPU


def test_noise_gives_a_standard_error_that_covers_the_error_and_shrinks_with_data():
    rng = np.random.default_rng(1)
    ses = []
    for seconds in (2.0, 8.0):
        reg = PowerRegression()
        reg.add(0, _windows(_timeline(rng, seconds), 0.1, noise=0.01, rng=rng))
        fit = reg.fit()[0]
        for unit, power in POWER.items():
            est = fit.units[unit]
            assert abs(est.power_w - power) < 4 * est.se_w
        ses.append(fit.units[F].se_w)
    assert ses[1] < 0.7 * ses[0]


def test_a_sensor_that_samples_the_period_tail_is_recognised():
    timeline = _timeline(np.random.default_rng(2), 6.0)
    reg = PowerRegression()
    reg.add(0, _windows(timeline, 0.1, tail=0.25))
    fit = reg.fit()[0]
    assert fit.model == MODELS[1]
    assert fit.units[F].power_w == pytest.approx(380.0, rel=1e-3)
    assert reg.model() == MODELS[1]


def test_kinds_that_always_run_together_fall_back_to_their_common_power():
    """With F and B in the same proportion in every window, only their mix is known: the
    weak prior puts both at the mix's power, and their standard errors stay wide."""
    rows = []
    for k in range(40):
        e = 0.05 * 380.0 + 0.05 * 330.0 + 0.0 * IDLE_W
        e *= 1 + 0.01 * math.sin(k)
        rows.append(WindowRow(e, 0.1, {F: 0.05, B: 0.05}))
    reg = PowerRegression()
    reg.add(0, rows)
    fit = reg.fit()[0]
    mix = (380.0 + 330.0) / 2
    assert fit.units[F].power_w == pytest.approx(mix, rel=0.02)
    assert fit.units[B].power_w == pytest.approx(mix, rel=0.02)
    assert fit.units[F].se_w > 10 * fit.units[F].power_w * 0.001


def test_a_gross_outlier_window_is_dropped_and_powers_are_never_negative():
    rows = _windows(_timeline(np.random.default_rng(3), 3.0), 0.1)
    bad = rows[5]
    rows[5] = WindowRow(bad.energy_j * 3, bad.time_s, bad.busy)
    reg = PowerRegression()
    reg.add(0, rows)
    fit = reg.fit()[0]
    assert fit.windows == len(rows) - 1
    assert fit.units[F].power_w == pytest.approx(380.0, rel=1e-3)
    tiny = PowerRegression()
    tiny.add(0, [WindowRow(0.0, 0.1, {F: 0.05}), WindowRow(1.0, 0.1, {F: 0.01})])
    assert all(e.power_w >= 0 for e in tiny.fit()[0].units.values())


def test_rounds_are_sized_for_the_slowest_counter():
    from perseus.schedulers.sweep.levels import counter_round_steps

    # 10 refreshes and the two partial ones at the ends, of the slowest counter (0.1 s).
    assert counter_round_steps([0.1, 0.05], 0.3, 10) == 4
    assert counter_round_steps([0.1], 5.0, 10) == 1
    assert counter_round_steps([0.1], 1e-5, 10) == 10_000  # at most MAX_ITERATIONS
    assert counter_round_steps([0.1, None], 0.3, 10) is None  # a rank that could not tell
    assert counter_round_steps([0.0, 0.0], 0.3, 10) is None  # continuous: any round will do
    assert counter_round_steps([0.1], None, 10) is None  # no iteration measured yet


def test_seconds_run_before_a_clock_change_lands_do_not_pull_their_clocks_power():
    """Rounds at all-max, and rounds with the backwards at 510 MHz: there each first forward
    and first backward run their first 15 ms at the previous clock, drawing that clock's
    power. Charged wholly to their own clocks' units, they pull those powers off; with the
    seconds before the change lands charged to the kind at the previous clock, every power
    comes out right (exactly, split per window; within 5 %, split by the round's share as
    `window_shares` does: a window that cuts an instruction holds its part in another
    proportion)."""
    low, f510 = (0, "backward", 510), (0, "forward", 510)
    power = {F: 380.0, B: 330.0, low: 150.0, f510: 170.0}
    lag = 0.015
    timeline = []  # (start, end, unit, unit before the change landed or None)
    t = 0.0
    for it in range(400):
        fwd, bwd = (F, B) if it % 40 < 20 else ((F, low) if it % 40 < 30 else (f510, B))
        order = [fwd, fwd, bwd, bwd]
        for index, unit in enumerate(order):
            switch = order[index - 1][2] != unit[2] and index in (0, 2)
            was = (0, unit[1], order[index - 1][2]) if switch else None
            d = {F: 0.012, B: 0.024, low: 0.05, f510: 0.03}[unit] + (0.01 if switch else 0.0)
            timeline.append((t, t + d, unit, was))
            t += d + 0.002 * (index % 3)
        t += 0.03

    def fit(shares, exact=False):
        rows = []
        for a in np.arange(0.0137, t - 0.1, 0.1):
            b, e, busy = a + 0.1, IDLE_W * 0.1, {}
            for s, f, unit, was in timeline:
                o = max(0.0, min(f, b) - max(s, a))
                if o <= 0:
                    continue
                o_old = max(0.0, min(f, b, s + lag) - max(s, a)) if was else 0.0
                e += o_old * (power[was] - IDLE_W) if was else 0.0
                e += (o - o_old) * (power[unit] - IDLE_W)
                split = [(was, o_old), (unit, o - o_old)] if exact else shares(unit, was, f - s, o)
                for k, seconds in split:
                    if seconds > 0:
                        busy[k] = busy.get(k, 0.0) + seconds
            rows.append(WindowRow(e, 0.1, busy))
        reg = PowerRegression()
        reg.add(0, rows)
        units = reg.fit()[0].units
        return {u: units[u].power_w / want - 1 for u, want in power.items()}

    def split(unit, was, d, o):  # as `window_shares`: the round's mean share, not the window's
        return [(was, o * lag / d), (unit, o * (1 - lag / d))] if was else [(unit, o)]

    as_own = fit(lambda unit, was, d, o: [(unit, o)])
    assert max(map(abs, as_own.values())) > 0.08  # the switches pull powers off
    assert max(map(abs, fit(None, exact=True).values())) < 1e-6
    # The round's share instead of each window's: off where a window cuts an instruction.
    shared = fit(split)
    assert max(map(abs, shared.values())) < min(0.05, max(map(abs, as_own.values())) / 2)
