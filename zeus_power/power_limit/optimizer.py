"""`GlobalPowerLimitOptimizer`: the state machine that profiles each power limit for a
number of training steps and then applies the optimum (its states in
`zeus_power.power_limit.states`, its selectors in `zeus_power.power_limit.selectors`).

Power limits are in watts throughout; the device's milliwatts appear only at the device
call. Compared with Zeus: `warmup_steps=0` works, the minimum power limit is always
profiled, a window that measures 0 J does not crash a selector, epochs too short to ever
finish a window raise a warning, and with several ranks each window's time (max) and
energy (sum) are all-reduced over the default process group.
"""

from __future__ import annotations

import logging
import math
import sys
import warnings
from pathlib import Path

from pydantic import ValidationError

from zeus_power.errors import ZeusConfigError, ZeusProfileError
from zeus_power.monitor import ZeusMonitor, aggregate_over_ranks
from zeus_power.power_limit.selectors import (
    OptimumSelector,
    PowerLimitMeasurement,
    Time,
)
from zeus_power.power_limit.states import (
    PROFILE_VERSION,
    Done,
    PowerLimitProfile,
    Profiling,
    Ready,
    ShortEpochWarning,
    State,
    Warmup,
)

__all__ = ["GlobalPowerLimitOptimizer"]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- optimizer


def _rank() -> int:
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


