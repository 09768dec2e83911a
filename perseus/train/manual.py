"""The low-level hook by hand: a synchronous 1F1B loop over `torch.distributed` P2P.

``perseus.train --loop manual`` runs this loop; the default trainer runs
`torch.distributed.pipelining` with `perseus.integrations.pipelining.attach`
(`perseus.train.trainer`). Keep reading if your framework has its own pipeline engine
(Megatron-LM, DeepSpeed, a hand-written loop): this module is the documented example of
what `attach` does for torch's schedules, with the per-rank hook
(`perseus.client.PerseusOptimizer`) called directly:

- describe the pipeline once (``PerseusOptimizer(..., pipeline=PipelineSpec.of(schedule),
  expected_instructions=...)``; here the built-in ``1f1b`` order of
  `perseus.domain.schedule.make_schedule`, which is also what this loop executes);
- ``hook.on_step_begin()`` / ``hook.on_step_end()`` around each iteration;
- ``hook.on_instruction_begin(kind, stage=..., microbatch=...)`` /
  ``hook.on_instruction_end(kind)`` around each forward and backward *computation*, with
  receives and sends outside the window, so the hook times (and clocks) computation only.

In Megatron-LM the places are ``forward_step`` / ``backward_step`` in
``megatron/core/pipeline_parallel/schedules.py``; in DeepSpeed, ``PipelineEngine``'s
``_exec_forward_pass`` / ``_exec_backward_pass``.

Messages: activations go stage s → s+1 and gradients s+1 → s, tagged by microbatch; sends
are non-blocking (`isend`, waited for at the end of the iteration), receives block. Since
the schedule's instruction DAG is acyclic, the stages never deadlock.

Ranks are laid out pipeline-major: ``rank = dp_rank · pp_degree + pp_rank``. With data
parallelism, each stage all-reduces its gradients over its data-parallel group after the
iteration's last backward.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist

from perseus.domain.schedule import make_schedule
from perseus.errors import ConfigurationError, RankError
from perseus.train.layout import Topology
from perseus.train.model import GPTConfig, StageModule, synthetic_batch

__all__ = ["NullHook", "PipelineHook", "PipelineTrainer", "Topology"]


class PipelineHook(Protocol):
    """What the training loop calls; `perseus.client.PerseusOptimizer` implements it."""

    def on_step_begin(self) -> None: ...
    def on_step_end(self) -> None: ...
    def on_instruction_begin(
        self, name: str, *, stage: int | None = None, microbatch: int | None = None
    ) -> None: ...
    def on_instruction_end(self, name: str) -> None: ...


class NullHook:
    """A hook that does nothing (the baseline of the overhead benchmark)."""

    def on_step_begin(self) -> None:
        pass

    def on_step_end(self) -> None:
        pass

    def on_instruction_begin(
        self, name: str, *, stage: int | None = None, microbatch: int | None = None
    ) -> None:
        pass

    def on_instruction_end(self, name: str) -> None:
        pass


class PipelineTrainer:
    """One stage of a 1F1B pipeline: its model piece, optimizer and message passing.

    Build it after `torch.distributed.init_process_group` on every rank (it creates the
    data-parallel groups, a collective call).
    """

    def __init__(
        self,
        config: GPTConfig,
        layers: list[int],
        topology: Topology,
        num_microbatches: int,
        *,
        seed: int = 0,
        lr: float = 0.5,
        device: torch.device | None = None,
    ) -> None:
        if len(layers) != topology.pp_degree:
            raise ConfigurationError(
                f"{len(layers)} layer counts for {topology.pp_degree} pipeline stages"
            )
        self.config = config
        self.layers = layers
        self.topo = topology
        self.device = device or torch.device("cpu")
        self.num_microbatches = num_microbatches
        self.schedule = make_schedule("1f1b", topology.pp_degree, num_microbatches)
        self.order = self.schedule.orders[topology.pp_rank]
        self.seed = seed
        self.module = StageModule(config, layers, topology.pp_rank, seed=seed).to(self.device)
        self.lr = lr
        self._pending: list[tuple[dist.Work, int, int, str]] = []
        self.dp_group = None
        if topology.dp_degree > 1:
            for s in range(topology.pp_degree):
                group = dist.new_group([topology.rank_of(d, s) for d in range(topology.dp_degree)])
                if s == topology.pp_rank:
                    self.dp_group = group

    @property
    def instruction_names(self) -> list[str]:
        """This stage's instruction names for one iteration, in execution order."""
        return [i.kind for i in self.order]

    # ------------------------------------------------------------------ messages
    def _peer(self, offset: int) -> int:
        return self.topo.rank_of(self.topo.dp_rank, self.topo.pp_rank + offset)

    def _lost(self, what: str, offset: int, microbatch: int, exc: Exception) -> RankError:
        peer_stage = self.topo.pp_rank + offset
        return RankError(
            f"Stage {self.topo.pp_rank} (rank {self.topo.rank}) lost stage {peer_stage} "
            f"(rank {self._peer(offset)}) while {what} of microbatch {microbatch}: that rank "
            f"probably died or hung; see its log. ({type(exc).__name__}: {exc})"
        )

    def _recv(self, offset: int, microbatch: int, what: str) -> torch.Tensor:
        buf = torch.empty(self.config.activation_shape, device=self.device)
        try:
            dist.recv(buf, src=self._peer(offset), tag=microbatch)
        except RuntimeError as exc:
            raise self._lost(f"receiving the {what}", offset, microbatch, exc) from exc
        return buf

    def _send(self, tensor: torch.Tensor, offset: int, microbatch: int, what: str) -> None:
        try:
            self._pending.append(
                (
                    dist.isend(tensor, dst=self._peer(offset), tag=microbatch),
                    offset,
                    microbatch,
                    what,
                )
            )
        except RuntimeError as exc:
            raise self._lost(f"sending the {what}", offset, microbatch, exc) from exc

    @torch.no_grad()
    def _sgd_step(self) -> None:
        """Plain SGD. (torch.optim's constructors import torch._dynamo: 2 s per process.)"""
        for p in self.module.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)
                p.grad = None

    # ------------------------------------------------------------------ one iteration
    def train_step(self, step: int, hook: PipelineHook) -> float | None:
        """Run one 1F1B iteration; returns the mean loss on the last stage, else None."""
        module, first, last = self.module, self.module.first, self.module.last
        M = self.num_microbatches
        self._pending = []
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        losses: list[float] = []
        hook.on_step_begin()
        for instr in self.order:
            j = instr.microbatch
            if instr.kind == "forward":
                tokens = targets = None
                if first or last:
                    tokens, targets = synthetic_batch(
                        self.config,
                        seed=self.seed,
                        dp_rank=self.topo.dp_rank,
                        step=step,
                        microbatch=j,
                    )
                x = tokens.to(self.device) if first else self._recv(-1, j, "activations")
                if not first:
                    x.requires_grad_()
                hook.on_instruction_begin("forward", stage=self.topo.pp_rank, microbatch=j)
                out = module(x)
                if last:
                    out = module.loss(out, targets.to(self.device)) / M
                hook.on_instruction_end("forward")
                inputs[j], outputs[j] = x, out
                if last:
                    losses.append(float(out.detach()) * M)
                else:
                    self._send(out.detach(), +1, j, "activations")
            else:
                grad = None if last else self._recv(+1, j, "gradients")
                x, out = inputs.pop(j), outputs.pop(j)
                hook.on_instruction_begin("backward", stage=self.topo.pp_rank, microbatch=j)
                torch.autograd.backward(out, grad)
                hook.on_instruction_end("backward")
                if not first:
                    self._send(x.grad, -1, j, "gradients")
        for work, offset, microbatch, what in self._pending:
            try:
                work.wait()
            except RuntimeError as exc:
                raise self._lost(f"sending the {what}", offset, microbatch, exc) from exc
        self._pending = []
        if self.dp_group is not None:
            for p in module.parameters():
                if p.grad is not None:
                    try:
                        dist.all_reduce(p.grad, group=self.dp_group)
                    except RuntimeError as exc:
                        raise RankError(
                            f"Stage {self.topo.pp_rank} (rank {self.topo.rank}): the gradient "
                            f"all-reduce over the data-parallel group failed; a peer probably "
                            f"died. ({type(exc).__name__}: {exc})"
                        ) from exc
                    p.grad /= self.topo.dp_degree
        self._sgd_step()
        hook.on_step_end()
        return sum(losses) / len(losses) if losses else None
