"""Per-instruction power from what a GPU shows: least squares over energy windows.

An instruction's own energy cannot be read on a real GPU: the counter refreshes every
100 ms (``docs/measurements/h100-2026-11-24``) and instructions last milliseconds. What a
rank can report exactly is the energy between two refreshes, and which instructions ran in
between, for how long (`perseus.protocol.EnergyWindow`). For one GPU, window ``w`` is

    E_w = Σ_u p_u · busy_{w,u} + P_block · idle_w + ε_w

where ``u`` is a (stage, kind, clock) unit, ``p_u`` its power, ``busy_{w,u}`` the seconds it
ran in the window, ``idle_w`` the rest (blocked on a peer, in a bubble, between steps) and
``ε_w`` the sensor's noise and the timing jitter of the refreshes. The instructions'
durations come from the GPU's own timing; the powers and the blocking power are unknowns,
fitted by weighted least squares over every window of every round so far, each with its
standard error. An instruction's energy is then its power times its mean measured time.

What makes F and B of one stage at one clock separable is time: an iteration is not
uniform at the scale of a refresh (a 1F1B stage runs its warm-up forwards together and
its cool-down backwards together), so windows hold them in different proportions. Round
totals alone could not: every iteration runs as many forwards as backwards, so only their
sum would be known (the plan's energy needs only that sum, but the profile's rows do not).
Where instructions are much shorter than a refresh the split is weakly determined. The fit
therefore carries a weak prior: kinds of one stage at one clock draw powers within about
`PRIOR_SPREAD` of the GPU's mean power of each other (pseudo-observations of their
difference). Windows that tell them apart override it; where they cannot, the estimates
fall back to the kinds' common power, and the standard errors (which include the prior)
say how little the windows told.

What a GPU can draw bounds the fit. The windows are fitted for each (stage, kind) as a
curve over its clocks that does not fall as the clock rises: its power at its highest clock
and a non-negative step down to each lower clock. A lower clock never draws more power for
the same work, and the curve pools what its clocks' windows say, so a clock measured in few
windows no longer stands alone. The curve's top, and so all of it, is at most the GPU's power
limit; the top and the blocking power are at least its idle power (`GPUBounds`, as the rank
reported them; else 0 and no limit). A unit whose fitted power cannot be told from idle
(within 2 standard errors and a quarter of it: no instruction draws that little) is named in `GPUFit.unphysical`: the profile leaves it out
(`perseus.schedulers.sweep.option_estimates`). Standard errors come from the windows' own residuals (a
heteroskedasticity-robust sandwich, never below the classical figure), so a misfit widens
them.

A GPU's power does not fall to idle the moment its work stops. Windows carry, per unit, the
idle seconds in bands after its instructions ended (`WindowRow.after`), and in band ``k``
the GPU draws ``P_block + g_k · (p_u − P_block)``: one share ``g_k`` in [0, 1] per band and
GPU (`GPUFit.decay`). The model is bilinear; the powers and the shares are fitted together
by Gauss–Newton, each fit starting from the GPU's last shares.

An instruction that starts while a clock change lands runs at the previous clock until the
change lands (the rank's measured switch latency) and draws that clock's power: those
seconds count for its kind at the previous clock, not for its own clock's unit
(`perseus.schedulers.measurement.window_shares`).

On A100 and H100 the sensor samples only about the last 25 % of each period (arXiv
2312.02741): a refresh then shows that part's mean power times the period. Windows also
carry the busy seconds inside those tails, and the fit is made both ways; the model with
the smaller residual (over every GPU of the job) is kept and reported.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import lsq_linear

from perseus.schedulers.measurement import Unit, WindowRow

__all__ = [
    "GPUBounds",
    "GPUFit",
    "MODELS",
    "PowerRegression",
    "UnitEstimate",
    "fit_windows",
]

logger = logging.getLogger(__name__)

MODELS = ("whole period", "period tail")
"""How a refresh samples its period: all of it, or its last `SAMPLED_TAIL`."""

_OUTLIER_SD = 5.0
"""Windows whose residual is this many standard deviations off are dropped."""
PRIOR_SPREAD = 0.25
"""The prior's standard deviation of the power difference between two kinds of one stage at
one clock, as a share of the GPU's mean power."""


