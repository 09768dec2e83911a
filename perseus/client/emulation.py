"""Emulated frequency control for a process doing real work in place of a GPU.

A GPU whose `stand_in` is not None (an `EmulatedGPU`) has no hardware to slow down when a
lower SM clock is locked, so the per-rank hook does it: when an instruction ends,
`InstructionEmulator.finish` stretches its wall time by the DVFS model's ratio (sleeping the
difference) and adds the model's busy power times the stretched time to the GPU's energy
counter. A CPU-only `torchrun` job then
behaves like a GPU job under frequency control: lower clocks really take longer, and the
energy counter reads what the model says.

Two modes, both configurable with ``PERSEUS_EMULATE_*`` environment variables
(`EmulationSettings`):

- *measured* (default): the instruction's real elapsed time ``t`` is taken as its time at
  the max clock; at clock ``f`` it lasts ``t · stretch(f)``.
- *nominal* (``PERSEUS_EMULATE_NOMINAL=1``): each instruction name has a nominal time at
  the max clock (given by the training job, e.g. proportional to its stage's layers), and
  lasts ``nominal · stretch(f)`` whatever the real compute took (if that compute took
  longer, it lasts that long). The instruction's reported time is that emulated time: the
  host waking the process late after its sleep is not charged to the emulated GPU (the
  iteration's wall time still includes it). CPU timing noise on small shared machines is
  large; this mode makes profiles reproducible, and CI uses it for its numeric assertions.

``PERSEUS_EMULATE_STRETCH=0`` turns stretching off (the hook still measures and records
energy at the model's power): the overhead benchmark runs that way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from perseus.errors import ConfigurationError
from zeus_power.device import DEFAULT_ACTIVITY, Workload
from zeus_power.device.base import StandIn

__all__ = ["EmulationSettings", "InstructionEmulator"]


class EmulationSettings(BaseSettings):
    """How the hook emulates frequency control on a stand-in GPU (env ``PERSEUS_EMULATE_*``).

    Attributes:
        stretch: Stretch each instruction's wall time by the model's ratio for the clock in
            force (``PERSEUS_EMULATE_STRETCH``). Off: measure only.
        nominal: Use the nominal per-instruction time at the max clock instead of the
            measured one (``PERSEUS_EMULATE_NOMINAL``).
        memory_fraction: Share of an instruction's time at the max clock that does not
            scale with the SM clock (``PERSEUS_EMULATE_MEMORY_FRACTION``).
        activity: Dynamic-power activity of an instruction (``PERSEUS_EMULATE_ACTIVITY``).
    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_EMULATE_", extra="ignore", frozen=True)

    stretch: bool = True
    nominal: bool = False
    memory_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    activity: float = Field(default=DEFAULT_ACTIVITY, gt=0.0)


