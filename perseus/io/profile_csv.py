"""The only reader and writer of instruction-profile CSV files.

Two forms are read: the long form Perseus's profiler writes
(``rank,dp_rank,pp_rank,tp_rank,stage,instruction,frequency,time,energy``, one row per
rank, instruction and frequency) and the short form ``stage,instruction,frequency,time,energy``
(then rank = pp_rank = stage, dp_rank = tp_rank = 0). The stage is the pipeline (virtual)
stage: in the long form a rank that holds several stages (interleaved, ZBV) has rows for
each. Every row is validated where it enters: integers for ids, a known instruction kind
(forward, backward, backward_input, backward_weight), a finite positive time (s), a finite
non-negative energy (J), a plausible implied power (energy / time; see
`perseus.domain.profile.check_implied_power`), no second row for the same rank, stage, instruction and frequency.
Errors name the file and line.

Either form may carry one more column, ``emulated`` (``true``/``false``; absent or empty:
false): rows measured on an emulated GPU say so. The writer adds it only when some row is
emulated, so profiles from real GPUs keep exactly the columns above, and readers that
predate the column ignore it.

And two more that say how a row's energy was obtained: ``method`` (``measured``: for this
instruction alone; ``estimated``: fitted to aggregate readings, the energy counter's
refreshes over many instructions, as the online profiler does on real GPUs; absent or
empty: measured) and ``energy_se`` (the estimate's standard error in J, ``inf`` when the
readings could not tell it; empty for measured rows). The writer adds both only when some
row is estimated; files without them load as before.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from perseus.domain.kinds import INSTRUCTIONS, PROFILE_COLUMNS
from perseus.domain.rows import ProfileRow
from perseus.errors import ProfileError
from perseus.io.atomic import atomic_write_text

if TYPE_CHECKING:
    import pandas as pd

    from perseus.domain.profile import InstructionProfile

__all__ = [
    "CSV_COLUMNS",
    "EMULATED_COLUMN",
    "METHODS",
    "METHOD_COLUMN",
    "SE_COLUMN",
    "SHORT_CSV_COLUMNS",
    "load_profile",
    "read_profile_rows",
    "save_profile",
    "write_profile_frame",
    "write_profile_rows",
]

CSV_COLUMNS = (
    "rank",
    "dp_rank",
    "pp_rank",
    "tp_rank",
    "stage",
    "instruction",
    "frequency",
    "time",
    "energy",
)
SHORT_CSV_COLUMNS = PROFILE_COLUMNS
_ID_COLUMNS = ("stage", "rank", "dp_rank", "pp_rank", "tp_rank")
EMULATED_COLUMN = "emulated"
"""The optional column that marks rows measured on an emulated GPU."""
METHOD_COLUMN = "method"
"""The optional column that says how a row's energy was obtained (`METHODS`)."""
SE_COLUMN = "energy_se"
"""The optional column with an estimated row's standard error, J."""
METHODS = ("measured", "estimated")
_BOOLEANS = {"": False, "false": False, "0": False, "true": True, "1": True}


def _check_suffix(path: Path) -> None:
    if path.suffix != ".csv":
        raise ProfileError(f"Profile path {str(path)!r} must end with '.csv'")


