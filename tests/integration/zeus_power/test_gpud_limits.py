"""`perseus gpud`'s limits on a real socket, the daemon in this process (emulated A40):
connections served at once, a stalled request, an idle keep-alive connection.

Each test starts its own `GpudServer` with small limits, so the limits are reached with a
handful of connections and fractions of a second.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from zeus_power.device.emulated import EmulatedGPU
from zeus_power.device.zeusd_client import ZeusdClient, ZeusdSettings
from zeus_power.gpud import GpudConfig, GpudServer


@contextmanager
def serving(**limits: float) -> Iterator[str]:
    """A daemon with these `GpudConfig` limits; its socket path."""
    sock = os.path.join(tempfile.mkdtemp(prefix="gpudlim", dir="/tmp"), "s.sock")
    server = GpudServer(GpudConfig(socket_path=sock, **limits), [EmulatedGPU(0, gpu_type="A40")])
    thread = threading.Thread(target=server.serve)
    thread.start()
    try:
        yield sock
    finally:
        server.stop()
        thread.join(10)
    assert not thread.is_alive()


def client(sock: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://gpud")


def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def read_answer(conn: socket.socket) -> bytes:
    """One whole HTTP answer (head and Content-Length body) from a raw connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"Content-Length: (\d+)", head)
    assert match is not None, head
    while len(body) < int(match[1]):
        body += conn.recv(65536)
    return data


def closed_by_server(conn: socket.socket, timeout_s: float = 5.0) -> bool:
    conn.settimeout(timeout_s)
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_connection_beyond_the_limit_gets_a_503_in_zeusds_shape():
    with serving(max_connections=2) as sock:
        held = [client(sock), client(sock)]
        for c in held:  # each keeps its keep-alive connection, and its slot
            assert c.get("/discover").status_code == 200
        with client(sock) as extra:
            refused = extra.get("/gpu/get_power_limit?gpu_ids=0")
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json() == {
            "error": "perseus gpud is serving its maximum of 2 connections; retry shortly "
            "(or raise the daemon's --max-connections)"
        }
        held.pop().close()  # a slot frees when its connection closes
        with client(sock) as later:
            wait_for(lambda: later.get("/discover").status_code == 200)
        held[0].close()


def test_the_zeusd_client_reports_a_503_as_our_error():
    from zeus_power.device import GPUError

    with serving(max_connections=1) as sock, client(sock) as holder:
        holder.get("/discover").raise_for_status()
        refused = ZeusdClient(ZeusdSettings(sock_path=sock))
        with pytest.raises(GPUError, match="answered 503: perseus gpud is serving its maximum"):
            refused.read("get_power_limit", 0, "power_limit_mw")
        refused.close()


def test_a_stalled_request_is_cut_off_and_frees_its_slot():
    with serving(max_connections=1, request_timeout_s=0.3) as sock:
        stalled = socket.socket(socket.AF_UNIX)
        stalled.connect(sock)
        stalled.sendall(b"GET /discover HTTP/1.1\r\nHost: gpud\r\n")  # never ends its headers
        started = time.monotonic()
        assert closed_by_server(stalled)
        assert time.monotonic() - started < 3
        stalled.close()
        with client(sock) as c:
            wait_for(lambda: c.get("/discover").status_code == 200)


def test_an_idle_keep_alive_connection_is_closed_and_the_client_reconnects():
    with serving(max_connections=1, idle_timeout_s=0.3) as sock:
        idle = socket.socket(socket.AF_UNIX)
        idle.connect(sock)
        idle.sendall(b"GET /discover HTTP/1.1\r\nHost: gpud\r\nContent-Length: 0\r\n\r\n")
        assert read_answer(idle).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert closed_by_server(idle)  # after the idle timeout, not the old 600 s
        assert time.monotonic() - started < 3
        idle.close()
        zeusd = ZeusdClient(ZeusdSettings(sock_path=sock))
        assert zeusd.read("get_power_limit", 0, "power_limit_mw") == 300_000
        time.sleep(0.6)  # the daemon closes the client's connection meanwhile
        assert zeusd.read("get_power_limit", 0, "power_limit_mw") == 300_000
        zeusd.close()
