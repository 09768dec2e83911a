"""A Megatron-Core pipeline job (pp 2; 1F1B, or interleaved with VP model chunks per rank)
on CPU (gloo) with Perseus attached in one call.

    PERSEUS_URL=http://127.0.0.1:7792 ZEUS_GPU_BACKEND=emulated PERSEUS_EMULATE_NOMINAL=1 \\
    PERSEUS_EMULATE_NOMINAL_MS='{"forward": 8, "backward": 16}' \\
    python -m torch.distributed.run --nproc_per_node 2 train.py STEPS [VP]

`cpu_shim` (tests only) lets Megatron-Core's schedules allocate their "cuda" tensors on CPU.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cpu_shim

cpu_shim.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402
from torch import nn  # noqa: E402

from perseus.integrations.megatron import attach_megatron  # noqa: E402

HIDDEN, MICROBATCHES, MICROBATCH = 64, 4, 2
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100
VP = int(sys.argv[2]) if len(sys.argv) > 2 else 1
dist.init_process_group("gloo")
parallel_state.initialize_model_parallel(
    tensor_model_parallel_size=1,
    pipeline_model_parallel_size=2,
    virtual_pipeline_model_parallel_size=VP if VP > 1 else None,
)


class Stage(nn.Module):
    """One pipeline stage: a linear layer; its input is the previous stage's output."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(HIDDEN, HIDDEN)
        self.input_tensor = None
        self.model_type = ModelType.encoder_or_decoder
        self.config = TransformerConfig(
            num_layers=2,
            hidden_size=HIDDEN,
            num_attention_heads=4,
            pipeline_dtype=torch.float32,
            pipeline_model_parallel_size=2,
            virtual_pipeline_model_parallel_size=VP if VP > 1 else None,
            use_cpu_initialization=True,
        )

    def set_input_tensor(self, tensor):
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, x):
        return self.layer(self.input_tensor if self.input_tensor is not None else x)


chunks = [Stage() for _ in range(VP)]  # model chunk c of rank r: pipeline stage c·2 + r
optimizer = torch.optim.Adam([p for c in chunks for p in c.parameters()], lr=1e-3)


def batches():
    while True:
        yield torch.randn(1, MICROBATCH, HIDDEN)  # [sequence, microbatch, hidden]


def forward_step(data, model):
    out = model(next(data))

    def loss(output):
        value = (output**2).mean()
        return value, {"loss": value.detach()}

    return out, loss


data = [batches() for _ in chunks] if VP > 1 else batches()
with attach_megatron(
    num_microbatches=MICROBATCHES, server_url=os.environ["PERSEUS_URL"]
) as forward_backward:
    for _ in range(steps):
        optimizer.zero_grad()
        forward_backward(
            forward_step_func=forward_step,
            data_iterator=data,
            model=chunks,
            num_microbatches=MICROBATCHES,
            seq_length=1,
            micro_batch_size=MICROBATCH,
            forward_only=False,
        )
        optimizer.step()
print(f"rank {dist.get_rank()}: done {steps} steps", flush=True)
