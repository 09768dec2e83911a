"""Pipeline training on `torch.distributed.pipelining`, one schedule step per iteration.

Every rank builds its stages (`StageModule` pieces of a small GPT, `PipelineLayout`
placement) as `PipelineStage` objects over its pipeline's process group, and one of
torch's schedule classes (`SCHEDULE_CLASSES`) runs them; Perseus attaches to that schedule
with `perseus.integrations.pipelining.attach` (see `perseus.train.cli`). Data parallelism:
ranks are laid out pipeline-major (``rank = dp_rank · pp_degree + pp_rank``), one pipeline
group per data-parallel replica, and each stage all-reduces its gradients over its
data-parallel group after every ``step()``. Then plain SGD (torch.optim's constructors
import torch._dynamo: 2 s per process).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 -- the universal torch idiom

from perseus.errors import RankError
from perseus.train.layout import SCHEDULE_CLASSES, PipelineLayout, Topology
from perseus.train.model import GPTConfig, StageModule, synthetic_batch

__all__ = ["PipelinedTrainer"]


class PipelinedTrainer:
    """This rank's stages of one pipeline and the torch schedule that runs them.

    Build it after `torch.distributed.init_process_group` on every rank (it creates the
    pipeline and data-parallel groups, collective calls).

    Attributes:
        schedule: The `torch.distributed.pipelining` schedule object (attach Perseus here).
        stages: This rank's `PipelineStage` objects, in the order the schedule takes them.
    """

    def __init__(
        self,
        config: GPTConfig,
        layout: PipelineLayout,
        topology: Topology,
        num_microbatches: int,
        *,
        seed: int = 0,
        lr: float = 0.5,
        device: torch.device | None = None,
        timeout: datetime.timedelta | None = None,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as torch_schedules

        self.config = config
        self.layout = layout
        self.topo = topology
        self.device = device or torch.device("cpu")
        self.num_microbatches = num_microbatches
        self.seed = seed
        self.lr = lr
        pp, dp, tp = topology.pp_degree, topology.dp_degree, topology.tp_degree
        # new_group is collective: every rank creates every group, in the same order. Its
        # timeout (how long a receive from a hung peer waits) defaults to torch's 30 min,
        # not the default group's: pass the job's own. One pipeline per (dp, tp) rank
        # (`Topology`: tensor ranks stand in for a tensor-parallel group).
        self.pp_group: Any = None
        for d in range(dp):
            for t in range(tp):
                group = dist.new_group(
                    [topology.rank_of(d, p, t) for p in range(pp)], timeout=timeout
                )
                if (d, t) == (topology.dp_rank, topology.tp_rank):
                    self.pp_group = group
        self.dp_group: Any = None
        if dp > 1:
            for p in range(pp):
                for t in range(tp):
                    group = dist.new_group(
                        [topology.rank_of(d, p, t) for d in range(dp)], timeout=timeout
                    )
                    if (p, t) == (topology.pp_rank, topology.tp_rank):
                        self.dp_group = group
        self.stage_indices = layout.stages_of(topology.pp_rank)
        stage_layers = list(layout.stage_layers)
        self.modules = [
            StageModule(config, stage_layers, s, seed=seed).to(self.device)
            for s in self.stage_indices
        ]
        self.stages = [
            PipelineStage(module, s, layout.num_stages, self.device, group=self.pp_group)
            for module, s in zip(self.modules, self.stage_indices, strict=True)
        ]
        self.holds_first = 0 in self.stage_indices
        self.holds_last = layout.num_stages - 1 in self.stage_indices
        cls = getattr(torch_schedules, SCHEDULE_CLASSES[layout.schedule])
        single = issubclass(cls, torch_schedules.PipelineScheduleSingle)
        self.schedule = cls(
            self.stages[0] if single else self.stages,
            n_microbatches=num_microbatches,
            loss_fn=self._loss,
        )

    @staticmethod
    def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The iteration's batch: the `synthetic_batch` of every microbatch, concatenated
        (the schedule splits it back into microbatches along dimension 0)."""
        parts = [
            synthetic_batch(
                self.config, seed=self.seed, dp_rank=self.topo.dp_rank, step=step, microbatch=j
            )
            for j in range(self.num_microbatches)
        ]
        tokens = torch.cat([x for x, _ in parts]).to(self.device)
        targets = torch.cat([y for _, y in parts]).to(self.device)
        return tokens, targets

    def _peers(self) -> list[int]:
        return [
            self.topo.rank_of(self.topo.dp_rank, p, self.topo.tp_rank)
            for p in range(self.topo.pp_degree)
            if p != self.topo.pp_rank
        ]

    def train_step(self, step: int) -> float | None:
        """One iteration (``schedule.step``), the gradient all-reduce and SGD.

        Returns the mean loss on the rank that holds the last stage, else None.
        """
        tokens, targets = self._batch(step)
        args = (tokens,) if self.holds_first else ()
        losses: list[torch.Tensor] = []
        try:
            self.schedule.step(
                *args,
                target=targets if self.holds_last else None,
                losses=losses if self.holds_last else None,
            )
        except RuntimeError as exc:
            raise RankError(
                f"Pipeline rank {self.topo.pp_rank} (rank {self.topo.rank}, stages "
                f"{self.stage_indices}) lost its pipeline peers (ranks {self._peers()}) in "
                f"step {step}: one of them probably died or hung; see its log. "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"
            ) from exc
        if self.dp_group is not None:
            self._all_reduce()
        self._sgd_step()
        if not losses:
            return None
        return float(sum(float(x.detach()) for x in losses) / len(losses))

    def _all_reduce(self) -> None:
        for module in self.modules:
            for p in module.parameters():
                if p.grad is None:
                    continue
                try:
                    dist.all_reduce(p.grad, group=self.dp_group)
                except RuntimeError as exc:
                    raise RankError(
                        f"Pipeline rank {self.topo.pp_rank} (rank {self.topo.rank}): the "
                        "gradient all-reduce over the data-parallel group failed; a peer "
                        f"probably died. ({type(exc).__name__}: {exc})"
                    ) from exc
                p.grad /= self.topo.dp_degree

    @torch.no_grad()
    def _sgd_step(self) -> None:
        for module in self.modules:
            for p in module.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-self.lr)
                    p.grad = None
