"""Perseus in torchtitan without code edits: torchtitan's own trainer and command line, with
Perseus attached to its pipeline schedule.

torchtitan (0.2) trains with ``torchrun ... -m torchtitan.train --job.config_file C.toml``;
its documented extensions are a trainer class run through ``torchtitan.train.main`` and
extra config sections from ``--job.custom_config_module``. This module is both: run it in
place of ``torchtitan.train`` and keep every other argument::

    PERSEUS_SERVER_URL=http://coordinator:7787 torchrun --nproc_per_node 8 \\
        -m perseus.integrations.torchtitan --job.config_file llama3_8b.toml \\
        --parallelism.pipeline_parallel_degree 2

It runs torchtitan's `Trainer` (`trainer_class`), which, once torchtitan's constructor has
built the pipeline schedule, attaches Perseus to ``self.pp_schedule`` with the trainer's
device mesh (`perseus.integrations.pipelining.attach`: the job registers with the schedule's
own action order, and every stage's forward and backward become Perseus instructions), and
closes Perseus (restoring the GPUs' clocks, ending the job as finished, or not after an
error) before torchtitan's own ``close``. Its config gains a ``[perseus]`` section
(`PerseusConfig`; the module names itself as ``--job.custom_config_module`` unless the
command line or the config file names another, whose ``JobConfig`` should then extend
this one's):
``--perseus.server_url`` (default: ``PERSEUS_SERVER_URL``), ``--perseus.job_metadata``,
``--perseus.no-enable`` to train without Perseus. Without pipeline parallelism it attaches
nothing and says so once; asked for Perseus without a coordinator URL, it refuses to start.

torchtitan is imported only when the trainer is built: this module imports without it.
"""

# No `from __future__ import annotations`: torchtitan merges `JobConfig` into its own by the
# fields' types, which must be classes, not strings.
import logging
import os
import sys
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from perseus.errors import ConfigurationError

__all__ = [
    "SERVER_URL_ENV",
    "JobConfig",
    "PerseusConfig",
    "PerseusJobConfig",
    "device_mesh",
    "main",
    "trainer_class",
    "with_config_module",
]

logger = logging.getLogger(__name__)

SERVER_URL_ENV = "PERSEUS_SERVER_URL"
"""Where the coordinator is when ``--perseus.server_url`` is not given."""

_CONFIG_MODULE_FLAGS = ("--job.custom_config_module", "--job.custom-config-module")
_THIS_MODULE = "perseus.integrations.torchtitan"  # also when run as __main__


@dataclass
class PerseusConfig:
    """The ``[perseus]`` section of torchtitan's config (``--perseus.<field>``)."""

    enable: bool = True
    """Attach Perseus to the pipeline schedule (``--perseus.no-enable``: torchtitan alone)."""
    server_url: str = ""
    """The coordinator, e.g. ``http://coordinator:7787`` (empty: ``PERSEUS_SERVER_URL``)."""
    job_metadata: str = ""
    """Free text appended to the job id."""


@dataclass
class PerseusJobConfig:
    """What this module adds to torchtitan's ``JobConfig`` (``--job.custom_config_module``
    merges in the module's ``JobConfig``: this class)."""

    perseus: PerseusConfig = field(default_factory=PerseusConfig)


JobConfig = PerseusJobConfig
"""The name torchtitan looks for in a custom config module."""


@cache
def trainer_class() -> type[Any]:
    """torchtitan's `Trainer` with Perseus attached to its pipeline schedule (built once,
    on first use: it imports torchtitan)."""
    from torchtitan.train import Trainer

    from perseus.integrations.pipelining import PipelineAttachment, attach

    class PerseusTrainer(Trainer):  # type: ignore[misc, valid-type]
        """torchtitan's `Trainer`, with Perseus attached to its pipeline schedule."""

        def __init__(self, job_config: Any) -> None:
            self.perseus: PipelineAttachment | None = None
            settings = getattr(job_config, "perseus", None) or PerseusConfig()
            url = settings.server_url or os.environ.get(SERVER_URL_ENV, "")
            if settings.enable and not url:
                raise ConfigurationError(
                    "Perseus needs the coordinator's URL: --perseus.server_url or "
                    f"{SERVER_URL_ENV} (or --perseus.no-enable to train without Perseus)"
                )
            super().__init__(job_config)
            if not settings.enable:
                return
            if not self.parallel_dims.pp_enabled:
                logger.warning(
                    "Perseus: pipeline parallelism is off "
                    "(--parallelism.pipeline_parallel_degree 1): nothing to plan, "
                    "training without Perseus"
                )
                return
            self.perseus = attach(
                self.pp_schedule,
                server_url=url,
                device_mesh=device_mesh(self.parallel_dims),
                job_metadata=settings.job_metadata or None,
            )

        def close(self) -> None:
            try:
                if self.perseus is not None:
                    # torchtitan's main() closes the trainer after an error too: then the
                    # job is not reported finished.
                    self.perseus.close(finish=sys.exc_info()[0] is None)
                    self.perseus = None
            finally:
                super().close()

    return PerseusTrainer


def device_mesh(parallel_dims: Any) -> Any:
    """The trainer's device mesh with its dimensions named (``pp`` among them), for
    `attach` to read this rank's place from: torchtitan 0.2 keeps a flat ``world`` mesh and
    unflattens it into named ones, of which the data-loading mesh (``pp``, ``batch``,
    ``cp``, ``tp``, degree-1 dimensions included) covers every rank once."""
    world = parallel_dims.world_mesh
    if "pp" in (getattr(world, "mesh_dim_names", None) or ()):
        return world
    mesh = (getattr(parallel_dims, "_global_meshes", None) or {}).get("dataloading")
    if mesh is None or "pp" not in (mesh.mesh_dim_names or ()):
        raise ConfigurationError(
            "this torchtitan's ParallelDims has no device mesh with a 'pp' dimension that "
            "Perseus knows of (torchtitan 0.2's data-loading mesh): its version is not "
            "supported by perseus.integrations.torchtitan"
        )
    return mesh


def with_config_module(argv: list[str]) -> list[str]:
    """`argv` naming this module as torchtitan's ``--job.custom_config_module``, unless the
    command line or its config file (``--job.config_file``, ``[job] custom_config_module``)
    names one: then that module's ``JobConfig`` should extend this one's."""
    if any(arg.split("=", 1)[0] in _CONFIG_MODULE_FLAGS for arg in argv):
        return argv
    config_file = _flag_value(argv, ("--job.config_file", "--job.config-file"))
    if config_file is not None and _toml_names_a_config_module(config_file):
        return argv
    return [*argv, f"{_CONFIG_MODULE_FLAGS[0]}={_THIS_MODULE}"]


def _flag_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _toml_names_a_config_module(path: str) -> bool:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: torchtitan depends on tomli
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as f:
            job = tomllib.load(f).get("job", {})
    except (OSError, ValueError):
        return False  # torchtitan reports the file's problem itself
    return isinstance(job, dict) and bool(job.get("custom_config_module"))


def main(argv: list[str] | None = None) -> None:
    """torchtitan's ``main`` with `trainer_class` (``python -m perseus.integrations.torchtitan``)."""
    args = with_config_module(sys.argv[1:] if argv is None else argv)
    # Before torchtitan is imported: its ConfigManager.parse_args takes sys.argv[1:] as it
    # was at import time (a default argument).
    sys.argv[1:] = args
    from torchtitan.train import main as torchtitan_main

    torchtitan_main(trainer_class())


if __name__ == "__main__":
    main()
