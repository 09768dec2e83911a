"""A real pipeline-parallel training job with Perseus attached (needs PyTorch).

Run it under `torchrun`::

    torchrun --nproc-per-node 4 -m perseus.train --server-url http://127.0.0.1:7787 \\
        --steps 10 --microbatches 4 --schedule zb --layers 4,8,6,2

Modules: `layout` (ranks, stages and their layers; no torch), `model` (a small GPT-like
decoder cut into stages), `trainer` (the stages on `torch.distributed.pipelining`, one of
torch's schedule classes, Perseus attached with
`perseus.integrations.pipelining.attach`), `manual` (a hand-written 1F1B loop calling
the low-level hook: the example for other frameworks, ``--loop manual``), `cli` (the entry
point). Importing this package does not import torch; its modules do.
"""
