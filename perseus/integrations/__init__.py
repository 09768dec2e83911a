"""Perseus inside other training frameworks, one call each.

- `pipelining`: `attach(schedule, server_url=...)` for a `torch.distributed.pipelining`
  schedule: registers the job with the schedule's own action order and wraps every
  stage's forward / backward computation as a Perseus instruction.
- `torchtitan`: ``python -m perseus.integrations.torchtitan`` in place of ``-m
  torchtitan.train``: torchtitan's trainer with `attach` on its pipeline schedule.
- `deepspeed`: `attach_deepspeed(engine, server_url=...)` for DeepSpeed's `PipelineEngine`.
- `megatron`: `attach_megatron(num_microbatches=..., server_url=...)`, a drop-in for
  Megatron-Core's forward-backward function (1F1B, with or without interleaving).

An integration is a client like any user's: it builds on `perseus.client`,
`perseus.protocol`, `perseus.domain` and `perseus.errors` only (never on the coordinator,
the schedulers, the planner or the solver). Nothing here is imported by ``import
perseus``; torch and the frameworks are imported only when an integration is used.
"""

from __future__ import annotations

__all__: list[str] = []
