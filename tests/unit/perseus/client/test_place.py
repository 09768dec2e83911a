"""A rank's GPU index on its node (`perseus.client.place.local_device_id`), as the framework
adapters (DeepSpeed, Megatron-Core) take it."""

from __future__ import annotations

import pytest

from perseus.errors import ConfigurationError


def test_a_ranks_gpu_is_given_or_local_rank_never_a_guess(monkeypatch):
    from perseus.client.place import local_device_id

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert local_device_id(3) == 3
    with pytest.raises(ConfigurationError, match="set LOCAL_RANK or pass device_id="):
        local_device_id(None)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert local_device_id(None) == 2
    monkeypatch.setenv("LOCAL_RANK", "gpu0")
    with pytest.raises(ConfigurationError, match="LOCAL_RANK='gpu0' is not an integer"):
        local_device_id(None)
