"""Entry point of the pipeline training job: ``torchrun ... -m perseus.train [options]``.

Reads the process layout from torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), builds this rank's stages of the
pipeline ``--schedule``, ``--layers`` and ``--chunks`` describe (`perseus.train.layout`;
``world_size / (pp_degree · tp_degree)`` data-parallel pipelines, ``--tp-degree`` tensor
ranks per stage, which stand in for tensor parallelism: `perseus.train.layout.Topology`),
and trains ``--steps`` iterations on
`torch.distributed.pipelining` with Perseus attached
(`perseus.integrations.pipelining.attach`) and talking to ``--server-url``. ``--loop
manual`` runs the hand-written 1F1B loop of `perseus.train.manual` instead: the example of
the low-level hook for other frameworks.

Every failure a user can cause or meet (unreachable coordinator, a rank that died, a bad
option) ends the process with exit status 1 and one line on stderr naming the problem.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from perseus.errors import ConfigurationError, PerseusError
from perseus.train.layout import DEFAULT_CHUNKS, SCHEDULE_CLASSES
from zeus_power.errors import ZeusError

__all__ = ["build_parser", "main"]


def _straggler(text: str) -> tuple[int, float, int]:
    try:
        dp, slowdown, step = text.split(":")
        return int(dp), float(slowdown), int(step)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--straggler {text!r} must be DP_RANK:SLOWDOWN:STEP, e.g. 1:1.2:6"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m perseus.train",
        description="Pipeline training of a small GPT on torch.distributed.pipelining, with "
        "Perseus attached.",
    )
    p.add_argument(
        "--schedule",
        choices=tuple(SCHEDULE_CLASSES),
        default="1f1b",
        help="Pipeline schedule: " + ", ".join(f"{k} ({v})" for k, v in SCHEDULE_CLASSES.items()),
    )
    p.add_argument(
        "--chunks",
        type=int,
        default=None,
        help=f"Stages per rank of the multi-stage schedules (default {DEFAULT_CHUNKS}; zbv: 2)",
    )
    p.add_argument(
        "--pp-degree",
        type=int,
        default=None,
        help="Pipeline ranks of a multi-stage schedule (default: the world size, one "
        "pipeline); world_size / pp_degree data-parallel pipelines",
    )
    p.add_argument(
        "--loop",
        choices=("torch", "manual"),
        default="torch",
        help="torch: torch.distributed.pipelining with attach(); manual: the hand-written "
        "1F1B loop that calls the low-level hook (example for other frameworks; 1f1b only)",
    )
    p.add_argument(
        "--tp-degree",
        type=int,
        default=1,
        help="Tensor ranks per stage (stand-ins: each runs the whole stage; Perseus plans them "
        "as a tensor-parallel group)",
    )
    p.add_argument(
        "--leaders-per-stage",
        type=int,
        default=1,
        help="Ranks per pipeline stage that talk to the coordinator (at most the data-parallel "
        "degree); the others get their schedules from them in-job",
    )
    p.add_argument(
        "--device-mesh",
        action="store_true",
        help="Give attach() a torch DeviceMesh (dp, pp, tp) instead of the ranks and degrees",
    )
    p.add_argument("--server-url", help="Perseus coordinator URL (omit with --no-hook)")
    p.add_argument("--no-hook", action="store_true", help="Train without Perseus (baseline)")
    p.add_argument("--steps", type=int, default=10, help="Training iterations")
    p.add_argument("--microbatches", type=int, default=4, help="Microbatches per iteration")
    p.add_argument(
        "--layers",
        default="2,4,3,1",
        help="Layers per pipeline stage, e.g. 2,4,3,1; a multi-stage schedule also takes one "
        "count per rank, split over the rank's stages",
    )
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.5, help="SGD learning rate")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument(
        "--device-id",
        type=int,
        default=None,
        help="this rank's GPU index on its node (default: LOCAL_RANK, which torchrun sets; "
        "launchers that do not (SLURM, mpirun) must pass it or set LOCAL_RANK)",
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=1,
        help="Untimed iterations without the hook before the first step (first-call costs)",
    )
    p.add_argument("--steps-per-round", type=int, default=1)
    p.add_argument("--timeout", type=float, default=30.0, help="Coordinator request timeout, s")
    p.add_argument(
        "--round-timeout",
        type=float,
        default=180.0,
        help="Schedule long-poll timeout, s (above the coordinator's round timeout)",
    )
    p.add_argument("--pg-timeout", type=float, default=60.0, help="torch.distributed timeout, s")
    p.add_argument("--job-metadata", default=None)
    p.add_argument("--trace-dir", default=None, help="Per-rank JSONL traces (PERSEUS_TRACE_DIR)")
    p.add_argument(
        "--nominal-ms-per-layer",
        type=float,
        default=4.0,
        help="Nominal forward time of one layer at the max clock, ms (nominal emulation; "
        "backward is twice the forward, its input- and weight-gradient halves one each)",
    )
    p.add_argument(
        "--straggler",
        type=_straggler,
        default=None,
        metavar="DP:SLOWDOWN:STEP",
        help="From STEP on, pipeline DP runs SLOWDOWN× slower (emulated) and rank 0 announces it",
    )
    return p


def _device_id(given: int | None, world_size: int) -> int:
    """This rank's GPU index on its node: `given` (``--device-id``), else ``LOCAL_RANK``,
    else 0 for a world of one; otherwise refused, since every rank of a node would take
    GPU 0 (and measure and set the clocks of one GPU)."""
    if given is not None:
        if given < 0:
            raise ConfigurationError(f"--device-id must be at least 0, got {given}")
        return given
    if "LOCAL_RANK" in os.environ:
        return _env_int("LOCAL_RANK")
    if world_size == 1:
        return 0
    raise ConfigurationError(
        "LOCAL_RANK is not set (a launcher other than torchrun, such as SLURM or mpirun): "
        "pass --device-id <this rank's GPU index on its node>, or set LOCAL_RANK"
    )


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise ConfigurationError(
            f"{name} is not set: launch with torchrun (e.g. torchrun --nproc-per-node 4 -m "
            "perseus.train ...)"
        )
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"{name}={value!r} is not an integer") from None


def _layout(args: argparse.Namespace, layers: list[int], world_size: int) -> Any:
    from perseus.train.layout import PipelineLayout, is_multi_stage

    if args.loop == "manual":
        if args.tp_degree != 1 or args.device_mesh:
            raise ConfigurationError(
                "--loop manual runs one rank per stage: --tp-degree and --device-mesh need the "
                "torch loop (--loop torch, the default)"
            )
        if args.schedule != "1f1b" or args.chunks not in (None, 1):
            raise ConfigurationError(
                f"--loop manual runs 1F1B with one stage per rank; --schedule {args.schedule} "
                "(and --chunks) need the torch loop (--loop torch, the default)"
            )
        return PipelineLayout.build("1f1b", layers, pp_degree=args.pp_degree)
    pp_degree = args.pp_degree
    if pp_degree is None and is_multi_stage(args.schedule):
        pp_degree = world_size // max(1, args.tp_degree)
    return PipelineLayout.build(args.schedule, layers, chunks=args.chunks, pp_degree=pp_degree)


def _run(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from perseus.train.layout import Topology, nominal_times
    from perseus.train.model import GPTConfig, parse_layers

    layers = parse_layers(args.layers)
    if args.steps < 1 or args.microbatches < 1 or args.warmup_steps < 0:
        raise ConfigurationError(
            f"--steps ({args.steps}) and --microbatches ({args.microbatches}) must be at least 1, "
            f"--warmup-steps ({args.warmup_steps}) at least 0"
        )
    if not args.no_hook and not args.server_url:
        raise ConfigurationError("--server-url is required (or pass --no-hook)")
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _device_id(args.device_id, world_size)
    layout = _layout(args, layers, world_size)
    topo = Topology(
        rank=rank, world_size=world_size, pp_degree=layout.pp_degree, tp_degree=args.tp_degree
    )
    nominal = nominal_times(layout, topo.pp_rank, args.nominal_ms_per_layer)
    config = GPTConfig(
        vocab_size=args.vocab,
        hidden=args.hidden,
        heads=args.heads,
        seq_len=args.seq_len,
        microbatch_size=args.microbatch_size,
    )
    torch.set_num_threads(args.threads)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend, timeout=datetime.timedelta(seconds=args.pg_timeout), device_id=None
    )
    hook_options: dict[str, Any] = {
        "device_id": local_rank,
        "leaders_per_stage": args.leaders_per_stage,
        "server_url": args.server_url,
        "job_metadata": args.job_metadata,
        "steps_per_round": args.steps_per_round,
        "timeout_s": args.timeout,
        "round_timeout_s": args.round_timeout,
        "nominal_time_s": nominal,
        "trace_dir": args.trace_dir,
    }
    train_step: Callable[[int], float | None]
    hook: Any = None
    closer: Any = None
    if args.loop == "manual":
        from perseus.client import PerseusOptimizer
        from perseus.protocol import PipelineSpec
        from perseus.train.manual import NullHook, PipelineTrainer

        manual = PipelineTrainer(
            config,
            list(layout.stage_layers),
            topo,
            args.microbatches,
            seed=args.seed,
            lr=args.lr,
            device=device,
        )
        for step in range(args.warmup_steps):
            manual.train_step(-1 - step, NullHook())
        gc.collect()
        gc.freeze()
        if not args.no_hook:
            hook = closer = PerseusOptimizer.from_layout(
                topo.layout,
                rank=rank,
                dp_rank=topo.dp_rank,
                pp_rank=topo.pp_rank,
                tp_rank=topo.tp_rank,
                pipeline=PipelineSpec.of(manual.schedule),
                **hook_options,
            )
        step_hook = hook if hook is not None else NullHook()

        def train_step(step: int) -> float | None:
            return manual.train_step(step, step_hook)
    else:
        from perseus.train.trainer import PipelinedTrainer

        trainer = PipelinedTrainer(
            config,
            layout,
            topo,
            args.microbatches,
            seed=args.seed,
            lr=args.lr,
            device=device,
            timeout=datetime.timedelta(seconds=args.pg_timeout),
        )
        # Untimed first steps: torch's shape inference and first-call costs.
        for step in range(args.warmup_steps):
            trainer.train_step(-1 - step)
        gc.collect()
        gc.freeze()
        if not args.no_hook:
            from perseus.integrations.pipelining import attach

            if args.device_mesh:  # the mesh says where this rank sits, not the options
                from torch.distributed.device_mesh import init_device_mesh

                hook_options["device_mesh"] = init_device_mesh(
                    device.type,
                    (topo.dp_degree, topo.pp_degree, topo.tp_degree),
                    mesh_dim_names=("dp", "pp", "tp"),
                )
            else:
                hook_options.update(dp_rank=topo.dp_rank, dp_degree=topo.dp_degree)
                hook_options.update(tp_rank=topo.tp_rank, tp_degree=topo.tp_degree)
            closer = attach(trainer.schedule, **hook_options)
            hook = closer.hook
        train_step = trainer.train_step
    # Long-lived objects (model, modules, torch internals) left the collector's view above,
    # so a full collection never stalls an instruction for milliseconds.
    trained = False
    try:
        first_loss = loss = None
        for step in range(args.steps):
            if hook is not None and args.straggler is not None:
                dp, slowdown, at_step = args.straggler
                if step == at_step:
                    if hook.emulator is not None and topo.dp_rank == dp:
                        hook.emulator.slowdown = slowdown
                    if rank == 0:
                        hook.announce_straggler(dp, slowdown)
            loss = train_step(step)
            first_loss = loss if first_loss is None else first_loss
        if loss is not None and topo.dp_rank == 0:
            print(
                f"perseus.train: loss {first_loss:.4f} -> {loss:.4f} over {args.steps} steps "
                f"({layout.schedule}, {layout.num_stages} stages on {layout.pp_degree} ranks)",
                flush=True,
            )
        trained = True
    finally:
        if closer is not None:
            closer.close(finish=trained)  # a failed run leaves the job to fail
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _run(args)
    except (PerseusError, ZeusError, ValueError) as exc:
        rank = os.environ.get("RANK", "?")
        print(
            f"perseus.train rank {rank}: error: {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        # Skip interpreter teardown: a process group whose peer died may block in its
        # destructor, and the error above is all the user needs.
        os._exit(1)
    return 0