@dataclass(frozen=True)
class GPUBounds:
    """What a GPU can draw: its idle power and its power limit (W), as its rank reported them
    (None: not known)."""

    idle_w: float | None = None
    limit_w: float | None = None

    @property
    def low_w(self) -> float:
        return self.idle_w if self.idle_w is not None else 0.0

    @property
    def high_w(self) -> float:
        return self.limit_w if self.limit_w is not None else math.inf


_GN_PASSES = 4
"""Gauss-Newton passes of the powers and the decay shares, at most (each fit starts from the
GPU's last shares, so a later fit needs one or two)."""
_AT_BOUND = 0.01
_NEAR_IDLE = 0.25
"""A fitted power within `_AT_BOUND` of the idle power, or within 2 of its standard errors
of it and at most `_NEAR_IDLE` above it, cannot be told from idle: no instruction draws
that little."""


@dataclass(frozen=True)
class UnitEstimate:
    """A unit's fitted power and its standard error (inf: the windows cannot tell it)."""

    power_w: float
    se_w: float


@dataclass(frozen=True)
class GPUFit:
    """One GPU's fit: every unit's power, the blocking power, how well the windows fit."""

    units: dict[Unit, UnitEstimate]
    block: UnitEstimate
    model: str
    windows: int
    rms_j: float
    """Root-mean-square residual per window."""
    unphysical: dict[Unit, str] = field(default_factory=dict)
    """Units whose fitted power a GPU cannot draw, and why."""
    decay: list[float] = field(default_factory=list)
    """Per band after work stopped (`WindowRow.after`), the share of the last instruction's
    power above blocking the GPU still draws there (none without such windows)."""


class PowerRegression:
    """Energy windows of every GPU (rank) of a job, and the least-squares fit of each."""

    def __init__(self, bounds: Mapping[int, GPUBounds] | None = None) -> None:
        self._bounds = dict(bounds or {})
        self._rows: dict[int, list[WindowRow]] = {}
        self._time: dict[int, dict[Unit, list[float]]] = {}
        self._fits: dict[int, GPUFit] | None = None
        self._decay: dict[tuple[int, str], list[float]] = {}
        """Each GPU's last decay shares per sampling model: where its next fit starts."""

    @property
    def ranks(self) -> list[int]:
        return sorted(self._rows)

    def windows(self, rank: int) -> int:
        return len(self._rows.get(rank, ()))

    def add(self, rank: int, rows: Iterable[WindowRow]) -> None:
        """More windows of one GPU."""
        self._rows.setdefault(rank, []).extend(rows)
        self._fits = None

    def add_time(self, rank: int, unit: Unit, total_s: float, count: int) -> None:
        """`count` instructions of `unit` ran `total_s` seconds in all on `rank`."""
        acc = self._time.setdefault(rank, {}).setdefault(unit, [0.0, 0])
        acc[0] += total_s
        acc[1] += count

    def mean_time_s(self, rank: int, unit: Unit) -> float | None:
        acc = self._time.get(rank, {}).get(unit)
        return None if acc is None or acc[1] == 0 else acc[0] / acc[1]

    # ------------------------------------------------------------------ fitting
    def fit(self) -> dict[int, GPUFit]:
        """Every GPU's fit, under the sampling model that explains the windows best."""
        if self._fits is not None:
            return self._fits
        by_model: dict[str, dict[int, GPUFit]] = {m: {} for m in MODELS}
        score = dict.fromkeys(MODELS, 0.0)
        for rank, rows in self._rows.items():
            for model in MODELS:
                last = self._decay.get((rank, model))
                fit = fit_windows(rows, model, self._bounds.get(rank), last)
                if fit is None:
                    score[model] = math.inf
                    continue
                by_model[model][rank] = fit
                self._decay[rank, model] = fit.decay
                score[model] += fit.rms_j**2 * fit.windows
        best = min(MODELS, key=lambda m: (score[m], MODELS.index(m)))
        if self._rows and score[best] < math.inf and score[MODELS[0]] != score[best]:
            logger.info(
                "The energy windows fit best when each refresh samples only its period's "
                "tail (residual %.3g vs %.3g J²)",
                score[best],
                score[MODELS[0]],
            )
        self._fits = by_model[best] if score[best] < math.inf else {}
        return self._fits

    def model(self) -> str | None:
        fits = self.fit()
        return next(iter(fits.values())).model if fits else None

    def unit_energy(
        self, rank: int, unit: Unit, time_s: float | None = None
    ) -> tuple[float, float] | None:
        """(energy J, standard error J) of one instruction of `unit` on `rank`: its fitted
        power times `time_s` (default: its mean measured time); None when the unit has no
        data."""
        fit = self.fit().get(rank)
        t = self.mean_time_s(rank, unit)
        if t is not None and time_s is not None:
            t = time_s
        if fit is None or t is None or unit not in fit.units:
            return None
        est = fit.units[unit]
        return est.power_w * t, est.se_w * t