class GlobalPowerLimitOptimizer:
    """Optimizer for the power limit knob, applied to all of the monitor's GPUs.

    Call `on_step_begin` at the beginning of every training step and `on_epoch_end` at
    the end of every epoch. GPU indices are taken from `monitor.gpu_indices`.

    Args:
        monitor: The `ZeusMonitor` measuring the GPUs to optimise.
        optimum_selector: How to pick the optimum; default `Time()`.
        wait_steps: Steps to let pass before profiling (e.g. for `torch.backends.cudnn.benchmark`).
        warmup_steps: Warmup steps at each power limit (0: none).
        profile_steps: Profiling steps at each power limit (>= 1).
        pl_step: Stride between the power limits to explore, in watts.
        profile_path: An existing file is loaded and no profiling happens; a missing
            file is written when profiling finishes; None does neither.
    """

    def __init__(
        self,
        monitor: ZeusMonitor,
        optimum_selector: OptimumSelector | None = None,
        wait_steps: int = 1,
        warmup_steps: int = 10,
        profile_steps: int = 40,
        pl_step: int = 25,
        profile_path: str | Path | None = None,
    ) -> None:
        for name, value, minimum in (
            ("wait_steps", wait_steps, 0),
            ("warmup_steps", warmup_steps, 0),
            ("profile_steps", profile_steps, 1),
            ("pl_step", pl_step, 1),
        ):
            if not isinstance(value, int) or value < minimum:
                raise ZeusConfigError(f"{name} must be an integer >= {minimum}, got {value!r}.")
        self.monitor = monitor
        self.optimum_selector = optimum_selector if optimum_selector is not None else Time()
        self.warmup_steps = warmup_steps
        self.profile_steps = profile_steps
        self.pl_step = pl_step
        self.profile_path = Path(profile_path) if profile_path is not None else None
        self.gpus = list(monitor.gpus)

        constraints = {gpu.index: gpu.power_limit_constraints_mw() for gpu in self.gpus}
        if len(set(constraints.values())) != 1:
            raise ZeusConfigError(
                f"Power limit ranges differ across GPUs (mW, by index): {constraints}; "
                "use GPUs of one model."
            )
        min_mw, max_mw = next(iter(constraints.values()))
        self.min_power_limit_w = math.ceil(min_mw / 1000)
        self.max_power_limit_w = max_mw // 1000
        limits = list(range(self.max_power_limit_w, self.min_power_limit_w - 1, -pl_step))
        if limits[-1] != self.min_power_limit_w:
            limits.append(self.min_power_limit_w)
        self.power_limits: list[int] = limits
        """Power limits to profile (W), descending; always includes the min and max."""

        self.measurements: list[PowerLimitMeasurement] = []
        self._steps_this_epoch = 0
        self._warned_short_epoch = False

        self._set_power_limit(self.max_power_limit_w)
        self.state: State
        if self.profile_path is not None and self.profile_path.exists():
            self.measurements = self._load_profile(self.profile_path)
            self.state = Done(optimal_power_limit_w=self._compute_optimal_power_limit())
            self._set_power_limit(self.state.optimal_power_limit_w)
        else:
            self.state = Ready(next_power_limit_w=self.power_limits[0], steps=wait_steps)

    # ------------------------------------------------------------------ callbacks

    def on_step_begin(self) -> None:
        """Mark the beginning of a training step."""
        self._steps_this_epoch += 1
        state = self.state
        match state:
            case Ready():
                state.steps -= 1
                if state.steps <= 0:
                    self._start(state.next_power_limit_w)
            case Warmup():
                state.steps -= 1
                if state.steps <= 0:
                    self.monitor.end_window(self._warmup_key(state.current_power_limit_w))
                    self._begin_profiling(state.current_power_limit_w)
            case Profiling():
                state.steps -= 1
                if state.steps <= 0:
                    self._finish_profiling(state.current_power_limit_w)
            case Done():
                pass
            case _:
                raise AssertionError(f"unknown state {state!r}")

    def on_epoch_end(self) -> None:
        """Mark the end of a training epoch."""
        steps, self._steps_this_epoch = self._steps_this_epoch, 0
        state = self.state
        match state:
            case Ready() | Done():
                pass
            case Warmup() | Profiling():
                key = (
                    self._warmup_key(state.current_power_limit_w)
                    if isinstance(state, Warmup)
                    else self._profile_key(state.current_power_limit_w)
                )
                self.monitor.end_window(key, cancel=True)
                self._set_power_limit(self.max_power_limit_w)
                self.state = Ready(next_power_limit_w=state.current_power_limit_w, steps=1)
                self._warn_if_short(steps)
            case _:
                raise AssertionError(f"unknown state {state!r}")

    # ------------------------------------------------------------------ transitions

    def _start(self, power_limit_w: int) -> None:
        self._set_power_limit(power_limit_w)
        if self.warmup_steps > 0:
            self.monitor.begin_window(self._warmup_key(power_limit_w))
            self.state = Warmup(current_power_limit_w=power_limit_w, steps=self.warmup_steps)
        else:
            self._begin_profiling(power_limit_w)

    def _begin_profiling(self, power_limit_w: int) -> None:
        self.monitor.begin_window(self._profile_key(power_limit_w))
        self.state = Profiling(current_power_limit_w=power_limit_w, steps=self.profile_steps)

    def _finish_profiling(self, power_limit_w: int) -> None:
        m = self.monitor.end_window(self._profile_key(power_limit_w))
        time_s, energy_j = aggregate_over_ranks(m.time_s, m.total_energy_j)
        if energy_j <= 0.0:
            logger.warning(
                "Power limit %d W: the profiling window measured %.3f J over %.3f s; the "
                "energy counter may not be updating (raise profile_steps?).",
                power_limit_w,
                energy_j,
                time_s,
            )
        self.measurements.append(
            PowerLimitMeasurement(power_limit_w=power_limit_w, energy_j=energy_j, time_s=time_s)
        )
        index = self.power_limits.index(power_limit_w)
        if index == len(self.power_limits) - 1:
            optimal = self._compute_optimal_power_limit()
            self.state = Done(optimal_power_limit_w=optimal)
            self._set_power_limit(optimal)
            self._save_profile(optimal)
        else:
            self._start(self.power_limits[index + 1])

    def _warn_if_short(self, steps: int) -> None:
        needed = self.warmup_steps + self.profile_steps + 1
        if steps < needed and not self._warned_short_epoch:
            self._warned_short_epoch = True
            warnings.warn(
                f"An epoch of {steps} steps ended inside a power-limit profiling window, and "
                f"one window needs {needed} steps in one epoch (warmup_steps="
                f"{self.warmup_steps} + profile_steps={self.profile_steps} + 1); profiling "
                "will never finish. Lower warmup_steps/profile_steps.",
                ShortEpochWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _warmup_key(power_limit_w: int) -> str:
        return f"__GlobalPowerLimitOptimizer_warmup_{power_limit_w}"

    @staticmethod
    def _profile_key(power_limit_w: int) -> str:
        return f"__GlobalPowerLimitOptimizer_profile_{power_limit_w}"

    def _set_power_limit(self, power_limit_w: int) -> None:
        """Set the power limit (W) of all GPUs."""
        for gpu in self.gpus:
            gpu.set_power_limit_mw(power_limit_w * 1000)

    def _compute_optimal_power_limit(self) -> int:
        """The optimal power limit in watts, by the selector."""
        optimal = self.optimum_selector.select(self.measurements)
        if not self.min_power_limit_w <= optimal <= self.max_power_limit_w:
            raise ZeusProfileError(
                f"The optimal power limit {optimal} W lies outside the GPUs' range "
                f"{self.min_power_limit_w}..{self.max_power_limit_w} W; the profile was made "
                f"on other GPUs. Delete {self.profile_path} to profile again."
            )
        return optimal

    def _load_profile(self, path: Path) -> list[PowerLimitMeasurement]:
        try:
            profile = PowerLimitProfile.model_validate_json(path.read_text())
        except (OSError, ValidationError) as exc:
            raise ZeusProfileError(
                f"Cannot load the power-limit profile {path}: {exc}. Fix or delete the file."
            ) from exc
        if profile.version != PROFILE_VERSION:
            raise ZeusProfileError(
                f"Profile {path} has version {profile.version}; this code reads version "
                f"{PROFILE_VERSION}. Delete the file to profile again."
            )
        logger.info("Loaded power-limit profile %s (%d limits)", path, len(profile.measurements))
        return profile.measurements

    def _save_profile(self, optimal_power_limit_w: int) -> None:
        """Save the measurements and the optimum to `profile_path` (rank 0 only)."""
        if self.profile_path is None or _rank() != 0:
            return
        profile = PowerLimitProfile(
            measurements=self.measurements,
            optimal_power_limit_w=optimal_power_limit_w,
            selector=repr(self.optimum_selector),
            emulated=self.monitor.emulated,
        )
        self.profile_path.parent.mkdir(parents=True, exist_ok=True)
        self.profile_path.write_text(profile.model_dump_json(indent=2))
        logger.info("Saved power-limit profile to %s", self.profile_path)

