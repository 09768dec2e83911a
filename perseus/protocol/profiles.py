"""Offline instruction profiles on the wire and in CSV files (Zeus's
`OfflineProfilingResult` and `InstructionProfilingResult`); the CSV format itself is
`perseus.io.profile_csv`'s."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, Field, RootModel, model_validator

from perseus.domain.kinds import INSTRUCTIONS
from perseus.domain.rows import ProfileRow
from perseus.errors import ProfileError
from perseus.io.profile_csv import read_profile_rows, write_profile_rows
from perseus.protocol.limits import MAX_FREQUENCIES, FreqMHz, Joules, Seconds

__all__ = ["InstructionProfilingResult", "OfflineProfilingResult"]


_TimeByFreq = Annotated[dict[FreqMHz, Seconds], Field(max_length=MAX_FREQUENCIES)]
_EnergyByFreq = Annotated[dict[FreqMHz, Joules], Field(max_length=MAX_FREQUENCIES)]


class OfflineProfilingResult(BaseModel):
    """Profiling results generated from offline profiling each instruction.

    Times are finite and > 0, energies finite and >= 0 (bounded as in `ProfilingResult`),
    frequencies positive MHz, at most `MAX_FREQUENCIES` per instruction.

    Attributes:
        rank: Global rank of the reporting client.
        dp_rank, pp_rank, tp_rank: Parallel ranks of the reporting process.
        stage: The pipeline (virtual) stage these numbers are for, when the pipeline rank
            holds several (interleaved, ZBV); None means the stage is `pp_rank` (and a
            stage equal to `pp_rank` is stored as None, so that both spellings compare equal).
        forward_time: Frequency → average forward computation time (s).
        forward_energy: Frequency → average forward computation energy (J).
        backward_time: Frequency → average backward computation time (s).
        backward_energy: Frequency → average backward computation energy (J).
        backward_input_time, backward_input_energy, backward_weight_time,
        backward_weight_energy: The same for the halves of a split backward (empty when
            the schedule runs full backwards).
        emulated: Measured on an emulated GPU (the CSV's ``emulated`` column).
    """

    rank: int = Field(ge=0)
    dp_rank: int = Field(ge=0)
    pp_rank: int = Field(ge=0)
    tp_rank: int = Field(ge=0)
    stage: int | None = Field(default=None, ge=0)
    forward_time: _TimeByFreq
    forward_energy: _EnergyByFreq
    backward_time: _TimeByFreq = Field(default_factory=dict)
    backward_energy: _EnergyByFreq = Field(default_factory=dict)
    backward_input_time: _TimeByFreq = Field(default_factory=dict)
    backward_input_energy: _EnergyByFreq = Field(default_factory=dict)
    backward_weight_time: _TimeByFreq = Field(default_factory=dict)
    backward_weight_energy: _EnergyByFreq = Field(default_factory=dict)
    emulated: bool = False

    @model_validator(mode="after")
    def _normalise_stage(self) -> OfflineProfilingResult:
        if self.stage == self.pp_rank:
            self.stage = None
        return self

    @property
    def pipeline_stage(self) -> int:
        """The pipeline (virtual) stage: `stage`, or `pp_rank` when that is None."""
        return self.pp_rank if self.stage is None else self.stage


class InstructionProfilingResult(RootModel[list[OfflineProfilingResult]]):
    """Time and energy profiling results for each instruction in each stage."""

    def rows(self) -> list[ProfileRow]:
        """One row per entry (rank and stage), instruction and frequency (frequencies
        descending); the row's stage is the entry's `pipeline_stage`."""
        rows: list[ProfileRow] = []
        for res in self.root:
            for instruction in INSTRUCTIONS:
                times: dict[int, float] = getattr(res, f"{instruction}_time")
                energies: dict[int, float] = getattr(res, f"{instruction}_energy")
                for freq in sorted(times, reverse=True):
                    if freq not in energies:
                        raise ProfileError(
                            f"rank {res.rank} stage {res.pipeline_stage}: {instruction} at "
                            f"{freq} MHz has a time but no energy"
                        )
                    rows.append(
                        ProfileRow(
                            res.rank,
                            res.dp_rank,
                            res.pp_rank,
                            res.tp_rank,
                            res.pipeline_stage,
                            instruction,
                            freq,
                            times[freq],
                            energies[freq],
                            res.emulated,
                        )
                    )
        return rows

    def to_csv(self, filepath: str | os.PathLike[str]) -> None:
        """Serialize and save this object into a CSV file.

        Columns: rank, dp_rank, pp_rank, tp_rank, stage, instruction, frequency, time, energy

        Notes:
            - `rank` is the global rank of the process.
            - `stage` is the pipeline (virtual) stage: `pp_rank` unless the pipeline rank
              holds several stages (interleaved, ZBV), then one of those.
            - All ranks and `stage` are zero-indexed.
            - `instruction` is one of "forward", "backward", "backward_input",
              "backward_weight".
            - `time` and `energy` are already averaged over profiling iterations.
            - An ``emulated`` column (true/false) follows when some entry is `emulated`.
        """
        write_profile_rows(filepath, self.rows())

    @classmethod
    def from_csv(cls, filepath: str | os.PathLike[str]) -> InstructionProfilingResult:
        """Read a profile CSV, in the long form `to_csv` writes or the short
        ``stage,instruction,frequency,time,energy`` form (then rank = pp_rank = stage).
        One entry per (rank, dp_rank, pp_rank, tp_rank, stage)."""
        by_rank: dict[tuple[int, int, int, int, int], dict[str, dict[int, float]]] = {}
        emulated: set[tuple[int, int, int, int, int]] = set()
        for row in read_profile_rows(filepath):
            key = (row.rank, row.dp_rank, row.pp_rank, row.tp_rank, row.stage)
            entry = by_rank.setdefault(
                key, {f"{i}_{q}": {} for i in INSTRUCTIONS for q in ("time", "energy")}
            )
            entry[f"{row.instruction}_time"][row.frequency] = row.time
            entry[f"{row.instruction}_energy"][row.frequency] = row.energy
            if row.emulated:
                emulated.add(key)
        return cls(
            [
                OfflineProfilingResult(
                    rank=key[0],
                    dp_rank=key[1],
                    pp_rank=key[2],
                    tp_rank=key[3],
                    stage=key[4],
                    emulated=key in emulated,
                    **data,
                )
                for key, data in sorted(by_rank.items())
            ]
        )
