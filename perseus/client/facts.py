"""What a rank tells the job and the coordinator about its GPU (`GpuFacts`): the GPU side
(`perseus.client.gpu`) states them, the wire (`perseus.client.wire`) registers them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuFacts"]


@dataclass(frozen=True)
class GpuFacts:
    """What a rank tells the job and the coordinator about its GPU."""

    device_id: int
    name: str
    frequencies: list[int]
    emulated: bool
    switch_latency_s: float | None
    energy_refresh_s: float | None
    power_limit_w: float | None = None
    """The power limit in force, W, as read at start (None: the GPU would not say)."""
    idle_power_w: float | None = None
    """The power drawn while idle, W, measured at start (`EnergyReader.idle_power_w`;
    None: not measured)."""
