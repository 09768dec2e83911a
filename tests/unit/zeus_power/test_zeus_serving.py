"""The shared server guards of `zeus_power.serving` that need no server: loopback hosts,
the credential comparison, and the accept-error log filter on asyncio's real logger."""

from __future__ import annotations

import asyncio
import logging

import pytest

from zeus_power.serving import (
    AcceptErrorFilter,
    install_accept_error_filter,
    is_loopback,
    tokens_match,
)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("coordinator.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_tokens_match() -> None:
    assert tokens_match("a-token-of-16-chars", "a-token-of-16-chars")
    assert tokens_match(b"a-token-of-16-chars", "a-token-of-16-chars")
    assert not tokens_match("a-token-of-16-charX", "a-token-of-16-chars")
    assert not tokens_match("short", "a-token-of-16-chars")
    assert not tokens_match(None, "a-token-of-16-chars")


def test_an_accept_storm_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio reports each failed accept() through the loop's exception handler, as here."""
    flt = install_accept_error_filter(period_s=60.0)
    assert install_accept_error_filter() is flt  # idempotent
    loop = asyncio.new_event_loop()
    try:
        caplog.set_level(logging.ERROR, logger="asyncio")
        for _ in range(5000):
            loop.call_exception_handler(
                {
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(24, "Too many open files"),
                }
            )
        loop.call_exception_handler({"message": "Task exception was never retrieved"})
    finally:
        loop.close()
        logging.getLogger("asyncio").removeFilter(flt)
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    storm = [m for m in messages if AcceptErrorFilter.MARKER in m]
    assert len(storm) == 1
    assert "Task exception was never retrieved" in "\n".join(messages)  # others pass
    assert flt.suppressed == 4999


def test_the_next_period_reports_what_was_suppressed() -> None:
    flt = AcceptErrorFilter(period_s=0.0)
    flt.suppressed = 7
    record = logging.LogRecord(
        "asyncio", logging.ERROR, __file__, 1, "socket.accept() out of system resource", None, None
    )
    assert flt.filter(record)
    assert "7 more suppressed" in record.getMessage() and flt.suppressed == 0
