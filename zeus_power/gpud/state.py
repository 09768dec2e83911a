"""The GPUs the daemon serves, what it changed on each and for whom; every write checked first.

Who undoes a setting, and when. A GPU whose clocks or power limit a process changed is
owned by that process (the last writer) until it resets them; the reaper (`GpuState.reap`,
every `reap_interval_s`) restores the GPU's defaults when the owner no longer runs
(`zeus_power.gpud.peers`). Why pids and not leases: zeusd's clients (Zeus's own, ours)
never renew anything, so a lease would either expire under a healthy job that holds one
clock for long or outlive a dead one; the kernel knows exactly when a process is gone.
Over TCP there is no peer pid: those settings are undone when the daemon exits, and the
docs/operating.md ("Running without root") says so.

One lock per GPU covers its driver calls, its flags and its owner together: a write, the
reaper's look at the owner and the restore that follows are each one critical section, so
the reaper never undoes what a new, live owner set while the reaper was deciding.

A restore the driver refuses (a GPU fallen off the bus, a driver being reloaded) leaves the
GPU without an owner and *orphaned*: it is logged once, as an error that says how to reset
the GPU by hand, and retried quietly with a delay that doubles from `RETRY_FIRST_S` up to
`RETRY_MAX_S`; a success is logged. A client that writes to an orphaned GPU becomes its
owner, and what the daemon still had to undo is then that client's to undo.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from zeus_power.device import GPU, GPUError, GPUNotSupportedError, GPUValueError
from zeus_power.gpud.peers import Peer, alive

__all__ = ["RETRY_FIRST_S", "RETRY_MAX_S", "GpuState", "StoppingError"]

logger = logging.getLogger("zeus_power.gpud")

RETRY_FIRST_S = 1.0
"""Seconds before the first retry of a restore the driver refused."""
RETRY_MAX_S = 60.0
"""Longest wait between retries of a refused restore."""


class StoppingError(GPUError):
    """A write that came after the daemon began to stop (it would outlive the restore)."""


@dataclass
class _Orphan:
    """A restore the driver refused, waiting for its next try."""

    why: str
    next_try_s: float
    delay_s: float
    failures: int = 1


@dataclass
class _Slot:
    """One GPU and what the daemon changed on it; every field guarded by `lock`."""

    gpu: GPU
    clocks_locked: bool = False
    power_limit_set: bool = False
    owner: Peer | None = None
    orphan: _Orphan | None = None
    closed: bool = False
    """Set when the daemon stops: later writes are refused, so none outlives the restore."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def changed(self) -> bool:
        return self.clocks_locked or self.power_limit_set

    def changes(self) -> list[str]:
        """What the daemon changed and has not undone: "clocks", "power limit"."""
        return [
            name
            for name, done in (
                ("clocks", self.clocks_locked),
                ("power limit", self.power_limit_set),
            )
            if done
        ]