def _design(
    rows: list[WindowRow], model: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[Unit]]:
    """(X, y, weights, after, units): one row per window, a column per unit and one for its
    idle seconds; ``after[k, w, u]`` the seconds of band k after unit u's work stopped."""
    units = sorted({u for r in rows for u in r.busy})
    col = {u: i for i, u in enumerate(units)}
    bands = max((len(v) for r in rows for v in r.after.values()), default=0)
    x_rows, y, w, a_rows = [], [], [], []
    for r in rows:
        if model == MODELS[0]:
            busy, span, scale, after = r.busy, r.time_s, 1.0, r.after
        else:
            if r.tail_s <= 0:
                continue
            busy, span, scale = r.tail_busy, r.tail_s, r.time_s / r.tail_s
            after = r.tail_after
        x = np.zeros(len(units) + 1)
        for u, s in busy.items():
            x[col[u]] += s * scale
        x[-1] = max(span - sum(busy.values()), 0.0) * scale
        a = np.zeros((bands, len(units)))
        for u, secs in after.items():
            if u in col:
                a[: len(secs), col[u]] = np.asarray(secs) * scale
        x_rows.append(x)
        a_rows.append(a)
        y.append(r.energy_j)
        w.append(1.0 / max(r.time_s, 1e-6))  # noise grows with the refreshes inside
    after_arr = np.stack(a_rows, axis=1) if a_rows else np.zeros((bands, 0, len(units)))
    return np.array(x_rows), np.array(y), np.array(w), after_arr, units


