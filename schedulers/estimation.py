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
say how little the windows told. Powers are bounded below by 0 (bounded least squares).

An instruction that starts while a clock change lands runs at the previous clock until the
change lands (the rank's measured switch latency) and draws that clock's power: those
seconds count for its kind at the previous clock, not for its own clock's unit
(`schedulers.measurement.window_shares`).

On A100 and H100 the sensor samples only about the last 25 % of each period (arXiv
2312.02741): a refresh then shows that part's mean power times the period. Windows also
carry the busy seconds inside those tails, and the fit is made both ways; the model with
the smaller residual (over every GPU of the job) is kept and reported.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import lsq_linear

__all__ = [
    "GPUFit",
    "MODELS",
    "PowerRegression",
    "Unit",
    "UnitEstimate",
    "WindowRow",
    "fit_windows",
]

logger = logging.getLogger(__name__)

Unit = tuple[int, str, int]
"""(pipeline stage, instruction kind, SM clock in MHz)."""

MODELS = ("whole period", "period tail")
"""How a refresh samples its period: all of it, or its last `SAMPLED_TAIL`."""

_OUTLIER_SD = 5.0
"""Windows whose residual is this many standard deviations off are dropped."""
PRIOR_SPREAD = 0.25
"""The prior's standard deviation of the power difference between two kinds of one stage at
one clock, as a share of the GPU's mean power."""


@dataclass(frozen=True)
class WindowRow:
    """One energy window, its busy seconds keyed by unit (`Parallel3D.measure` maps them)."""

    energy_j: float
    time_s: float
    busy: Mapping[Unit, float]
    tail_s: float = 0.0
    tail_busy: Mapping[Unit, float] = field(default_factory=dict)


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


class PowerRegression:
    """Energy windows of every GPU (rank) of a job, and the least-squares fit of each."""

    def __init__(self) -> None:
        self._rows: dict[int, list[WindowRow]] = {}
        self._time: dict[int, dict[Unit, list[float]]] = {}
        self._fits: dict[int, GPUFit] | None = None

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
                fit = fit_windows(rows, model)
                if fit is None:
                    score[model] = math.inf
                    continue
                by_model[model][rank] = fit
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

    def unit_energy(self, rank: int, unit: Unit) -> tuple[float, float] | None:
        """(energy J, standard error J) of one instruction of `unit` on `rank`: its fitted
        power times its mean measured time; None when the unit has no data."""
        fit = self.fit().get(rank)
        t = self.mean_time_s(rank, unit)
        if fit is None or t is None or unit not in fit.units:
            return None
        est = fit.units[unit]
        return est.power_w * t, est.se_w * t


def _design(
    rows: list[WindowRow], model: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Unit]]:
    """(X, y, weights, units): one row per window, a column per unit and one for idle."""
    units = sorted({u for r in rows for u in r.busy})
    col = {u: i for i, u in enumerate(units)}
    x_rows, y, w = [], [], []
    for r in rows:
        if model == MODELS[0]:
            busy, span, scale = r.busy, r.time_s, 1.0
        else:
            if r.tail_s <= 0:
                continue
            busy, span, scale = r.tail_busy, r.tail_s, r.time_s / r.tail_s
        x = np.zeros(len(units) + 1)
        for u, s in busy.items():
            x[col[u]] += s * scale
        x[-1] = max(span - sum(busy.values()), 0.0) * scale
        x_rows.append(x)
        y.append(r.energy_j)
        w.append(1.0 / max(r.time_s, 1e-6))  # noise grows with the refreshes inside
    return np.array(x_rows), np.array(y), np.array(w), units


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


def fit_windows(rows: list[WindowRow], model: str = MODELS[0]) -> GPUFit | None:
    """One GPU's fit to its windows under one sampling `model` (None: no usable window)."""
    x, y, w, units = _design(rows, model)
    n = len(y)
    p = len(units) + 1
    if n == 0:
        return None
    scale_w = PRIOR_SPREAD * float(np.sum(y) / max(np.sum(x), 1e-12))  # of the mean power
    prior = _prior_rows(units, max(scale_w, 1e-6))
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
    # Then the bounded fit with the prior, whose rows count in units of that noise.
    sigma = math.sqrt(sigma2) if math.isfinite(sigma2) else 0.0
    sw = np.sqrt(w[keep])
    xs, ys = x[keep] * sw[:, None], y[keep] * sw
    a = np.vstack([xs, prior * max(sigma, 1e-12)]) if len(prior) else xs
    b = np.concatenate([ys, np.zeros(len(prior))])
    beta = lsq_linear(a, b, bounds=(np.zeros(p), np.inf), method="bvls").x
    se = _standard_errors(a, sigma2 if math.isfinite(sigma2) else math.inf)
    rms = float(np.sqrt(np.mean((y[keep] - x[keep] @ beta) ** 2)))
    return GPUFit(
        units={u: UnitEstimate(float(beta[i]), float(se[i])) for i, u in enumerate(units)},
        block=UnitEstimate(float(beta[-1]), float(se[-1])),
        model=model,
        windows=int(keep.sum()),
        rms_j=rms,
    )


def _standard_errors(xs: np.ndarray, sigma2: float) -> np.ndarray:
    """Per coefficient, sqrt(σ² · (XᵀX)⁻¹)ᵢᵢ; inf where the columns cannot tell it apart
    from the others (a direction of the null space loads on it) or σ² is unknown."""
    p = xs.shape[1]
    if not math.isfinite(sigma2):
        return np.full(p, math.inf)
    _, s, vt = np.linalg.svd(xs, full_matrices=False)
    tol = s.max(initial=0.0) * max(xs.shape) * np.finfo(float).eps * 1e3
    good = s > tol
    cov = (vt[good].T / s[good] ** 2) @ vt[good] * sigma2
    se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    null = vt[~good]
    if len(null):
        se[np.abs(null).max(axis=0) > 1e-6] = math.inf
    if len(s) < p:  # fewer rows than unknowns
        se[:] = math.inf
    return se
