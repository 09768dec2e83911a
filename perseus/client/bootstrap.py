"""The torch bootstrap: the job's process group, its shared job id, device sync.

One rank (rank 0, or the job's first leader: `perseus.client.wire.leaders`) registers the job
with the coordinator and broadcasts the id (or its error) to the other ranks over the job's
own process group, as two plain tensors (no pickling). torch is
imported only inside these functions, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from typing import Any

from perseus.errors import ConfigurationError, CoordinatorError

__all__ = [
    "all_ranks_reach",
    "broadcast_text",
    "device_sync",
    "process_group",
    "share_job_id",
]


def process_group(rank: int, world_size: int) -> Any:
    """`torch.distributed`, checked to be initialised with this `rank` and `world_size`."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise ConfigurationError(
            "PerseusOptimizer needs PyTorch: pip install 'perseus-energy[torch]'"
        ) from exc
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigurationError(
            "PerseusOptimizer needs an initialised torch.distributed process group: call "
            "torch.distributed.init_process_group(...) before constructing it"
        )
    if dist.get_rank() != rank or dist.get_world_size() != world_size:
        raise ConfigurationError(
            f"rank={rank}, world_size={world_size} do not match the process group "
            f"(rank {dist.get_rank()} of {dist.get_world_size()})"
        )
    return dist


def broadcast_text(
    dist: Any, rank: int, ok: bool, text: str, *, src: int = 0, group: Any = None
) -> tuple[bool, str]:
    """Broadcast (ok, text) from global rank `src` over `group` (default: the job's) as
    plain tensors (no pickling); every rank of the group gets it."""
    import torch

    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    data = text.encode() if rank == src else b""
    header = torch.tensor([int(ok), len(data)], dtype=torch.int64, device=device)
    dist.broadcast(header, src=src, group=group)
    ok_flag, length = (int(x) for x in header.tolist())
    payload = torch.zeros(max(length, 1), dtype=torch.uint8, device=device)
    if rank == src and length:
        payload[:length] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    dist.broadcast(payload, src=src, group=group)
    return bool(ok_flag), payload[:length].cpu().numpy().tobytes().decode()


def share_job_id(
    dist: Any, rank: int, register: Callable[[], str], *, src: int = 0, group: Any = None
) -> str:
    """Rank `src` calls `register`; every rank returns its job id, or raises `src`'s error.

    On `src` the error is re-raised as is (after telling the others); the other ranks
    raise a `CoordinatorError` that quotes it.
    """
    if rank == src:
        try:
            job_id = register()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                broadcast_text(dist, rank, False, str(exc), src=src, group=group)
            raise
        broadcast_text(dist, rank, True, job_id, src=src, group=group)
        return job_id
    ok, text = broadcast_text(dist, rank, False, "", src=src, group=group)
    if not ok:
        raise CoordinatorError(f"Rank {src} could not register the job: {text}")
    return text


def all_ranks_reach(dist: Any, timeout_s: float) -> str | None:
    """A barrier over the job's process group, waited for at most `timeout_s`: None once
    every rank has reached it, else why not (a rank that died or never came, a process
    group destroyed already)."""
    if not (dist.is_available() and dist.is_initialized()):
        return "the process group was destroyed before the hook was closed"
    try:
        dist.barrier(async_op=True).wait(timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # gloo: "Operation timed out!"; a dead peer: connection errors
        return f"not every rank got there within {timeout_s:g} s ({type(exc).__name__}: {exc})"
    return None


def device_sync(device_id: int) -> Callable[[], None]:
    """A device synchronisation: CUDA's when torch sees a GPU, else nothing to wait for."""
    try:
        import torch
    except ImportError:
        return lambda: None
    if torch.cuda.is_available():
        return lambda: torch.cuda.synchronize(device_id)
    return lambda: None