def _prior_rows(units: list[Unit], scale_w: float) -> np.ndarray:
    """Pseudo-observations ``(p_a − p_b) / scale_w = 0`` for the kinds of one stage at one
    clock (consecutive pairs): the weak prior that they draw similar power."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (stage, _, freq) in enumerate(units):
        groups.setdefault((stage, freq), []).append(i)
    rows = []
    for members in groups.values():
        for a, b in itertools.pairwise(members):
            row = np.zeros(len(units) + 1)
            row[a], row[b] = 1.0 / scale_w, -1.0 / scale_w
            rows.append(row)
    return np.array(rows).reshape(len(rows), len(units) + 1)


def _monotone_map(units: list[Unit]) -> tuple[np.ndarray, np.ndarray]:
    """(C, anchors) with ``power = C @ θ``: per (stage, kind), θ holds the power at its
    highest clock (an anchor) and, for each lower clock, the non-negative step from it up to
    the next clock (units are sorted, so a group's clocks rise). Bounding the anchors by the
    power limit bounds the whole curve."""
    n = len(units)
    c = np.zeros((n, n))
    anchors = []
    start = 0
    for i in range(n + 1):
        if i == n or (i > start and units[i][:2] != units[start][:2]):
            top = i - 1
            anchors.append(top)
            for k in range(start, i):
                c[k, top] = 1.0
                c[k, k:top] -= 1.0
            start = i
    return c, np.array(anchors, dtype=int)


def fit_windows(
    rows: list[WindowRow],
    model: str = MODELS[0],
    bounds: GPUBounds | None = None,
    decay: Sequence[float] | None = None,
) -> GPUFit | None:
    """One GPU's fit to its windows under one sampling `model` (None: no usable window).

    `decay`: the shares of the GPU's last fit (`GPUFit.decay`) to start from (none: 0);
    then at most `_GN_PASSES` Gauss-Newton passes fit them with the powers."""
    bounds = bounds or GPUBounds()
    x, y, w, after, units = _design(rows, model)
    if len(y) == 0:
        return None
    bands = after.shape[0] if after.any() else 0
    if bands == 0:
        return _fit_powers(x, y, w, units, bounds, model, np.zeros(0), after[:0])
    warm = decay is not None and len(decay) == bands
    shares = np.asarray(decay, float) if warm else np.zeros(bands)
    fit = _fit_powers(x, y, w, units, bounds, model, shares, after)
    # Gauss-Newton on the bilinear model: the shares and the powers fitted together, each
    # band's regressor linearised at the last powers.
    for _ in range(_GN_PASSES):
        powers = np.array([e.power_w for e in fit.units.values()])
        z = np.stack([after[k] @ (powers - fit.block.power_w) for k in range(bands)], axis=1)
        fit = _fit_powers(x, y + z @ shares, w, units, bounds, model, shares, after, z)
        last, shares = shares, np.asarray(fit.decay)
        if np.abs(shares - last).max() < 0.005:
            break
    return fit


def _fit_powers(
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    units: list[Unit],
    bounds: GPUBounds,
    model: str,
    shares: np.ndarray,
    after: np.ndarray,
    z: np.ndarray | None = None,
) -> GPUFit:
    """The bounded, monotone fit of every unit's power and the blocking power, each band
    after work stopped drawing `shares` of its instruction's power above blocking; with `z`
    (per window and band, the linearised regressor of each share), the shares too."""
    n = len(y)
    nu = len(units)
    if len(shares):
        extra = np.tensordot(shares, after, axes=1)  # (windows, units): seconds at p_u
        x = x.copy()
        x[:, :nu] += extra
        x[:, -1] -= extra.sum(axis=1)
    nz = 0 if z is None else z.shape[1]
    if z is not None:
        x = np.column_stack([x[:, :-1], z, x[:, -1:]])
    p = nu + nz + 1
    # Parameters: per (stage, kind) its highest clock's power and steps down, the shares,
    # then blocking.
    c = np.eye(p)
    c[:nu, :nu], anchors = _monotone_map(units)
    xc = x @ c
    scale_w = PRIOR_SPREAD * float(np.sum(y) / max(np.sum(x[:, :nu]) + np.sum(x[:, -1]), 1e-12))
    prior = _prior_rows(units, max(scale_w, 1e-6))
    prior = np.column_stack([prior[:, :-1], np.zeros((len(prior), nz)), prior[:, -1:]]) @ c
    keep = np.ones(n, dtype=bool)
    # The windows' own noise, from the plain least-squares fit (dropping gross outliers).
    sigma2 = math.inf
    for _ in range(2):
        sw = np.sqrt(w[keep])
        xs, ys = x[keep] * sw[:, None], y[keep] * sw
        beta, _, rank, _ = np.linalg.lstsq(xs, ys, rcond=None)
        resid = ys - xs @ beta
        dof = int(keep.sum()) - int(rank)
        sigma2 = float(resid @ resid) / dof if dof > 0 else math.inf
        if not (math.isfinite(sigma2) and sigma2 > 0):
            break
        outliers = keep & (np.abs((y - x @ beta) * np.sqrt(w)) > _OUTLIER_SD * math.sqrt(sigma2))
        if not outliers.any() or (keep & ~outliers).sum() <= p:
            break
        keep &= ~outliers
    # Then the bounded, monotone fit with the prior, whose rows count in units of that noise.
    sigma = math.sqrt(sigma2) if math.isfinite(sigma2) else 0.0
    sw = np.sqrt(w[keep])
    xs, ys = xc[keep] * sw[:, None], y[keep] * sw
    a = np.vstack([xs, prior * max(sigma, 1e-12)]) if len(prior) else xs
    b = np.concatenate([ys, np.zeros(len(prior))])
    low, high = bounds.low_w, bounds.high_w
    lower = np.zeros(p)
    upper = np.full(p, high - low if math.isfinite(high) else np.inf)
    lower[anchors], upper[anchors] = low, high
    lower[-1], upper[-1] = low, high
    lower[nu : nu + nz], upper[nu : nu + nz] = 0.0, 1.0
    upper = np.maximum(upper, lower + 1e-9)
    # The same least squares on the triangular factor of [a b]: p rows, not one per window.
    r = _triangular(a, b)
    theta = lsq_linear(r[:, :-1], r[:, -1], bounds=(lower, upper), method="bvls").x
    beta = c @ theta
    resid_w = ys - xs @ theta
    se = _sandwich_errors(a, r[:, :-1], c, resid_w, sigma2, n_data=len(ys))
    rms = float(np.sqrt(np.mean((y[keep] - x[keep] @ beta) ** 2)))
    unphysical: dict[Unit, str] = {}
    for i, u in enumerate(units):  # none is above the limit: the curve's top is bounded
        noise = min(2 * se[i], _NEAR_IDLE * low) if math.isfinite(se[i]) else 0.0
        margin = max(_AT_BOUND * max(low, 1.0), noise)
        if (bounds.idle_w is not None and beta[i] <= low + margin) or beta[i] < 1.0:
            unphysical[u] = (
                f"its power cannot be told from the GPU's idle power ({low:.0f} W)"
                if bounds.idle_w is not None
                else "the windows ask for no power at all"
            )
    return GPUFit(
        units={u: UnitEstimate(float(beta[i]), float(se[i])) for i, u in enumerate(units)},
        block=UnitEstimate(float(beta[-1]), float(se[-1])),
        model=model,
        windows=int(keep.sum()),
        rms_j=rms,
        unphysical=unphysical,
        decay=[float(v) for v in (beta[nu : nu + nz] if nz else shares)],
    )


def _triangular(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """R of the QR factorisation of ``[a b]`` (``[a b]`` itself when it has no more rows
    than columns): ``‖aθ − b‖² = ‖R[:, :-1]θ − R[:, -1]‖² + const``."""
    ab = np.column_stack([a, b])
    if ab.shape[0] <= ab.shape[1]:
        return ab
    return np.linalg.qr(ab, mode="r")


def _sandwich_errors(
    a: np.ndarray,
    r: np.ndarray,
    c: np.ndarray,
    resid: np.ndarray,
    sigma2: float,
    *,
    n_data: int,
) -> np.ndarray:
    """Standard errors of ``c @ θ`` for the fit of `a` (its first `n_data` rows windows with
    residuals `resid`, then the prior's rows, whose noise is σ²): the robust sandwich
    ``B (Σ rᵢ² aᵢaᵢᵀ · n/(n−p) + σ² Σ_prior aⱼaⱼᵀ) B``, ``B = (AᵀA)⁺`` (from `r`, whose
    ``RᵀR`` is ``AᵀA``); inf where the rows cannot tell a parameter apart (a null direction
    loads on it) or σ² is unknown."""
    p = a.shape[1]
    if not math.isfinite(sigma2) or n_data <= 0:
        return np.full(p, math.inf)
    _, s, vt = np.linalg.svd(r, full_matrices=False)
    tol = s.max(initial=0.0) * max(a.shape) * np.finfo(float).eps * 1e3
    good = s > tol
    bread = (vt[good].T / s[good] ** 2) @ vt[good]
    data = a[:n_data]
    dof_scale = n_data / max(n_data - int(good.sum()), 1)
    meat = (data * (resid**2 * dof_scale)[:, None]).T @ data
    meat += sigma2 * (a[n_data:].T @ a[n_data:])
    robust = np.einsum("ij,jk,ik->i", c @ bread, meat, c @ bread)
    # Never below the classical figure: a window's residual can be small by chance.
    classical = sigma2 * np.einsum("ij,jk,ik->i", c, bread, c)
    se = np.sqrt(np.clip(np.maximum(robust, classical), 0.0, None))
    null = vt[~good] @ c.T
    if len(null):
        se[np.abs(null).max(axis=0) > 1e-6] = math.inf
    if len(s) < p:  # fewer rows than unknowns
        se[:] = math.inf
    return se
