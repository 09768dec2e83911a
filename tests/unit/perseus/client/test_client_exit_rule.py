"""The one rule for leaving a Perseus ``with`` block (`perseus.client.lifecycle`)."""

from __future__ import annotations

import logging

import httpx
import pytest

from perseus.client.hook import PerseusOptimizer
from perseus.client.lifecycle import ClosesOnExit
from perseus.client.wire.coordinator import CoordinatorClient
from perseus.integrations.pipelining import PipelineAttachment


class _Recorder(ClosesOnExit):
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[bool] = []
        self.fail = fail

    def close(self, *, finish: bool = True) -> None:
        self.calls.append(finish)
        if self.fail:
            raise RuntimeError("restoring the clocks failed")


def test_a_normal_exit_closes_and_finishes() -> None:
    with _Recorder() as closable:
        pass
    assert closable.calls == [True]


def test_an_exceptional_exit_closes_without_finishing_and_keeps_the_error() -> None:
    closable = _Recorder()
    with pytest.raises(KeyError, match="training failed"), closable:
        raise KeyError("training failed")
    assert closable.calls == [False]


def test_a_close_failure_never_masks_the_original_error_and_is_logged(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="perseus.client.lifecycle")
    closable = _Recorder(fail=True)
    with pytest.raises(KeyError, match="training failed"), closable:
        raise KeyError("training failed")
    assert closable.calls == [False]
    assert any("KeyError" in m and "restoring the clocks failed" in m for m in caplog.messages), (
        caplog.messages
    )


def test_a_close_failure_on_a_normal_exit_is_raised() -> None:
    with pytest.raises(RuntimeError, match="restoring the clocks failed"), _Recorder(fail=True):
        pass


def test_every_context_manager_of_the_client_follows_the_rule() -> None:
    assert issubclass(PerseusOptimizer, ClosesOnExit)
    assert issubclass(PipelineAttachment, ClosesOnExit)
    assert "__exit__" not in vars(PerseusOptimizer) and "__exit__" not in vars(PipelineAttachment)


def test_the_coordinator_client_is_closed_on_either_exit() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    with CoordinatorClient("http://c.test", transport=transport) as client:
        pass
    assert client._closed
    with (
        pytest.raises(KeyError),
        CoordinatorClient("http://c.test", transport=transport) as failing,
    ):
        raise KeyError("x")
    assert failing._closed
