"""Entry point of the pipeline training job: ``torchrun ... -m perseus.train [options]``.

Reads the process layout from torchrun's environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), builds the stage given by ``--layers``
(one layer count per stage; ``world_size / stages`` data-parallel pipelines), and trains
``--steps`` iterations of 1F1B with the Perseus hook talking to ``--server-url``.

Every failure a user can cause or meet (unreachable coordinator, a rank that died, a bad
option) ends the process with exit status 1 and one line on stderr naming the problem.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import sys
from collections.abc import Sequence

from perseus.errors import ConfigurationError, PerseusError
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
        description="1F1B pipeline training of a small GPT with the Perseus per-rank hook.",
    )
    p.add_argument("--server-url", help="Perseus coordinator URL (omit with --no-hook)")
    p.add_argument("--no-hook", action="store_true", help="Train without Perseus (baseline)")
    p.add_argument("--steps", type=int, default=10, help="Training iterations")
    p.add_argument("--microbatches", type=int, default=4, help="Microbatches per iteration")
    p.add_argument("--layers", default="2,4,3,1", help="Layers per stage, e.g. 2,4,3,1")
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
        "backward is twice the forward)",
    )
    p.add_argument(
        "--straggler",
        type=_straggler,
        default=None,
        metavar="DP:SLOWDOWN:STEP",
        help="From STEP on, pipeline DP runs SLOWDOWN× slower (emulated) and rank 0 announces it",
    )
    return p


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


def _run(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from perseus.client import PerseusOptimizer
    from perseus.train.model import GPTConfig, parse_layers
    from perseus.train.pipeline import NullHook, PipelineTrainer, Topology

    layers = parse_layers(args.layers)
    if args.steps < 1 or args.microbatches < 1 or args.warmup_steps < 0:
        raise ConfigurationError(
            f"--steps ({args.steps}) and --microbatches ({args.microbatches}) must be at least 1, "
            f"--warmup-steps ({args.warmup_steps}) at least 0"
        )
    if not args.no_hook and not args.server_url:
        raise ConfigurationError("--server-url is required (or pass --no-hook)")
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    topo = Topology(rank=rank, world_size=world_size, pp_degree=len(layers))
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
    trainer = PipelineTrainer(
        config, layers, topo, args.microbatches, seed=args.seed, lr=args.lr, device=device
    )
    for step in range(args.warmup_steps):
        trainer.train_step(-1 - step, NullHook())
    # Long-lived objects (model, modules, torch internals) leave the collector's view, so a
    # full collection never stalls an instruction for milliseconds.
    gc.collect()
    gc.freeze()
    hook: NullHook | PerseusOptimizer = NullHook()
    optimizer = None
    if not args.no_hook:
        forward_s = args.nominal_ms_per_layer / 1000.0 * layers[topo.pp_rank]
        optimizer = PerseusOptimizer(
            rank=rank,
            dp_rank=topo.dp_rank,
            pp_rank=topo.pp_rank,
            tp_rank=0,
            device_id=local_rank,
            dp_degree=topo.dp_degree,
            pp_degree=topo.pp_degree,
            tp_degree=1,
            world_size=world_size,
            server_url=args.server_url,
            job_metadata=args.job_metadata,
            steps_per_round=args.steps_per_round,
            timeout_s=args.timeout,
            round_timeout_s=args.round_timeout,
            nominal_time_s={"forward": forward_s, "backward": 2 * forward_s},
            expected_instructions=trainer.instruction_names,
            trace_dir=args.trace_dir,
        )
        hook = optimizer
    try:
        first_loss = loss = None
        for step in range(args.steps):
            if optimizer is not None and args.straggler is not None:
                dp, slowdown, at_step = args.straggler
                if step == at_step:
                    if optimizer.emulator is not None and topo.dp_rank == dp:
                        optimizer.emulator.slowdown = slowdown
                    if rank == 0:
                        optimizer.announce_straggler(dp, slowdown)
            loss = trainer.train_step(step, hook)
            first_loss = loss if first_loss is None else first_loss
        if loss is not None and topo.dp_rank == 0:
            print(
                f"perseus.train: loss {first_loss:.4f} -> {loss:.4f} over {args.steps} steps",
                flush=True,
            )
    finally:
        if optimizer is not None:
            optimizer.close()
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
