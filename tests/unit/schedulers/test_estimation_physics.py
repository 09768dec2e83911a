"""The power fit knows what a GPU can draw: monotone in the clock, within idle and the
limit, and the power that lingers after work stops is not charged to the instructions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perseus.protocol import AFTER_WORK_EDGES_S
from perseus.schedulers.measurement import WindowRow
from perseus.schedulers.sweep.power_fit import GPUBounds, PowerRegression, fit_windows

IDLE_W = 60.0
LIMIT_W = 400.0


def _timeline(rng, power: dict, seconds: float, gap_s: float = 0.03):
    """Instructions of the units in `power` (cycled: a warm-up of one kind, then the other),
    back to back with small jitter, a bubble after each pass."""
    units = sorted(power)
    out, t = [], 0.0
    while t < seconds:
        for k, unit in enumerate(units):
            d = 0.010 + 0.002 * (k % 3)
            for _ in range(3 + k % 2):
                out.append((t, t + d, unit))
                t += d + float(rng.uniform(0.0, 0.002))
        t += gap_s
    return out


def _windows(timeline, power: dict, *, period=0.1, noise=0.0, tau_s=0.0, rng=None):
    """What a rank reports: the energy between refreshes (with power decaying to idle after
    each instruction, time constant `tau_s`), busy seconds per unit, and the idle seconds in
    each band after each unit's work stopped."""
    ends = [f for _, f, _ in timeline]
    nexts = [s for s, _, _ in timeline[1:]] + [math.inf]

    def energy(a: float, b: float) -> float:
        e = IDLE_W * (b - a)
        for (s, f, u), nxt in zip(timeline, nexts, strict=True):
            e += max(0.0, min(f, b) - max(s, a)) * (power[u] - IDLE_W)
            if tau_s > 0:  # the tail: (P − idle)·exp(−(t − f)/τ) until the next starts
                lo, hi = max(f, a), min(nxt, b)
                if hi > lo:
                    amp = power[u] - IDLE_W
                    e += amp * tau_s * (math.exp(-(lo - f) / tau_s) - math.exp(-(hi - f) / tau_s))
        return e

    rows = []
    for a in np.arange(0.0137, ends[-1] - period, period):
        b = a + period
        busy: dict = {}
        after: dict = {}
        for (s, f, u), nxt in zip(timeline, nexts, strict=True):
            o = max(0.0, min(f, b) - max(s, a))
            if o > 0:
                busy[u] = busy.get(u, 0.0) + o
            low = 0.0
            for k, high in enumerate(AFTER_WORK_EDGES_S):
                lo, hi = max(f + low, a), min(f + high, nxt, b)
                if hi > lo:
                    after.setdefault(u, [0.0] * len(AFTER_WORK_EDGES_S))[k] += hi - lo
                low = high
        e = energy(a, b)
        if noise:
            e *= 1 + noise * rng.standard_normal()
        rows.append(WindowRow(e, period, busy, after={u: tuple(v) for u, v in after.items()}))
    return rows


def _curve(top_w: float) -> dict:
    """Forward and backward of one stage at three clocks: a power-capped flat top."""
    return {
        (0, "forward", 900): top_w * 0.6,
        (0, "forward", 1200): top_w,
        (0, "forward", 1410): top_w,
        (0, "backward", 900): top_w * 0.55,
        (0, "backward", 1200): top_w * 0.95,
        (0, "backward", 1410): top_w * 0.95,
    }


@pytest.mark.parametrize("seed", range(6))
def test_a_power_curve_never_falls_as_the_clock_rises(seed):
    rng = np.random.default_rng(seed)
    power = _curve(380.0)
    rows = _windows(_timeline(rng, power, 6.0), power, noise=0.03, rng=rng)
    fit = fit_windows(rows, bounds=GPUBounds(IDLE_W, LIMIT_W))
    assert fit is not None
    for kind in ("forward", "backward"):
        p = [fit.units[0, kind, f].power_w for f in (900, 1200, 1410)]
        assert p[0] <= p[1] + 1e-6 <= p[2] + 2e-6, (kind, p)


@pytest.mark.parametrize("seed", range(4))
def test_no_power_above_the_limit_reaches_the_profile(seed):
    """A kernel at the cap draws the limit: noise would put half its estimates above it."""
    rng = np.random.default_rng(seed)
    power = _curve(LIMIT_W)
    rows = _windows(_timeline(rng, power, 4.0), power, noise=0.05, rng=rng)
    fit = fit_windows(rows, bounds=GPUBounds(IDLE_W, LIMIT_W))
    assert fit is not None
    assert max(e.power_w for e in fit.units.values()) <= LIMIT_W + 1e-6
    assert IDLE_W - 1e-6 <= fit.block.power_w <= LIMIT_W + 1e-6
    assert not fit.unphysical


