"""A small GPT-like decoder, cut into pipeline stages by a layer split.

Stage 0 holds the token and position embeddings, the last stage the final norm, the
language-model head and the loss; every stage holds its share of the transformer blocks.
Weights are seeded per layer, so the same seed gives the same model whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 -- the universal torch idiom
from torch import nn

from perseus.errors import ConfigurationError

__all__ = ["Block", "GPTConfig", "StageModule", "parse_layers", "synthetic_batch"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Model and batch shape.

    Attributes:
        vocab_size: Number of token ids.
        hidden: Model width.
        heads: Attention heads (must divide `hidden`).
        seq_len: Tokens per sequence.
        microbatch_size: Sequences per microbatch.
    """

    vocab_size: int = 256
    hidden: int = 128
    heads: int = 4
    seq_len: int = 64
    microbatch_size: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "heads", "seq_len", "microbatch_size"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be at least 1")
        if self.hidden % self.heads:
            raise ConfigurationError(f"hidden={self.hidden} is not divisible by heads={self.heads}")

    @property
    def activation_shape(self) -> tuple[int, int, int]:
        """Shape of the tensor passed between stages: (microbatch, sequence, hidden)."""
        return (self.microbatch_size, self.seq_len, self.hidden)


def parse_layers(text: str) -> list[int]:
    """Parse a layer split such as ``"2,4,3,1"`` (one positive count per stage)."""
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigurationError(
            f"--layers {text!r} must be comma-separated layer counts, one per stage, e.g. 2,4,3,1"
        ) from None
    if not layers or any(n < 1 for n in layers):
        raise ConfigurationError(f"--layers {text!r}: every stage needs at least one layer")
    return layers


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4× MLP."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.hidden)
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)
        self.norm2 = nn.LayerNorm(config.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(config.hidden, 4 * config.hidden),
            nn.GELU(),
            nn.Linear(4 * config.hidden, config.hidden),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class StageModule(nn.Module):
    """The layers of one pipeline stage."""

    def __init__(self, config: GPTConfig, layers: list[int], stage: int, *, seed: int) -> None:
        super().__init__()
        if not 0 <= stage < len(layers):
            raise ConfigurationError(f"stage {stage} is outside the {len(layers)}-stage split")
        self.config = config
        self.first = stage == 0
        self.last = stage == len(layers) - 1
        offset = sum(layers[:stage])
        if self.first:
            torch.manual_seed(seed)
            self.tok = nn.Embedding(config.vocab_size, config.hidden)
            self.pos = nn.Embedding(config.seq_len, config.hidden)
        blocks = []
        for i in range(layers[stage]):
            torch.manual_seed(seed + 1 + offset + i)
            blocks.append(Block(config))
        self.blocks = nn.ModuleList(blocks)
        if self.last:
            torch.manual_seed(seed + 1 + sum(layers))
            self.norm = nn.LayerNorm(config.hidden)
            self.head = nn.Linear(config.hidden, config.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (stage 0) or activations in; activations or logits (last stage) out."""
        if self.first:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.tok(x) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.head(self.norm(x))
        return x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def synthetic_batch(
    config: GPTConfig, *, seed: int, dp_rank: int, step: int, microbatch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic (inputs, targets) of one microbatch: counting sequences mod vocab.

    Each sequence starts at a random token and counts up, so the next token is learnable;
    the first and last stage generate the same batch independently.
    """
    mixed = (seed * 1_000_003 + dp_rank * 10_007 + step * 101 + microbatch) % (2**31)
    gen = torch.Generator().manual_seed(mixed)
    start = torch.randint(0, config.vocab_size, (config.microbatch_size, 1), generator=gen)
    tokens = (start + torch.arange(config.seq_len + 1)) % config.vocab_size
    return tokens[:, :-1], tokens[:, 1:]
