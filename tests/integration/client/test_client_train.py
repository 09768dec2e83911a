"""The training job's pieces that need no process group: split, layout, data, model."""

from __future__ import annotations

import pytest
from paths import require_module

from perseus.errors import ConfigurationError

torch = require_module("torch")

from perseus.train.layout import Topology  # noqa: E402
from perseus.train.model import GPTConfig, StageModule, parse_layers, synthetic_batch  # noqa: E402


def test_parse_layers():
    assert parse_layers("2,4,3,1") == [2, 4, 3, 1]
    with pytest.raises(ConfigurationError, match="'2,x' must be comma-separated"):
        parse_layers("2,x")
    with pytest.raises(ConfigurationError, match="every stage needs at least one layer"):
        parse_layers("2,0")


def test_topology_is_pipeline_major():
    topo = Topology(rank=5, world_size=8, pp_degree=4)
    assert (topo.dp_degree, topo.dp_rank, topo.pp_rank) == (2, 1, 1)
    assert topo.rank_of(1, 3) == 7
    with pytest.raises(ConfigurationError, match="world size 6 is not a multiple of the 4"):
        Topology(rank=0, world_size=6, pp_degree=4)


def test_config_is_validated():
    with pytest.raises(ConfigurationError, match="hidden=30 is not divisible by heads=4"):
        GPTConfig(hidden=30)


def test_any_split_computes_the_same_model():
    config = GPTConfig(hidden=32, heads=2, seq_len=8, microbatch_size=2)
    tokens, _ = synthetic_batch(config, seed=3, dp_rank=0, step=0, microbatch=0)

    def run(layers):
        x = tokens
        for stage in range(len(layers)):
            x = StageModule(config, layers, stage, seed=3)(x)
        return x

    whole = run([4])
    assert torch.allclose(run([1, 3]), whole, atol=1e-5)
    assert torch.allclose(run([2, 1, 1]), whole, atol=1e-5)
    assert whole.shape == (2, 8, config.vocab_size)


def test_synthetic_batches_are_deterministic_and_learnable():
    config = GPTConfig(seq_len=8, microbatch_size=3)
    a = synthetic_batch(config, seed=0, dp_rank=1, step=2, microbatch=3)
    b = synthetic_batch(config, seed=0, dp_rank=1, step=2, microbatch=3)
    c = synthetic_batch(config, seed=0, dp_rank=0, step=2, microbatch=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    tokens, targets = a
    assert torch.equal(targets, (tokens + 1) % config.vocab_size)
