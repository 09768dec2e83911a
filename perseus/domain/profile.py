"""Instruction profiles: the measured time and energy of every (stage, instruction, frequency).

A profile is the solver's ground truth. It is built from validated rows (`ProfileRow`, read
from CSV by `perseus.io.profile_csv`) or from a table, and checked: every
stage ``0..S-1`` must have both a forward and a backward, times must be positive and finite,
energies non-negative and finite, and every row's implied power (energy / time) must be a
plausible GPU's (`MIN_PLAUSIBLE_POWER_W` to `MAX_PLAUSIBLE_POWER_W`): outside it the
profile is refused as a unit mistake (times in ms, energies in mJ) unless the caller passes
``check_power=False``.

With tensor parallelism a stage has several GPUs: the profile of a stage is then the
slowest GPU's time and the sum of the GPUs' energies, over the first data-parallel
pipeline present (all pipelines run the same plan).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from perseus.domain.kinds import (
    BACKWARD_SPLIT,
    INSTRUCTIONS,
    MAX_PLAUSIBLE_POWER_W,
    MIN_PLAUSIBLE_POWER_W,
    PROFILE_COLUMNS,
)
from perseus.domain.rows import ProfileRow
from perseus.errors import PlanError, ProfileError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["InstructionOptions", "InstructionProfile", "ProfileRow", "check_implied_power"]


def check_implied_power(
    stage: np.ndarray,
    instruction: np.ndarray,
    frequency: np.ndarray,
    time_s: np.ndarray,
    energy_j: np.ndarray,
    *,
    source: str,
) -> None:
    """Refuse rows whose implied power (energy / time) no GPU draws: the one unit check.

    Below `MIN_PLAUSIBLE_POWER_W` the times are likely in ms (or the energies in kJ); above
    `MAX_PLAUSIBLE_POWER_W` the energies are likely in mJ (or the times in µs). Raises
    `ProfileError` naming the worst row and the likely mistake.
    """
    time_s = np.asarray(time_s, dtype=float)
    power = np.asarray(energy_j, dtype=float) / time_s
    low = np.flatnonzero(power < MIN_PLAUSIBLE_POWER_W)
    high = np.flatnonzero(power > MAX_PLAUSIBLE_POWER_W)
    if len(low) == 0 and len(high) == 0:
        return
    if len(low) >= len(high):
        bad, i = low, int(low[np.argmin(power[low])])
        hint = (
            f"below {MIN_PLAUSIBLE_POWER_W:g} W: times in ms instead of s? "
            "(that makes the power 1000x too small)"
        )
    else:
        bad, i = high, int(high[np.argmax(power[high])])
        hint = (
            f"above {MAX_PLAUSIBLE_POWER_W:g} W: energies in mJ instead of J? "
            "(that makes the power 1000x too large)"
        )
    raise ProfileError(
        f"Profile {source}: {len(bad)} row(s) imply a power no GPU draws, e.g. stage "
        f"{int(stage[i])} {instruction[i]} at {int(frequency[i])} MHz: time {time_s[i]:g} s, "
        f"energy {float(np.asarray(energy_j)[i]):g} J, implied power {power[i]:.4g} W, "
        f"{hint}. Profiles hold times in s and energies in J; if the numbers are right, "
        "override the check (check_power=False, or --allow-implausible-power on the CLI)"
    )


@dataclass(frozen=True)
class InstructionOptions:
    """The profiled options of one (stage, instruction), sorted by frequency descending.

    All profiled rows are kept, dominated ones included; the solver prunes.
    """

    freq_mhz: np.ndarray
    time_s: np.ndarray
    energy_j: np.ndarray

    def __len__(self) -> int:
        return len(self.freq_mhz)

    def scaled(self, factor: float) -> InstructionOptions:
        """The same options with time and energy multiplied by `factor` (interleaved chunks)."""
        return InstructionOptions(self.freq_mhz, self.time_s * factor, self.energy_j * factor)

    def index_of(self, freq_mhz: int) -> int:
        """Position of a frequency; `KeyError` if it was not profiled."""
        hits = np.flatnonzero(self.freq_mhz == freq_mhz)
        if len(hits) == 0:
            raise KeyError(freq_mhz)
        return int(hits[0])


class InstructionProfile:
    """Per-stage, per-instruction profiled options. Build with `from_rows` or `from_frame`
    (`perseus.io.profile_csv.load_profile` reads a CSV)."""

    def __init__(
        self, options: dict[tuple[int, str], InstructionOptions], *, source: str = "<memory>"
    ):
        stages = sorted({stage for stage, _ in options})
        if not stages:
            raise ProfileError(f"Profile {source} has no rows")
        if stages != list(range(len(stages))):
            missing = sorted(set(range(max(stages) + 1)) - set(stages))
            raise ProfileError(
                f"Profile {source} is missing stage(s) {missing}: stages must be numbered 0..S-1"
            )
        for (stage, instruction), opts in options.items():
            if len(opts) == 0:
                raise ProfileError(f"Profile {source} has no {instruction} rows for stage {stage}")
        for stage in stages:
            kinds = {k for s, k in options if s == stage}
            if "forward" not in kinds:
                raise ProfileError(f"Profile {source} has no forward rows for stage {stage}")
            split = [k for k in BACKWARD_SPLIT if k in kinds]
            if "backward" not in kinds and not split:
                raise ProfileError(f"Profile {source} has no backward rows for stage {stage}")
            if len(split) == 1:
                other = next(k for k in BACKWARD_SPLIT if k not in kinds)
                raise ProfileError(
                    f"Profile {source} has {split[0]} rows for stage {stage} but no {other} "
                    "rows: a split backward needs both halves"
                )
        self._options = dict(options)
        self.num_stages = len(stages)
        self.source = source
        self.emulated = False
        """Some rows were measured on emulated GPUs (set by `from_rows`): a model's numbers."""
        self.gpus_per_stage = 1
        """GPUs whose energies a stage's rows sum (the tensor-parallel degree; set by
        `from_rows`): a stage's blocking power may be this many GPUs' worth."""
        self.energy_se: dict[tuple[int, str, int], float] = {}
        """(stage, instruction, MHz) → the standard error (J) of an option whose energy was
        estimated from aggregate readings (set by `from_rows`); measured options are absent."""

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_rows(
        cls, rows: Iterable[ProfileRow], *, source: str = "<memory>", check_power: bool = True
    ) -> InstructionProfile:
        """Aggregate per-rank rows into per-stage options (see the module docstring).

        `check_power`: refuse rows whose implied power is implausible (`check_implied_power`).
        """
        rows = list(rows)
        if not rows:
            raise ProfileError(f"Profile {source} has no rows")
        if check_power:
            check_implied_power(
                np.array([r.stage for r in rows]),
                np.array([r.instruction for r in rows], dtype=object),
                np.array([r.frequency for r in rows]),
                np.array([r.time for r in rows], dtype=float),
                np.array([r.energy for r in rows], dtype=float),
                source=source,
            )
        first_dp = min(r.dp_rank for r in rows)
        # stage -> instruction -> rank -> frequency -> (time, energy)
        per_stage: dict[int, dict[str, dict[int, dict[int, tuple[float, float]]]]] = {}
        members: dict[int, set[int]] = {}
        variance: dict[tuple[int, str, int], float] = {}
        for r in rows:
            if r.dp_rank != first_dp:
                continue
            members.setdefault(r.stage, set()).add(r.rank)
            by_rank = per_stage.setdefault(r.stage, {}).setdefault(r.instruction, {})
            by_rank.setdefault(r.rank, {})[r.frequency] = (r.time, r.energy)
            if r.estimated:  # the stage's energy sums its GPUs': so do the variances
                key = (r.stage, r.instruction, r.frequency)
                se = math.inf if r.energy_se is None else r.energy_se
                variance[key] = variance.get(key, 0.0) + se * se
        options: dict[tuple[int, str], InstructionOptions] = {}
        for stage, by_kind in per_stage.items():
            for instruction in INSTRUCTIONS:
                if instruction not in by_kind:
                    continue
                by_rank = by_kind[instruction]
                measured = [by_rank.get(rank, {}) for rank in sorted(members[stage])]
                common = set.intersection(*(set(m) for m in measured)) if measured else set()
                freqs = np.array(sorted(common, reverse=True), dtype=np.int64)
                times = np.array([max(m[f][0] for m in measured) for f in freqs], dtype=float)
                energies = np.array([sum(m[f][1] for m in measured) for f in freqs], dtype=float)
                options[stage, instruction] = InstructionOptions(freqs, times, energies)
        profile = cls(options, source=source)
        profile.gpus_per_stage = max(len(m) for m in members.values())
        profile.emulated = any(r.emulated for r in rows)
        profile.energy_se = {
            key: math.sqrt(v)
            for key, v in variance.items()
            if profile.has(key[0], key[1]) and key[2] in options[key[0], key[1]].freq_mhz
        }
        return profile

    @classmethod
    def from_frame(
        cls, frame: pd.DataFrame, *, source: str = "<frame>", check_power: bool = True
    ) -> InstructionProfile:
        """Build from a DataFrame with columns ``stage,instruction,frequency,time,energy``.

        `check_power`: refuse rows whose implied power is implausible (`check_implied_power`).
        """
        import pandas as pd  # here: the solve path (profiles from CSV rows) runs without it

        needed = list(PROFILE_COLUMNS)
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise ProfileError(f"Profile {source} lacks column(s) {', '.join(missing)}")
        df = frame[needed].copy()
        for col in ("time", "energy"):
            values = pd.to_numeric(df[col], errors="coerce")
            bad = ~np.isfinite(values.to_numpy(dtype=float))
            if bad.any():
                raise ProfileError(
                    f"Profile {source}: column {col!r} has {int(bad.sum())} NaN/non-numeric value(s)"
                )
            df[col] = values
        if (df["time"] <= 0).any():
            raise ProfileError(f"Profile {source}: times must be positive")
        if (df["energy"] < 0).any():
            raise ProfileError(f"Profile {source}: energies must be non-negative")
        unknown = sorted(set(df["instruction"]) - set(INSTRUCTIONS))
        if unknown:
            raise ProfileError(
                f"Profile {source}: unknown instruction(s) {unknown}; expected one of "
                f"{', '.join(INSTRUCTIONS)}"
            )
        repeated = df.duplicated(["stage", "instruction", "frequency"])
        if repeated.any():
            row = df[repeated].iloc[0]
            raise ProfileError(
                f"Profile {source}: {int(repeated.sum())} repeated row(s), e.g. a second "
                f"{row['instruction']} at {row['frequency']} MHz of stage {row['stage']}; "
                "give each measurement once"
            )
        if check_power:
            check_implied_power(
                df["stage"].to_numpy(),
                df["instruction"].to_numpy(dtype=object),
                df["frequency"].to_numpy(),
                df["time"].to_numpy(dtype=float),
                df["energy"].to_numpy(dtype=float),
                source=source,
            )
        options: dict[tuple[int, str], InstructionOptions] = {}
        for (stage, instruction), group in df.groupby(["stage", "instruction"], sort=True):
            group = group.sort_values("frequency", ascending=False)
            options[int(stage), str(instruction)] = InstructionOptions(
                group["frequency"].to_numpy(dtype=np.int64),
                group["time"].to_numpy(dtype=float),
                group["energy"].to_numpy(dtype=float),
            )
        return cls(options, source=source)

    def split_backward(self, input_fraction: float = 0.5) -> InstructionProfile:
        """This profile with every full backward also split into its halves: at every
        clock, ``backward_input`` takes `input_fraction` of the backward's time and energy
        and ``backward_weight`` the rest (stages that already have split rows keep them).

        The default 0.5 is the zero-bubble paper's assumption (Qi et al., 2024) that the
        input- and weight-gradient halves each take about a forward's time, the full
        backward about two. Raises `ProfileError` for a fraction outside (0, 1).
        """
        f = float(input_fraction)
        if not (np.isfinite(f) and 0.0 < f < 1.0):
            raise ProfileError(
                f"The backward's input-gradient fraction must be in (0, 1), got {input_fraction!r}"
            )
        options = dict(self._options)
        for (stage, kind), o in self._options.items():
            if kind != "backward" or any(self.has(stage, k) for k in BACKWARD_SPLIT):
                continue
            options[stage, "backward_input"] = o.scaled(f)
            options[stage, "backward_weight"] = o.scaled(1.0 - f)
        split = InstructionProfile(options, source=self.source)
        split.gpus_per_stage = self.gpus_per_stage
        split.emulated = self.emulated
        split.energy_se = dict(self.energy_se)
        for (stage, kind, freq), se in self.energy_se.items():
            if kind == "backward" and (stage, "backward_input") not in self._options:
                split.energy_se[stage, "backward_input", freq] = se * f
                split.energy_se[stage, "backward_weight", freq] = se * (1.0 - f)
        return split

    def estimates(self) -> tuple[int, int, float, float] | None:
        """(options estimated, options in all, median and largest relative standard error)
        when some options' energies were estimated from aggregate readings, else None."""
        if not self.energy_se:
            return None
        rel = sorted(
            se / max(self.lookup(stage, kind, freq)[1], 1e-12)
            for (stage, kind, freq), se in self.energy_se.items()
        )
        total = sum(len(o) for o in self._options.values())
        return len(rel), total, float(np.median(rel)), rel[-1]

    # ---------------------------------------------------------------- queries
    def has(self, stage: int, instruction: str) -> bool:
        """Whether the profile measured `instruction` on `stage`."""
        return (stage, instruction) in self._options

    def kinds(self) -> list[str]:
        """The instruction kinds the profile holds, in `INSTRUCTIONS` order."""
        held = {k for _, k in self._options}
        return [k for k in INSTRUCTIONS if k in held]

    def options(self, stage: int, instruction: str) -> InstructionOptions:
        """The profiled options of one stage's instruction."""
        try:
            return self._options[stage, instruction]
        except KeyError:
            raise ProfileError(
                f"Profile {self.source} has no {instruction!r} for stage {stage} "
                f"(it has stages 0..{self.num_stages - 1}, instructions "
                f"{', '.join(self.kinds())})"
            ) from None

    def lookup(self, stage: int, instruction: str, freq_mhz: int) -> tuple[float, float]:
        """(time_s, energy_j) of one instruction at one profiled frequency."""
        opts = self.options(stage, instruction)
        try:
            i = opts.index_of(freq_mhz)
        except KeyError:
            raise PlanError(
                f"Frequency {freq_mhz} MHz was not profiled for stage {stage} {instruction} "
                f"(profiled: {int(opts.freq_mhz.min())}..{int(opts.freq_mhz.max())} MHz)"
            ) from None
        return float(opts.time_s[i]), float(opts.energy_j[i])

    def frequencies(self) -> list[int]:
        """All frequencies that appear anywhere in the profile, descending."""
        return sorted({int(f) for o in self._options.values() for f in o.freq_mhz}, reverse=True)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(sorted(self._options))

    def to_frame(self) -> pd.DataFrame:
        """The short-form table (one row per stage, instruction, frequency)."""
        import pandas as pd

        rows = [
            (stage, instruction, int(f), float(t), float(e))
            for (stage, instruction), o in sorted(self._options.items())
            for f, t, e in zip(o.freq_mhz, o.time_s, o.energy_j, strict=True)
        ]
        return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))

    def __repr__(self) -> str:
        return f"InstructionProfile(num_stages={self.num_stages}, source={self.source!r})"