def read_profile_rows(path: str | os.PathLike[str]) -> list[ProfileRow]:
    """Read and validate every row of a profile CSV (long or short form)."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = tuple(h.strip() for h in (reader.fieldnames or ()))
            raw_rows = list(reader)
    except OSError as exc:
        raise ProfileError(f"Cannot read profile {str(path)!r}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ProfileError(f"Profile {str(path)!r} is not a UTF-8 CSV text file ({exc})") from None
    if set(CSV_COLUMNS) <= set(header):
        long_form = True
    elif set(SHORT_CSV_COLUMNS) <= set(header):
        long_form = False
    else:
        missing = sorted(set(SHORT_CSV_COLUMNS) - set(header))
        raise ProfileError(
            f"Profile {str(path)!r} lacks column(s) {', '.join(missing)}; expected "
            f"{','.join(SHORT_CSV_COLUMNS)} (or the long form {','.join(CSV_COLUMNS)})"
        )
    rows: list[ProfileRow] = []
    seen: set[tuple[int, int, int, int, int, str, int]] = set()
    for lineno, raw in enumerate(raw_rows, start=2):
        row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        try:
            stage = int(row["stage"])
            rank, dp_rank, pp_rank, tp_rank = (
                (int(row["rank"]), int(row["dp_rank"]), int(row["pp_rank"]), int(row["tp_rank"]))
                if long_form
                else (stage, 0, stage, 0)
            )
            freq = int(float(row["frequency"]))
            time_s = float(row["time"])
            energy_j = float(row["energy"])
        except (TypeError, ValueError) as exc:
            raise ProfileError(f"{path}:{lineno}: unparsable value ({exc})") from None
        id_columns = _ID_COLUMNS if long_form else ("stage",)
        negative = [k for k in id_columns if int(row[k]) < 0]
        if negative:
            raise ProfileError(
                f"{path}:{lineno}: "
                + ", ".join(f"{k} must be >= 0, got {row[k]}" for k in negative)
            )
        instruction = row["instruction"]
        if instruction not in INSTRUCTIONS:
            raise ProfileError(
                f"{path}:{lineno}: instruction {instruction!r} is not one of {', '.join(INSTRUCTIONS)}"
            )
        if not (math.isfinite(time_s) and time_s > 0):
            raise ProfileError(
                f"{path}:{lineno}: time must be a positive number, got {row['time']!r}"
            )
        if not (math.isfinite(energy_j) and energy_j >= 0):
            raise ProfileError(
                f"{path}:{lineno}: energy must be a non-negative number, got {row['energy']!r}"
            )
        emulated = _BOOLEANS.get(row.get(EMULATED_COLUMN, "").lower())
        if emulated is None:
            raise ProfileError(
                f"{path}:{lineno}: {EMULATED_COLUMN} must be true or false, got "
                f"{row[EMULATED_COLUMN][:40]!r}"
            )
        method = row.get(METHOD_COLUMN, "").lower() or "measured"
        if method not in METHODS:
            raise ProfileError(
                f"{path}:{lineno}: {METHOD_COLUMN} must be one of {', '.join(METHODS)}, got "
                f"{row[METHOD_COLUMN][:40]!r}"
            )
        energy_se: float | None = None
        if row.get(SE_COLUMN, ""):
            try:
                energy_se = float(row[SE_COLUMN])
            except ValueError:
                energy_se = -1.0
            if not energy_se >= 0:  # NaN too
                raise ProfileError(
                    f"{path}:{lineno}: {SE_COLUMN} must be a non-negative number of joules "
                    f"(or inf), got {row[SE_COLUMN][:40]!r}"
                )
        estimated = method == "estimated"
        if estimated and energy_se is None:
            energy_se = math.inf
        key = (rank, dp_rank, pp_rank, tp_rank, stage, instruction, freq)
        if key in seen:
            raise ProfileError(
                f"{path}:{lineno}: a second row for {instruction} at {freq} MHz of stage "
                f"{stage} (rank {rank}); give each measurement once"
            )
        seen.add(key)
        rows.append(
            ProfileRow(
                rank,
                dp_rank,
                pp_rank,
                tp_rank,
                stage,
                instruction,
                freq,
                time_s,
                energy_j,
                emulated,
                estimated,
                energy_se if estimated else None,
            )
        )
    if not rows:
        raise ProfileError(f"Profile {str(path)!r} has no rows")
    return rows


def write_profile_rows(path: str | os.PathLike[str], rows: Iterable[ProfileRow]) -> None:
    """Write rows in the long form, atomically (times and energies round-trip exactly).

    With an ``emulated`` column when some row was measured on an emulated GPU, and
    ``method`` and ``energy_se`` when some row's energy was estimated."""
    path = Path(path)
    _check_suffix(path)
    rows = list(rows)
    emulated = any(r.emulated for r in rows)
    estimated = any(r.estimated for r in rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(
        CSV_COLUMNS
        + ((EMULATED_COLUMN,) if emulated else ())
        + ((METHOD_COLUMN, SE_COLUMN) if estimated else ())
    )
    for r in rows:
        writer.writerow(
            [
                r.rank,
                r.dp_rank,
                r.pp_rank,
                r.tp_rank,
                r.stage,
                r.instruction,
                r.frequency,
                repr(float(r.time)),
                repr(float(r.energy)),
                *(("true" if r.emulated else "false",) if emulated else ()),
                *(
                    (
                        METHODS[r.estimated],
                        repr(float(r.energy_se)) if r.energy_se is not None else "",
                    )
                    if estimated
                    else ()
                ),
            ]
        )
    atomic_write_text(path, buf.getvalue())


def load_profile(path: str | os.PathLike[str], *, check_power: bool = True) -> InstructionProfile:
    """Read, validate and aggregate a profile CSV into per-stage options.

    `check_power=False` accepts rows whose implied power (energy / time) is outside the
    plausible GPU range (`perseus.domain.profile.check_implied_power`)."""
    from perseus.domain.profile import InstructionProfile  # numpy/pandas: only when needed

    return InstructionProfile.from_rows(
        read_profile_rows(path), source=str(path), check_power=check_power
    )


def save_profile(profile: InstructionProfile, path: str | os.PathLike[str]) -> None:
    """Write a profile in the short form, atomically."""
    write_profile_frame(profile.to_frame(), path)


def write_profile_frame(
    frame: pd.DataFrame, path: str | os.PathLike[str], *, float_format: str | None = None
) -> None:
    """Write a short-form table as it is (rows in its order), after validating it."""
    from perseus.domain.profile import InstructionProfile  # numpy/pandas: only when needed

    InstructionProfile.from_frame(frame, source=str(path))
    atomic_write_text(path, frame.to_csv(index=False, float_format=float_format))
