"""A DeepSpeed `PipelineEngine` job on CPU (gloo) with Perseus attached in one call.

    PERSEUS_URL=http://127.0.0.1:7791 ZEUS_GPU_BACKEND=emulated PERSEUS_EMULATE_NOMINAL=1 \\
    PERSEUS_EMULATE_NOMINAL_MS='{"forward": 8, "backward": 16}' \\
    python -m torch.distributed.run --nproc_per_node 2 train.py 700
"""

import os
import sys

import deepspeed
import torch
from deepspeed.pipe import PipelineModule
from torch import nn

from perseus.integrations.deepspeed import attach_deepspeed

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = PipelineModule(
    layers=[nn.Linear(64, 64) for _ in range(4)],
    num_stages=2,
    loss_fn=nn.MSELoss(),
    partition_method="uniform",
)
config = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    "steps_per_print": 10**6,
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)


def batches():
    while True:
        x = torch.randn(2, 64)
        yield x, x


data = batches()
with attach_deepspeed(engine, server_url=os.environ["PERSEUS_URL"]):
    for _ in range(steps):
        engine.train_batch(data)
print(f"rank {engine.global_rank}: done {steps} steps", flush=True)
