"""Emulated frequency control for a process doing real work in place of a GPU.

A GPU whose `stand_in` is not None (an `EmulatedGPU`) has no hardware to slow down when a
lower SM clock is locked, so the per-rank hook does it: when an instruction begins,
`InstructionEmulator.begin` tells the GPU it is busy at the model's power for the clock;
when it ends, `InstructionEmulator.finish` stretches its wall time by the DVFS model's ratio
(sleeping the difference) and tells the GPU how long it ran and what it drew. A CPU-only
`torchrun` job then behaves like a GPU job under frequency control: lower clocks really take
longer, and the GPU's sensors show the energy as a real GPU's would (a counter that
refreshes every 100 ms by default: `zeus_power.device.sensors`). The hook never reads an
instruction's energy from here; it reads the GPU's sensors, as on a real GPU.

Instruction kinds draw different power and slow down differently with the clock, as the
published A40 profiles show (`perseus.client.settings.KIND_PRESETS`, derived in ``docs/emulator.md``): by default
the GPT-3 175B fits, forward memory fraction 0.479 and activity 0.826, backward 0.739 and
0.753 (the split backward's halves take the backward's).

Settings, ``PERSEUS_EMULATE_*`` environment variables (`perseus.client.settings.EmulationSettings`):

- *measured* (default): the instruction's real elapsed time ``t`` is taken as its time at
  the max clock; at clock ``f`` it lasts ``t · stretch(f)``.
- *nominal* (``PERSEUS_EMULATE_NOMINAL=1``): each instruction name has a nominal time at
  the max clock (given by the training job, e.g. proportional to its stage's layers, or by
  ``PERSEUS_EMULATE_NOMINAL_MS``), and lasts ``nominal · stretch(f)`` whatever the real
  compute took. The instruction's reported time is that emulated time: a host that falls
  behind (its compute overrunning the nominal time on a busy CPU, or waking the process
  late after its sleep) is not charged to the emulated GPU, whose kernels would run their
  time while the host queued the next; the iteration's wall time still includes it, as the
  GPU's idle time. CPU timing noise on small shared machines is large (and an overrun
  would land mostly at the max clock, where the nominal time is shortest, as if lower
  clocks ran faster); this mode makes profiles reproducible, and CI uses it for its
  numeric assertions.
- ``PERSEUS_EMULATE_STRETCH=0`` turns stretching off (the hook still measures, and the GPU
  still draws the model's power): the overhead benchmark runs that way.
- ``PERSEUS_EMULATE_KINDS`` picks the per-kind preset (``gpt3``, ``bloom``, ``uniform``: every
  kind memory fraction 0 and activity 0.8, the emulator before kinds differed);
  ``PERSEUS_EMULATE_MEMORY_FRACTION`` / ``PERSEUS_EMULATE_ACTIVITY`` override it for every kind.
- ``PERSEUS_EMULATE_TRUTH=DIR``: every executed instruction is appended to
  ``DIR/rank{R}.csv`` (``stage,instruction,frequency,time,energy,switching``) with the
  model's time and energy before any sensor effect; ``switching`` is 1 where the instruction
  ran its first part at the previous clock (a change was still landing). Tests and
  benchmarks compare against it; nothing in the product reads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from perseus.client.settings import EmulationSettings
from perseus.errors import ConfigurationError
from zeus_power.device import Workload
from zeus_power.device.base import StandIn

__all__ = ["InstructionEmulator", "TruthLog"]

class TruthLog:
    """``DIR/rank{R}.csv``: one row per executed instruction, the model's time and energy.

    Appends (a job may write several runs to one folder); the header is written once.
    Nothing in the product reads it: it is the ground truth tests compare profiles with.
    """

    COLUMNS = ("stage", "instruction", "frequency", "time", "energy", "switching")

    def __init__(self, directory: Path, rank: int) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / f"rank{rank}.csv"
            self._file: TextIO | None = self.path.open("a", buffering=1)
        except OSError as exc:
            raise ConfigurationError(
                f"PERSEUS_EMULATE_TRUTH={str(directory)!r}: cannot write there "
                f"({exc.strerror or exc})"
            ) from exc
        if self._file.tell() == 0:
            self._file.write(",".join(self.COLUMNS) + "\n")

    def write(
        self,
        stage: int,
        instruction: str,
        freq_mhz: int,
        time_s: float,
        energy_j: float,
        switching: bool = False,
    ) -> None:
        if self._file is not None:
            self._file.write(
                f"{stage},{instruction},{freq_mhz},{time_s!r},{energy_j!r},{int(switching)}\n"
            )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class InstructionEmulator:
    """Stretches instructions and tells one stand-in GPU the power they draw.

    Args:
        stand_in: The `GPU.stand_in` of this rank's GPU (an `EmulatedGPU` is its own).
        settings: The emulation mode.
        nominal_time_s: Instruction name → time at the max clock, for nominal mode. A key
            ``"<name>@<stage>"`` (e.g. ``"forward@3"``) gives one pipeline stage its own
            time (ranks that hold several stages); it wins over the plain name.
        rank: This process's rank (names the truth file).
        stage: The pipeline stage of instructions that do not say theirs (truth rows).
    """

    def __init__(
        self,
        stand_in: StandIn,
        settings: EmulationSettings,
        *,
        nominal_time_s: Mapping[str, float] | None = None,
        rank: int = 0,
        stage: int = 0,
    ) -> None:
        self.stand_in = stand_in
        self.settings = settings
        self.nominal_time_s = {k: v / 1000.0 for k, v in (settings.nominal_ms or {}).items()}
        self.nominal_time_s.update(nominal_time_s or {})
        for name, value in self.nominal_time_s.items():
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(
                    f"Nominal time of {name!r} must be a positive number of seconds, got {value!r}"
                )
        if settings.nominal and not self.nominal_time_s:
            raise ConfigurationError(
                "PERSEUS_EMULATE_NOMINAL is on but the training job gave no nominal instruction "
                "times: pass nominal_time_s={'forward': ..., 'backward': ...} to PerseusOptimizer "
                "or set PERSEUS_EMULATE_NOMINAL_MS"
            )
        self.stage = stage
        self.slowdown = 1.0
        """Extra factor on every instruction's time (emulates a straggling pipeline)."""
        self.last_compute_s = 0.0
        """The real (unstretched) elapsed time of the last finished instruction."""
        self._workloads: dict[str, Workload] = {}
        self._model_cache: dict[tuple[str, int, int], tuple[float, float]] = {}
        self.truth = TruthLog(settings.truth, rank) if settings.truth is not None else None

    def workload(self, name: str) -> Workload:
        """The emulated work of instruction kind `name` (`EmulationSettings.workload`)."""
        work = self._workloads.get(name)
        if work is None:
            work = self._workloads[name] = self.settings.workload(name)
        return work

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
        return base_s * self._model(name, freq_mhz)[0] * self.slowdown

    def _model(self, name: str, freq_mhz: int) -> tuple[float, float]:
        """(stretch factor, busy power in W) of kind `name` at `freq_mhz` under the current
        power limit.

        Cached: the DVFS model's numpy path costs a few hundred microseconds per call right
        after a burst of real compute, which would otherwise land on every instruction.
        """
        key = (name, freq_mhz, self.stand_in.get_power_limit_mw())
        hit = self._model_cache.get(key)
        if hit is None:
            work = self.workload(name)
            hit = (
                self.stand_in.stretch_factor(work, freq_mhz),
                self.stand_in.busy_power_w(work, freq_mhz),
            )
            self._model_cache[key] = hit
        return hit

    def begin(self, name: str, freq_mhz: int) -> None:
        """Instruction `name` starts now at target clock `freq_mhz`: the GPU draws its power
        from now on (the clock still in force, during a switch)."""
        old_mhz, lag_s = self.stand_in.switch_lag()
        clock = old_mhz if lag_s > 0 and self.settings.stretch else freq_mhz
        self.stand_in.begin_busy(self._model(name, clock)[1])

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

        Sleeps until the instruction has lasted its emulated time, tells the GPU how long
        it ran and what it drew, and returns the instruction's duration. The real work
        ended at `compute_end_s` (default: now); anything the hook did after it, such as
        waiting for the clock to be applied, is not work to stretch.
        """
        end_s = time.perf_counter() if compute_end_s is None else compute_end_s
        elapsed_s = end_s - start_s
        self.last_compute_s = elapsed_s
        target_s = self.target_time_s(name, elapsed_s, freq_mhz, stage=stage)
        # A clock switch takes time: the instruction ran its first `lag_s` at the clock in
        # force before, its work then done at that clock's pace.
        old_mhz, lag_s = self.stand_in.switch_lag(time.perf_counter() - start_s)
        power_w = self._model(name, freq_mhz)[1]
        energy_j = -1.0
        switching = lag_s > 0 and old_mhz != freq_mhz and self.settings.stretch
        if switching:
            old_s = target_s * self._model(name, old_mhz)[0] / self._model(name, freq_mhz)[0]
            old_power_w = self._model(name, old_mhz)[1]
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
        # Exact mode: the emulated GPU finished at the deadline; the real compute overrunning
        # it, or the host waking this process late, is the host's time, not the GPU's.
        wall_s = time.perf_counter() - start_s
        duration_s = target_s if self.exact else wall_s
        if energy_j >= 0:  # the switch's two clocks: the mean power over the target time
            power_w = energy_j / target_s
        energy_j = power_w * duration_s
        self.stand_in.end_busy(duration_s, energy_j)
        if self.truth is not None:
            self.truth.write(
                self.stage if stage is None else stage,
                name,
                freq_mhz,
                duration_s,
                energy_j,
                switching,
            )
        return duration_s

    @property
    def exact(self) -> bool:
        """Whether an instruction's reported time is its emulated time, not a wall-clock reading.

        True in nominal mode with stretching: the hook then reports `finish`'s duration,
        which leaves out the host's lateness (a compute overrun, a late wake-up).
        """
        return self.settings.nominal and self.settings.stretch

    def close(self) -> None:
        """Close the truth file, if any."""
        if self.truth is not None:
            self.truth.close()
