"""Models shared by the Perseus coordinator and its per-rank client (the seed API).

Names, fields and semantics follow Zeus's `zeus.optimizer.perseus.common`, rewritten for
pydantic v2. Wire lists use `RootModel`; files are written atomically.
"""

from __future__ import annotations

import asyncio
import csv
import importlib
import inspect
import io
import math
import os
import tempfile
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from perseus.errors import ConfigurationError, ProfileError

__all__ = [
    "CSV_COLUMNS",
    "SHORT_CSV_COLUMNS",
    "FrequencySchedule",
    "InstructionProfilingResult",
    "JobInfo",
    "OfflineProfilingResult",
    "PerseusSettings",
    "ProfilingResult",
    "RankInfo",
    "atomic_write_text",
    "load_prof",
    "load_ranks",
    "load_sched",
    "resolve_scheduler",
    "save_prof",
    "save_ranks",
    "save_sched",
]

GET_SCHEDULE_URL = "/schedule/{job_id}"
REGISTER_JOB_URL = "/register_job"
REGISTER_RANK_URL = "/register_rank/{job_id}"
REPORT_RESULT_URL = "/result/{job_id}"
STRAGGLER_URL = "/straggler/{job_id}"
INFO_URL = "/info"

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
SHORT_CSV_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
_ID_COLUMNS = ("stage", "rank", "dp_rank", "pp_rank", "tp_rank")
INSTRUCTIONS = ("forward", "backward")


def resolve_scheduler(name: str) -> type:
    """Resolve a scheduler name to its class.

    A short name (``"AllMaxFrequency"``) is looked up in the `schedulers` registry; a
    ``"package.module:Class"`` name loads a user plugin. Errors list the valid names.
    """
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(
                f"Cannot import scheduler plugin module {module_name!r} (from {name!r}): {exc}"
            ) from exc
        try:
            cls = getattr(module, attr)
        except AttributeError as exc:
            raise ConfigurationError(
                f"Module {module_name!r} has no scheduler class {attr!r}"
            ) from exc
        if not inspect.isclass(cls):
            raise ConfigurationError(f"Scheduler plugin {name!r} is not a class")
        return cls
    registry = importlib.import_module("schedulers").SCHEDULERS
    try:
        return registry[name]
    except KeyError:
        raise ConfigurationError(
            f"Unknown scheduler {name!r}. Valid names: {', '.join(sorted(registry))}; "
            "or give a plugin as 'package.module:ClassName'."
        ) from None