def test_a_power_below_idle_is_named_unphysical():
    """Windows that say a kernel draws less than the idle GPU (here, a clock whose energy
    was under-reported): the fit says the unit cannot be trusted (the profile leaves it
    out), and the other units keep their powers."""
    rng = np.random.default_rng(0)
    power = _curve(300.0)
    truth = dict(power)
    power[0, "backward", 900] = 20.0  # what the windows (wrongly) show
    rows = _windows(_timeline(rng, power, 4.0), power, noise=0.0)
    fit = fit_windows(rows, bounds=GPUBounds(IDLE_W, LIMIT_W))
    assert fit is not None
    assert (0, "backward", 900) in fit.unphysical
    assert "idle" in fit.unphysical[0, "backward", 900]
    assert set(fit.unphysical) == {(0, "backward", 900)}, fit.unphysical
    for u, p in truth.items():
        if u != (0, "backward", 900):
            assert fit.units[u].power_w == pytest.approx(p, rel=0.01), u


@pytest.mark.parametrize("tau_s", [0.003, 0.01, 0.03])
def test_power_after_work_stops_is_not_charged_to_the_instructions(tau_s):
    rng = np.random.default_rng(1)
    power = _curve(300.0)
    rows = _windows(_timeline(rng, power, 8.0, gap_s=0.12), power, tau_s=tau_s)
    with_bands = fit_windows(rows, bounds=GPUBounds(IDLE_W, LIMIT_W))
    blind = [WindowRow(r.energy_j, r.time_s, r.busy) for r in rows]  # an older client's
    without = fit_windows(blind, bounds=GPUBounds(IDLE_W, LIMIT_W))
    assert with_bands is not None and without is not None
    err = {u: abs(with_bands.units[u].power_w / p - 1) for u, p in power.items()}
    err_blind = {u: abs(without.units[u].power_w / p - 1) for u, p in power.items()}
    assert max(err.values()) < 0.02, err
    assert max(err_blind.values()) > 2 * max(err.values()), (err, err_blind)
    assert with_bands.decay[0] > with_bands.decay[-1]  # the first band draws the most


def test_stated_errors_cover_the_truth():
    """Over many noisy fits, the truth lies within 2 stated standard errors of ~95 % of the
    estimates (the target is 90 %)."""
    hits = total = 0
    power = _curve(300.0)
    for seed in range(30):
        rng = np.random.default_rng(100 + seed)
        rows = _windows(_timeline(rng, power, 3.0), power, noise=0.02, rng=rng)
        reg = PowerRegression({0: GPUBounds(IDLE_W, LIMIT_W)})
        reg.add(0, rows)
        fit = reg.fit()[0]
        for u, p in power.items():
            est = fit.units[u]
            hits += abs(est.power_w - p) <= 2 * est.se_w
            total += 1
    assert hits / total >= 0.9, hits / total


def test_a_row_s_energy_is_its_fitted_power_times_the_row_s_time():
    """An instruction's energy is its fitted power times the time the profile states for it.
    The mean of the times the windows saw includes the few instructions stretched while a
    clock change landed (here 20 % of them, 30 % longer): with it, a unit at the cap read
    above the power limit (421 W on a 400 W A100, in an e2e job of 2026-11-29)."""
    rng = np.random.default_rng(0)
    power = _curve(LIMIT_W)
    rows = _windows(_timeline(rng, power, 4.0), power, noise=0.02, rng=rng)
    regression = PowerRegression({0: GPUBounds(IDLE_W, LIMIT_W)})
    regression.add(0, rows)
    unit = (0, "forward", 1410)
    row_time_s = 0.010
    regression.add_time(0, unit, 8 * row_time_s + 2 * 1.3 * row_time_s, 10)
    assert regression.mean_time_s(0, unit) > row_time_s * 1.05
    fitted_w = regression.fit()[0].units[unit].power_w
    assert fitted_w <= LIMIT_W + 1e-6
    energy_j, se_j = regression.unit_energy(0, unit, row_time_s)
    assert energy_j == pytest.approx(fitted_w * row_time_s)
    assert energy_j / row_time_s <= LIMIT_W + 1e-6
    assert se_j == pytest.approx(regression.fit()[0].units[unit].se_w * row_time_s)
    mean_energy_j, _ = regression.unit_energy(0, unit)  # the windows' mean time
    assert mean_energy_j / row_time_s > LIMIT_W
