"""A real pipeline-parallel training job with the Perseus hook (needs PyTorch).

Run it under `torchrun`::

    torchrun --nproc-per-node 4 -m perseus.train --server-url http://127.0.0.1:7787 \\
        --steps 10 --microbatches 4 --layers 2,4,3,1

Modules: `model` (a small GPT-like decoder cut into stages), `pipeline` (our 1F1B loop
over `torch.distributed` P2P), `cli` (the entry point). Importing this package does not
import torch; its modules do.
"""
