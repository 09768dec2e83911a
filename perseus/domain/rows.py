"""One profile measurement as it travels between a CSV file, the wire and a profile.

Its own module, free of numpy and pandas, so that the wire protocol (and every rank's
client that imports it) stays light.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ProfileRow"]


class ProfileRow(NamedTuple):
    """One measurement: one rank's instruction at one frequency (time in s, energy in J)."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    stage: int
    instruction: str
    frequency: int
    time: float
    energy: float
    emulated: bool = False
    """Measured on an emulated GPU: the numbers are the emulator's model, not a GPU's."""
    estimated: bool = False
    """The energy was estimated from aggregate readings (the energy counter's refreshes over
    many instructions), not measured for this instruction alone."""
    energy_se: float | None = None
    """The estimate's standard error, J (inf: the readings could not tell it; None: measured)."""
