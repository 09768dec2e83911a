"""`CoordinatorClient` waits for a coordinator that went away (issue 30, item 4).

Everything is real: an unused loopback port (connection refused), a coordinator
subprocess that starts late on the port a request is already retrying, and a small
stdlib HTTP server that answers 503 (a proxy in front of a restarting coordinator).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from perseus.client.wire.coordinator import (
    DEFAULT_RECONNECT_S,
    CoordinatorClient,
    reconnect_window_s,
)
from perseus.demo import Coordinator, free_port
from perseus.errors import ConfigurationError, CoordinatorError, JobNotFoundError


def test_an_unreachable_coordinator_is_retried_for_the_window_then_fails_clearly() -> None:
    port = free_port()
    with CoordinatorClient(f"http://127.0.0.1:{port}", reconnect_s=1.5) as client:
        start = time.monotonic()
        with pytest.raises(CoordinatorError) as caught:
            client.request("GET", "/info")
        elapsed = time.monotonic() - start
    message = str(caught.value)
    assert "Cannot reach the Perseus coordinator" in message
    assert "PERSEUS_RECONNECT_S=1.5" in message
    assert 1.5 <= elapsed < 4.0
    assert client.retries >= 3  # 0.1, 0.2, 0.4 ... s apart (with jitter)


def test_reconnect_zero_fails_at_the_first_error() -> None:
    with CoordinatorClient(f"http://127.0.0.1:{free_port()}", reconnect_s=0) as client:
        start = time.monotonic()
        with pytest.raises(CoordinatorError, match="Cannot reach"):
            client.request("GET", "/info")
        assert time.monotonic() - start < 1.0 and client.retries == 0


def test_the_window_comes_from_the_environment_and_is_validated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert reconnect_window_s() == DEFAULT_RECONNECT_S == 120.0
    monkeypatch.setenv("PERSEUS_RECONNECT_S", "7.5")
    assert CoordinatorClient("http://127.0.0.1:1").reconnect_s == 7.5
    for bad in ("abc", "-1", "nan", "inf", "1e9"):
        monkeypatch.setenv("PERSEUS_RECONNECT_S", bad)
        with pytest.raises(ConfigurationError, match="PERSEUS_RECONNECT_S"):
            CoordinatorClient("http://127.0.0.1:1")


def test_a_coordinator_that_starts_late_is_reached(tmp_path) -> None:
    coordinator = Coordinator(
        scheduler="AllMaxFrequency", dump_dir=tmp_path / "dump", log_path=tmp_path / "c.log"
    )
    coordinator.port = free_port()
    answers: list[object] = []
    with CoordinatorClient(coordinator.url, reconnect_s=60) as client:
        asking = threading.Thread(target=lambda: answers.append(client.request("GET", "/info")))
        asking.start()
        time.sleep(1.0)  # the request is being refused and retried meanwhile
        with coordinator:
            asking.join(timeout=30)
    assert isinstance(answers[0], dict) and client.retries >= 2


def test_job_unknown_is_not_retried_without_an_outage(tmp_path) -> None:
    with (
        Coordinator(
            scheduler="AllMaxFrequency", dump_dir=tmp_path / "dump", log_path=tmp_path / "c.log"
        ) as coordinator,
        CoordinatorClient(coordinator.url, reconnect_s=60) as client,
    ):
        start = time.monotonic()
        with pytest.raises(JobNotFoundError, match="Unknown job id"):
            client.request("GET", "/schedule/nope", params={"rank": 0})
        assert time.monotonic() - start < 2.0 and client.retries == 0


class _Flaky(BaseHTTPRequestHandler):
    """Answers the queued statuses (one per request), then 200: an int as a proxy does
    (a text body), a ``(status, detail)`` as the coordinator does (a JSON ``detail``)."""

    statuses: ClassVar[list[int | tuple[int, str]]] = []

    def do_GET(self) -> None:
        status = self.statuses.pop(0) if self.statuses else 200
        if isinstance(status, tuple):
            status, detail = status
            body, kind = json.dumps({"detail": detail}).encode(), "application/json"
        elif status == 200:
            body, kind = b'{"ok": true}', "application/json"
        else:
            body, kind = b"restarting", "text/plain"
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[tuple[str, list[int | tuple[int, str]]]]:
    statuses: list[int | tuple[int, str]] = []
    handler = type("Handler", (_Flaky,), {"statuses": statuses})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", statuses
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_502_503_504_are_retried_other_errors_are_not(flaky) -> None:
    url, statuses = flaky
    statuses.extend([503, 502, 504, (503, "The coordinator is shutting down")])
    with CoordinatorClient(url, reconnect_s=30) as client:
        assert client.request("GET", "/info") == {"ok": True}
        assert client.retries == 4 and statuses == []
        # The coordinator's own 500 (a bug) and 504 (a round timed out: the job failed)
        # are final.
        statuses.extend([(500, "Internal coordinator error"), (504, "Round 3 timed out")])
        with pytest.raises(CoordinatorError, match="500 Internal Server Error"):
            client.request("GET", "/info")
        with pytest.raises(CoordinatorError, match="504 Gateway Timeout: Round 3 timed out"):
            client.request("GET", "/info")
        assert client.retries == 4 and statuses == []
    statuses.extend([503] * 100)
    with (
        CoordinatorClient(url, reconnect_s=0.5) as client,
        pytest.raises(CoordinatorError, match=r"503 Service Unavailable: restarting \(retried"),
    ):
        client.request("GET", "/info")


def test_job_unknown_after_an_outage_is_retried_until_the_window_ends(flaky) -> None:
    url, statuses = flaky
    unknown = (404, "Unknown job id 'j': register the job first")
    statuses.extend([503, unknown, unknown])  # restarting, then not restored yet
    with CoordinatorClient(url, reconnect_s=30) as client:
        assert client.request("GET", "/schedule/j") == {"ok": True}
        assert client.retries == 3
    statuses.extend([503] + [unknown] * 100)  # a job the restart did not restore
    with (
        CoordinatorClient(url, reconnect_s=1) as client,
        pytest.raises(JobNotFoundError, match=r"Unknown job id 'j'.*\(retried for 1 s"),
    ):
        client.request("GET", "/schedule/j")


def test_closing_the_client_stops_its_retries() -> None:
    """The last round's long-poll is abandoned when a rank closes its hook: no retrying."""
    client = CoordinatorClient(f"http://127.0.0.1:{free_port()}", reconnect_s=60)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            client.request("GET", "/info")
        except CoordinatorError as exc:
            errors.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    time.sleep(0.5)
    closed_at = time.monotonic()
    client.close()
    asking.join(timeout=10)
    assert not asking.is_alive() and time.monotonic() - closed_at < 3
    assert len(errors) == 1 and "retried for" not in str(errors[0])