class PerseusSettings(BaseSettings):
    """Perseus settings, configurable via environment variables with the ``PERSEUS_`` prefix.

    For instance, ``PERSEUS_SCHEDULER=AllMaxFrequency`` resolves the class
    `schedulers.AllMaxFrequency`, and `scheduler` then holds a reference to that class.

    Attributes:
        scheduler: The scheduler class (given by name: a registry name or ``module:Class``).
        scheduler_args: Extra keyword arguments for the scheduler's constructor, as JSON in
            the environment (``PERSEUS_SCHEDULER_ARGS='{"max_slowdown": 0.02}'``); checked
            against the constructor's signature when the settings are built.
        log_level: Log level, e.g. "debug", "info".
        dump_data: Whether to dump internal state (ranks, schedules, results) to `dump_dir`.
        dump_dir: Directory to dump state in (if enabled).
        max_job_idle_time: Seconds a job may stay idle before the coordinator evicts it.
    """

    model_config = SettingsConfigDict(env_prefix="PERSEUS_", extra="forbid", validate_default=True)

    scheduler: Any = Field(default="Perseus", description="Scheduler name or module:Class.")
    scheduler_args: dict[str, Any] = Field(default_factory=dict)
    log_level: str = "info"
    dump_data: bool = False
    dump_dir: str = "./dump"
    max_job_idle_time: int = Field(default=60 * 60 * 24 * 7, gt=0)

    @field_validator("scheduler", mode="before")
    @classmethod
    def _resolve_scheduler(cls, value: Any) -> type:
        if isinstance(value, str):
            return resolve_scheduler(value.strip())
        if inspect.isclass(value):
            return value
        raise ConfigurationError(f"scheduler must be a name or a class, got {value!r}")

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        valid = ("critical", "error", "warning", "info", "debug", "trace")
        if value.lower() not in valid:
            raise ValueError(f"log_level {value!r} is not one of {', '.join(valid)}")
        return value.lower()

    @model_validator(mode="after")
    def _validate_scheduler_args(self) -> PerseusSettings:
        """Check the args against the scheduler's constructor (job_info etc. are implied)."""
        signature = inspect.signature(self.scheduler)
        full_args = {
            "job_info": None,
            "rank_infos": None,
            "perseus_settings": None,
            **self.scheduler_args,
        }
        try:
            signature.bind(**full_args)
        except TypeError as exc:
            params = [
                p
                for p in signature.parameters
                if p not in ("job_info", "rank_infos", "perseus_settings")
            ]
            raise ConfigurationError(
                f"Invalid scheduler_args {self.scheduler_args!r} for {self.scheduler.__name__}: {exc}. "
                f"It accepts: {', '.join(params) or 'no arguments'}."
            ) from None
        return self

    @field_serializer("scheduler")
    def _serialize_scheduler(self, value: type) -> str:
        return value.__name__

    @property
    def scheduler_name(self) -> str:
        """The scheduler class's name."""
        return self.scheduler.__name__


class JobInfo(BaseModel):
    """Training job information reported to the server.

    Attributes:
        job_id: Globally unique ID of the training job, generated by the server.
            This field should be an empty string when sent to the server.
        pp_degree: Pipeline parallel degree.
        dp_degree: Data parallel degree.
        tp_degree: Tensor parallel degree.
        world_size: World size of the training job (= pp · dp · tp).
        job_metadata: An optional arbitrary string that describes the job. This will be
            appended to the job ID if given. Typically for logging purposes.
    """

    model_config = ConfigDict(validate_assignment=False)

    job_id: str = ""
    pp_degree: int = Field(ge=1)
    dp_degree: int = Field(ge=1)
    tp_degree: int = Field(ge=1)
    world_size: int = Field(ge=1)
    job_metadata: str | None = None

    @field_validator("job_id")
    @classmethod
    def _check_empty_job_id(cls, job_id: str) -> str:
        if job_id:
            raise ValueError("job_id is generated by the server; send an empty string")
        return job_id

    @model_validator(mode="after")
    def _check_world_size(self) -> JobInfo:
        """Product of PP, DP, and TP degree must equal the world size."""
        product = self.pp_degree * self.dp_degree * self.tp_degree
        if product != self.world_size:
            raise ValueError(
                f"pp_degree·dp_degree·tp_degree = {self.pp_degree}·{self.dp_degree}·"
                f"{self.tp_degree} = {product} != world_size {self.world_size}"
            )
        return self

    def set_job_id(self, scheduler_name: str) -> None:
        """Generate and set the job ID: timestamp, scheduler, a unique suffix, metadata."""
        job_id = f"{datetime.now().strftime('%F-%H-%M-%S')}+{scheduler_name}+{uuid.uuid4().hex[:8]}"
        if self.job_metadata:
            job_id += f"+{self.job_metadata}"
        # Bypass the "empty on submit" validator: the server is the one setting it.
        object.__setattr__(self, "job_id", job_id)


class RankInfo(BaseModel):
    """Information passed to the server from each rank.

    Attributes:
        rank: Global rank of the reporting process.
        dp_rank: Data parallel rank of the reporting process.
        pp_rank: Pipeline parallel rank of the reporting process.
        tp_rank: Tensor parallel rank of the reporting process.
        available_frequencies: List of available frequencies (MHz) for the rank's GPU.
    """

    rank: int = Field(ge=0)
    dp_rank: int = Field(ge=0)
    pp_rank: int = Field(ge=0)
    tp_rank: int = Field(ge=0)
    available_frequencies: list[int]


