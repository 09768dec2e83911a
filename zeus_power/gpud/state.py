"""The GPUs the daemon serves, what it changed on each and for whom; every write checked first.

Who undoes a setting, and when. A GPU whose clocks or power limit a process changed is
owned by that process (the last writer) until it resets them; the reaper (`GpuState.reap`,
every `reap_interval_s`) restores the GPU's defaults when the owner no longer runs
(`zeus_power.gpud.peers`). Why pids and not leases: zeusd's clients (Zeus's own, ours)
never renew anything, so a lease would either expire under a healthy job that holds one
clock for long or outlive a dead one; the kernel knows exactly when a process is gone.
Over TCP there is no peer pid: those settings are undone when the daemon exits, and the
README says so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from zeus_power.device import GPU, GPUError, GPUNotSupportedError, GPUValueError
from zeus_power.gpud.peers import Peer, alive

__all__ = ["GpuState"]

logger = logging.getLogger("zeus_power.gpud")


@dataclass
class _Slot:
    """One GPU and what the daemon changed on it."""

    gpu: GPU
    clocks_locked: bool = False
    power_limit_set: bool = False
    owner: Peer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class GpuState:
    """The GPUs, what was changed on each and by whom; every write checked first."""

    def __init__(self, gpus: Sequence[GPU]) -> None:
        self.slots: dict[int, _Slot] = {}
        for gpu in gpus:
            self.slots[int(getattr(gpu, "nvml_index", gpu.index))] = _Slot(gpu)
        self._clocks = {i: set(s.gpu.supported_sm_clocks_mhz()) for i, s in self.slots.items()}
        self._ranges = {i: s.gpu.power_limit_constraints_mw() for i, s in self.slots.items()}

    # -- validation (before anything reaches a GPU) ------------------------------------------
    def check_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        clocks = self._clocks[index]
        for name, value in (("min_clock_mhz", min_mhz), ("max_clock_mhz", max_mhz)):
            if value not in clocks:
                raise GPUValueError(
                    f"Invalid argument: {name}={value} is not a supported SM clock of GPU "
                    f"{index} (supported: {len(clocks)} clocks in {min(clocks)}..{max(clocks)} MHz)"
                )
        if min_mhz > max_mhz:
            raise GPUValueError(
                f"Invalid argument: min_clock_mhz={min_mhz} exceeds max_clock_mhz={max_mhz}"
            )

    def check_power_limit(self, index: int, limit_mw: int) -> None:
        low, high = self._ranges[index]
        if not low <= limit_mw <= high:
            raise GPUValueError(
                f"Invalid argument: power_limit_mw={limit_mw} is outside GPU {index}'s range "
                f"{low}..{high} mW"
            )

    # -- writes -----------------------------------------------------------------------------
    def write(
        self, what: str, indices: Sequence[int], params: dict[str, int], peer: Peer | None
    ) -> dict[int, GPUError]:
        """Apply one write to each GPU; the per-GPU errors (the others are applied)."""
        errors: dict[int, GPUError] = {}
        for index in indices:
            slot = self.slots[index]
            try:
                with slot.lock:
                    self._apply(what, index, slot, params)
                    if slot.clocks_locked or slot.power_limit_set:
                        slot.owner = peer
                    else:
                        slot.owner = None
            except GPUError as exc:
                errors[index] = exc
        who = f"pid {peer.pid} (uid {peer.uid})" if peer else "a TCP client"
        logger.info(
            "%s %s on GPUs %s by %s%s",
            what,
            params,
            list(indices),
            who,
            f": {len(errors)} refused" if errors else "",
        )
        return errors

    def _apply(self, what: str, index: int, slot: _Slot, params: dict[str, int]) -> None:
        gpu = slot.gpu
        if what == "set_gpu_locked_clocks":
            self.check_clocks(index, params["min_clock_mhz"], params["max_clock_mhz"])
            gpu.lock_sm_clocks(params["min_clock_mhz"], params["max_clock_mhz"])
            slot.clocks_locked = True
        elif what == "reset_gpu_locked_clocks":
            gpu.reset_sm_clocks()
            slot.clocks_locked = False
        elif what == "set_power_limit":
            self.check_power_limit(index, params["power_limit_mw"])
            gpu.set_power_limit_mw(params["power_limit_mw"])
            slot.power_limit_set = params["power_limit_mw"] != gpu.default_power_limit_mw()
        else:  # pragma: no cover - the handler only routes the three writes
            raise GPUNotSupportedError(f"unknown write {what}")

    # -- undoing ------------------------------------------------------------------------------
    def restore(self, index: int, why: str) -> None:
        """Reset the clocks and power limit this daemon changed on one GPU."""
        slot = self.slots[index]
        with slot.lock:
            try:
                if slot.clocks_locked:
                    slot.gpu.reset_sm_clocks()
                    slot.clocks_locked = False
                if slot.power_limit_set:
                    slot.gpu.set_power_limit_mw(slot.gpu.default_power_limit_mw())
                    slot.power_limit_set = False
                slot.owner = None
            except GPUError as exc:
                logger.error("GPU %d: could not restore its defaults (%s): %s", index, why, exc)
                return
        logger.info("GPU %d: clocks and power limit restored to defaults (%s)", index, why)

    def reap(self) -> list[int]:
        """Restore every GPU whose owner process is gone; the GPUs restored."""
        gone = []
        for index, slot in self.slots.items():
            owner = slot.owner
            if owner is not None and not alive(owner):
                self.restore(index, f"client pid {owner.pid} exited")
                gone.append(index)
        return gone

    def log_states(self, when: str) -> None:
        """One line per GPU: clock and power limit in force, what this daemon changed."""
        for index, slot in sorted(self.slots.items()):
            gpu = slot.gpu
            clock = getattr(gpu, "current_sm_clock_mhz", None)
            changed = [
                n
                for n, f in (("clocks", slot.clocks_locked), ("power limit", slot.power_limit_set))
                if f
            ]
            logger.info(
                "GPU %d %s: SM clock %s MHz, power limit %d mW (default %d), changed: %s",
                index,
                when,
                clock() if clock is not None else "?",
                gpu.get_power_limit_mw(),
                gpu.default_power_limit_mw(),
                ", ".join(changed) or "nothing",
            )

    def restore_all(self, why: str) -> None:
        for index, slot in self.slots.items():
            if slot.clocks_locked or slot.power_limit_set:
                self.restore(index, why)