class InstructionEmulator:
    """Stretches instructions and feeds the energy counter of one stand-in GPU.

    Args:
        stand_in: The `GPU.stand_in` of this rank's GPU (an `EmulatedGPU` is its own).
        settings: The emulation mode.
        nominal_time_s: Instruction name → time at the max clock, for nominal mode. A key
            ``"<name>@<stage>"`` (e.g. ``"forward@3"``) gives one pipeline stage its own
            time (ranks that hold several stages); it wins over the plain name.
    """

    def __init__(
        self,
        stand_in: StandIn,
        settings: EmulationSettings,
        *,
        nominal_time_s: Mapping[str, float] | None = None,
    ) -> None:
        self.stand_in = stand_in
        self.settings = settings
        self.nominal_time_s = dict(nominal_time_s or {})
        for name, value in self.nominal_time_s.items():
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(
                    f"Nominal time of {name!r} must be a positive number of seconds, got {value!r}"
                )
        if settings.nominal and not self.nominal_time_s:
            raise ConfigurationError(
                "PERSEUS_EMULATE_NOMINAL is on but the training job gave no nominal instruction "
                "times: pass nominal_time_s={'forward': ..., 'backward': ...} to PerseusOptimizer"
            )
        self.workload = Workload.from_memory_fraction(
            settings.memory_fraction, activity=settings.activity
        )
        self.slowdown = 1.0
        """Extra factor on every instruction's time (emulates a straggling pipeline)."""
        self.last_compute_s = 0.0
        """The real (unstretched) elapsed time of the last finished instruction."""
        self.last_energy_j = 0.0
        """Busy power × duration of the last finished instruction (what the counter gained)."""
        self._model_cache: dict[tuple[int, int], tuple[float, float]] = {}

    def target_time_s(
        self, name: str, elapsed_s: float, freq_mhz: int, *, stage: int | None = None
    ) -> float:
        """How long the instruction should last at `freq_mhz`, having computed `elapsed_s`."""
        if self.settings.nominal:
            try:
                key = f"{name}@{stage}"
                base_s = self.nominal_time_s[key if key in self.nominal_time_s else name]
            except KeyError:
                raise ConfigurationError(
                    f"No nominal time for instruction {name!r}; known: "
                    f"{', '.join(sorted(self.nominal_time_s))}"
                ) from None
        else:
            base_s = elapsed_s
        if not self.settings.stretch:
            return elapsed_s
        return base_s * self._model(freq_mhz)[0] * self.slowdown

    def _model(self, freq_mhz: int) -> tuple[float, float]:
        """(stretch factor, busy power in W) at `freq_mhz` under the current power limit.

        Cached: the DVFS model's numpy path costs a few hundred microseconds per call right
        after a burst of real compute, which would otherwise land on every instruction.
        """
        key = (freq_mhz, self.stand_in.get_power_limit_mw())
        hit = self._model_cache.get(key)
        if hit is None:
            hit = (
                self.stand_in.stretch_factor(self.workload, freq_mhz),
                self.stand_in.busy_power_w(self.workload, freq_mhz),
            )
            self._model_cache[key] = hit
        return hit

    def finish(
        self,
        name: str,
        start_s: float,
        freq_mhz: int,
        *,
        compute_end_s: float | None = None,
        stage: int | None = None,
    ) -> float:
        """End an instruction that began at `start_s` (`time.perf_counter`) at `freq_mhz`.

        Sleeps until the instruction has lasted its emulated time, records busy power for
        that time into the energy counter, and returns the instruction's duration. The real
        work ended at `compute_end_s` (default: now); anything the hook did after it, such as
        waiting for the clock to be applied, is not work to stretch.
        """
        end_s = time.perf_counter() if compute_end_s is None else compute_end_s
        elapsed_s = end_s - start_s
        self.last_compute_s = elapsed_s
        target_s = self.target_time_s(name, elapsed_s, freq_mhz, stage=stage)
        # A clock switch takes time: the instruction ran its first `lag_s` at the clock in
        # force before, its work then done at that clock's pace.
        old_mhz, lag_s = self.stand_in.switch_lag(time.perf_counter() - start_s)
        power_w = self._model(freq_mhz)[1]
        energy_j = -1.0
        if lag_s > 0 and old_mhz != freq_mhz and self.settings.stretch:
            old_s = target_s * self._model(old_mhz)[0] / self._model(freq_mhz)[0]
            old_power_w = self._model(old_mhz)[1]
            if old_s <= lag_s:
                target_s, energy_j = old_s, old_power_w * old_s
            else:
                rest_s = (1.0 - lag_s / old_s) * target_s
                target_s, energy_j = lag_s + rest_s, old_power_w * lag_s + power_w * rest_s
        deadline = start_s + target_s
        remaining = deadline - time.perf_counter()
        while remaining > 0:
            time.sleep(remaining)
            remaining = deadline - time.perf_counter()
        # Exact mode: the emulated GPU finished at the deadline (or when the real compute did,
        # if it overran); the host waking this process late is not the GPU's time.
        wall_s = time.perf_counter() - start_s
        duration_s = max(target_s, elapsed_s) if self.exact else wall_s
        if energy_j >= 0:  # the switch's two clocks: the mean power over the target time
            power_w = energy_j / target_s
        self.stand_in.record_busy(duration_s, power_w)
        self.last_energy_j = power_w * duration_s
        return duration_s

    @property
    def exact(self) -> bool:
        """Whether instruction time and energy are the emulated ones, not wall-clock readings.

        True in nominal mode with stretching: the hook then reports `finish`'s duration and
        `last_energy_j` instead of the energy counter's delta, which also holds the idle
        power of the host's late wake-up.
        """
        return self.settings.nominal and self.settings.stretch