class GpuState:
    """The GPUs, what was changed on each and by whom; every write checked first.

    Args:
        gpus: The GPUs served, keyed by their NVML index.
        clock: Monotonic seconds, for the retry delays of refused restores.
    """

    def __init__(self, gpus: Sequence[GPU], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.slots: dict[int, _Slot] = {}
        for gpu in gpus:
            self.slots[int(getattr(gpu, "nvml_index", gpu.index))] = _Slot(gpu)
        self._clocks = {i: set(s.gpu.supported_sm_clocks_mhz()) for i, s in self.slots.items()}
        self._ranges = {i: s.gpu.power_limit_constraints_mw() for i, s in self.slots.items()}
        self._clock = clock

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
                    if slot.closed:
                        raise StoppingError(
                            "the daemon is stopping and restores the GPUs' defaults; retry "
                            "once it runs again",
                            gpu_index=index,
                        )
                    self._apply(what, index, slot, params)
                    slot.owner = peer if slot.changed else None
                    slot.orphan = None  # what was left to undo is the writer's now
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
    def restore(self, index: int, why: str, *, retry: bool = True) -> bool:
        """Reset the clocks and power limit this daemon changed on one GPU; whether it did.

        A refused restore is logged; with `retry`, `reap` tries it again later."""
        slot = self.slots[index]
        with slot.lock:
            return self._restore(index, slot, why, retry=retry)

    def reap(self) -> list[int]:
        """Restore every GPU whose owner process is gone, and retry the orphaned GPUs whose
        delay is over; the GPUs restored."""
        restored = []
        for index, slot in self.slots.items():
            with slot.lock:  # the owner is read, judged and undone in one critical section
                owner = slot.owner
                if owner is not None:
                    if alive(owner):
                        continue
                    why = f"client pid {owner.pid} exited"
                elif slot.orphan is not None and self._clock() >= slot.orphan.next_try_s:
                    why = slot.orphan.why
                else:
                    continue
                if self._restore(index, slot, why, retry=True):
                    restored.append(index)
        return restored

    def _restore(self, index: int, slot: _Slot, why: str, *, retry: bool) -> bool:
        """`restore` with `slot.lock` held."""
        slot.owner = None
        try:
            if slot.clocks_locked:
                slot.gpu.reset_sm_clocks()
                slot.clocks_locked = False
            if slot.power_limit_set:
                slot.gpu.set_power_limit_mw(slot.gpu.default_power_limit_mw())
                slot.power_limit_set = False
        except GPUError as exc:
            if retry:
                self._refused(index, slot, why, exc)
            else:
                logger.error(
                    "GPU %d: could not restore its defaults (%s): %s. Its %s stay as set; "
                    "reset them as root: %s",
                    index,
                    why,
                    exc,
                    " and ".join(slot.changes()),
                    _by_hand(index),
                )
            return False
        if slot.orphan is not None:
            logger.info(
                "GPU %d: clocks and power limit restored to defaults (%s), at try %d",
                index,
                why,
                slot.orphan.failures + 1,
            )
            slot.orphan = None
        else:
            logger.info("GPU %d: clocks and power limit restored to defaults (%s)", index, why)
        return True

    def _refused(self, index: int, slot: _Slot, why: str, exc: GPUError) -> None:
        """Note a refused restore: log it once, with what to do, and schedule the retry."""
        orphan = slot.orphan
        if orphan is not None:
            orphan.failures += 1
            orphan.delay_s = min(2 * orphan.delay_s, RETRY_MAX_S)
            orphan.next_try_s = self._clock() + orphan.delay_s
            logger.debug("GPU %d: restore try %d refused: %s", index, orphan.failures, exc)
            return
        slot.orphan = _Orphan(why, self._clock() + RETRY_FIRST_S, RETRY_FIRST_S)
        logger.error(
            "GPU %d: could not restore its defaults (%s): %s. Its %s stay as set until a "
            "restore succeeds: the daemon retries quietly every %.0f to %.0f s and logs the "
            "success; to reset them now, run as root: %s",
            index,
            why,
            exc,
            " and ".join(slot.changes()),
            RETRY_FIRST_S,
            RETRY_MAX_S,
            _by_hand(index),
        )

    def log_states(self, when: str) -> None:
        """One line per GPU: clock and power limit in force, what this daemon changed (a GPU
        the driver cannot read gets a line saying so: this runs before the exit's restore)."""
        for index, slot in sorted(self.slots.items()):
            gpu = slot.gpu
            clock = getattr(gpu, "current_sm_clock_mhz", None)  # the emulator's, not NVML's
            try:
                logger.info(
                    "GPU %d %s: SM clock %s MHz, power limit %d mW (default %d), changed: %s",
                    index,
                    when,
                    clock() if clock is not None else "?",
                    gpu.get_power_limit_mw(),
                    gpu.default_power_limit_mw(),
                    ", ".join(slot.changes()) or "nothing",
                )
            except GPUError as exc:
                logger.warning("GPU %d %s: cannot read its state: %s", index, when, exc)

    def close(self, why: str) -> None:
        """Refuse every later write and restore every GPU this daemon changed (at exit)."""
        for index, slot in self.slots.items():
            with slot.lock:
                slot.closed = True
                if slot.changed:
                    self._restore(index, slot, why, retry=False)


def _by_hand(index: int) -> str:
    return (
        f"`nvidia-smi -i {index} -rgc` (clocks) and `nvidia-smi -i {index} -pl <default W>` "
        "(power limit)"
    )