class FrequencySchedule(BaseModel):
    """Frequency schedule for one iteration of one rank.

    `frequencies` is a list of (instruction name, frequency in MHz), in execution order.
    """

    rank: int = Field(ge=0)
    frequencies: list[tuple[str, int]]


class ProfilingResult(BaseModel):
    """Profiling results for a `FrequencySchedule` of a rank.

    Attributes:
        rank: Global rank of the reporting client.
        iter_time: Latency of all iterations within the profiling window, in seconds.
        iter_energy: Energy of all iterations within the profiling window, in Joules.
        time_breakdown: Duration of each operation across iterations, e.g.
            ``{"forward": [[0.1, 0.12], [0.1, 0.11]]}`` (iteration × occurrence).
        energy_breakdown: Energy of each operation, same structure as `time_breakdown`.
    """

    rank: int = Field(ge=0)
    iter_time: list[float]
    iter_energy: list[float]
    time_breakdown: dict[str, list[list[float]]] = Field(default_factory=dict)
    energy_breakdown: dict[str, list[list[float]]] = Field(default_factory=dict)


class OfflineProfilingResult(BaseModel):
    """Profiling results generated from offline profiling each instruction.

    Attributes:
        rank: Global rank of the reporting client.
        dp_rank, pp_rank, tp_rank: Parallel ranks of the reporting process.
        forward_time: Frequency → average forward computation time (s).
        forward_energy: Frequency → average forward computation energy (J).
        backward_time: Frequency → average backward computation time (s).
        backward_energy: Frequency → average backward computation energy (J).
    """

    rank: int = Field(ge=0)
    dp_rank: int = Field(ge=0)
    pp_rank: int = Field(ge=0)
    tp_rank: int = Field(ge=0)
    forward_time: dict[int, float]
    forward_energy: dict[int, float]
    backward_time: dict[int, float]
    backward_energy: dict[int, float]


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and rename, so readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class InstructionProfilingResult(RootModel[list[OfflineProfilingResult]]):
    """Time and energy profiling results for each instruction in each stage."""

    def to_csv(self, filepath: str | os.PathLike[str]) -> None:
        """Serialize and save this object into a CSV file.

        Columns: rank, dp_rank, pp_rank, tp_rank, stage, instruction, frequency, time, energy

        Notes:
            - `rank` is the global rank of the process.
            - `pp_rank` and `stage` are always the same, for backwards compatibility.
            - All ranks and `stage` are zero-indexed.
            - `instruction` is either "forward" or "backward".
            - `time` and `energy` are already averaged over profiling iterations.
        """
        path = Path(filepath)
        if path.suffix != ".csv":
            raise ValueError(f"Profile path {str(filepath)!r} must end with '.csv'")
        lines: list[list[Any]] = []
        for res in self.root:
            for instruction in INSTRUCTIONS:
                times: dict[int, float] = getattr(res, f"{instruction}_time")
                energies: dict[int, float] = getattr(res, f"{instruction}_energy")
                for freq in sorted(times, reverse=True):
                    if freq not in energies:
                        raise ValueError(
                            f"rank {res.rank}: {instruction} at {freq} MHz has a time but no energy"
                        )
                    lines.append(
                        [
                            res.rank,
                            res.dp_rank,
                            res.pp_rank,
                            res.tp_rank,
                            res.pp_rank,
                            instruction,
                            freq,
                            repr(times[freq]),
                            repr(energies[freq]),
                        ]
                    )
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        writer.writerows(lines)
        atomic_write_text(path, buf.getvalue())

    @classmethod
    def from_csv(cls, filepath: str | os.PathLike[str]) -> InstructionProfilingResult:
        """Read a profile CSV, in the long form `to_csv` writes or the short
        ``stage,instruction,frequency,time,energy`` form (then rank = pp_rank = stage)."""
        path = Path(filepath)
        try:
            with path.open(newline="") as f:
                reader = csv.DictReader(f)
                header = tuple(h.strip() for h in (reader.fieldnames or ()))
                rows = list(reader)
        except OSError as exc:
            raise ProfileError(f"Cannot read profile {str(path)!r}: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, csv.Error) as exc:
            raise ProfileError(
                f"Profile {str(path)!r} is not a UTF-8 CSV text file ({exc})"
            ) from None
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
        by_rank: dict[tuple[int, int, int, int], dict[str, dict[int, float]]] = {}
        for lineno, row in enumerate(rows, start=2):
            row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
            try:
                stage = int(row["stage"])
                ids = (
                    (
                        int(row["rank"]),
                        int(row["dp_rank"]),
                        int(row["pp_rank"]),
                        int(row["tp_rank"]),
                    )
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
            entry = by_rank.setdefault(
                ids, {f"{i}_{q}": {} for i in INSTRUCTIONS for q in ("time", "energy")}
            )
            if freq in entry[f"{instruction}_time"]:
                raise ProfileError(
                    f"{path}:{lineno}: a second row for {instruction} at {freq} MHz of stage "
                    f"{stage} (rank {ids[0]}); give each measurement once"
                )
            entry[f"{instruction}_time"][freq] = time_s
            entry[f"{instruction}_energy"][freq] = energy_j
        if not by_rank:
            raise ProfileError(f"Profile {str(path)!r} has no rows")
        return cls(
            [
                OfflineProfilingResult(rank=r, dp_rank=d, pp_rank=p, tp_rank=t, **data)
                for (r, d, p, t), data in sorted(by_rank.items())
            ]
        )


class _ProfilingResultList(RootModel[list[ProfilingResult]]):
    pass


class _FrequencyScheduleList(RootModel[list[FrequencySchedule]]):
    pass


class _RankInfoList(RootModel[list[RankInfo]]):
    pass


async def save_prof(
    data: list[ProfilingResult], directory: str | os.PathLike[str], schedule_num: int
) -> None:
    """Save a list of `ProfilingResult`s in the designated directory."""
    text = _ProfilingResultList(data).model_dump_json()
    await asyncio.to_thread(atomic_write_text, Path(directory) / f"{schedule_num}.prof.json", text)


def load_prof(directory: str | os.PathLike[str], schedule_num: int) -> list[ProfilingResult]:
    """Load a list of `ProfilingResult`s saved in the designated directory."""
    text = (Path(directory) / f"{schedule_num}.prof.json").read_text()
    return _ProfilingResultList.model_validate_json(text).root


async def save_sched(
    data: list[FrequencySchedule], directory: str | os.PathLike[str], schedule_num: int
) -> None:
    """Save a list of `FrequencySchedule`s in the designated directory."""
    text = _FrequencyScheduleList(data).model_dump_json()
    await asyncio.to_thread(atomic_write_text, Path(directory) / f"{schedule_num}.sched.json", text)


def load_sched(directory: str | os.PathLike[str], schedule_num: int) -> list[FrequencySchedule]:
    """Load a list of `FrequencySchedule`s saved in the designated directory."""
    text = (Path(directory) / f"{schedule_num}.sched.json").read_text()
    return _FrequencyScheduleList.model_validate_json(text).root


async def save_ranks(data: list[RankInfo], directory: str | os.PathLike[str]) -> None:
    """Save a list of `RankInfo`s in the designated directory."""
    text = _RankInfoList(data).model_dump_json()
    await asyncio.to_thread(atomic_write_text, Path(directory) / "ranks.json", text)


def load_ranks(directory: str | os.PathLike[str]) -> list[RankInfo]:
    """Load a list of `RankInfo`s saved in the designated directory."""
    text = (Path(directory) / "ranks.json").read_text()
    return _RankInfoList.model_validate_json(text).root
