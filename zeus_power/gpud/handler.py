"""One HTTP/1.1 connection to the daemon: its peer, timeouts, body and size limits, the
token check, and the answer; what a request means is `zeus_power.gpud.routes`'s.

Two timeouts (`GpudConfig`): a keep-alive connection may wait `idle_timeout_s` for its
next request and is then closed (zeusd clients reconnect on their next call); once a
request's first byte is in, reading the rest of it and sending the answer may take
`request_timeout_s`, so a stalled client frees its connection slot soon.
"""

from __future__ import annotations

import hmac
import http.server
import json
import logging
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from zeus_power.gpud.peers import peer_of
from zeus_power.gpud.routes import RequestError, route

__all__ = ["MAX_BODY_BYTES", "MAX_QUERY_CHARS", "REFUSAL_TIMEOUT_S", "Handler", "Overloaded"]

logger = logging.getLogger("zeus_power.gpud")

MAX_QUERY_CHARS = 2048
"""Longest query string accepted (gpu_ids of many GPUs fit easily)."""
MAX_BODY_BYTES = 4096
"""The API takes no body; a client that sends more than this is cut off (413)."""
REFUSAL_TIMEOUT_S = 2.0
"""Longest wait for the request of a connection that is refused (503) for want of a slot."""


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves the requests of one connection until it closes, idles out or stalls."""

    server: Any  # the listener, carrying `config` and `state`
    protocol_version = "HTTP/1.1"
    server_version = "perseus-gpud"
    sys_version = ""

    def version_string(self) -> str:
        return self.server_version

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
            logger.debug("%s went away: %s", self.address_string(), exc)

    def setup(self) -> None:
        super().setup()
        self.peer = peer_of(self.connection)

    def handle_one_request(self) -> None:
        config = self.server.config
        self.connection.settimeout(config.idle_timeout_s)
        try:
            started = self.rfile.peek(1)  # type: ignore[attr-defined]
        except TimeoutError:
            logger.debug("%s idle for %.0f s: closed", self.address_string(), config.idle_timeout_s)
            started = b""
        if not started:  # the client closed, or idled out
            self.close_connection = True
            return
        self.connection.settimeout(config.request_timeout_s)
        super().handle_one_request()

    def address_string(self) -> str:
        if self.peer is not None:
            return f"pid {self.peer.pid}"
        return str(self.client_address[0]) if isinstance(self.client_address, tuple) else "unix"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    # -- plumbing -----------------------------------------------------------------------------
    def _send(
        self, status: int, body: Any, *, plain: bool = False, headers: dict[str, str] | None = None
    ) -> None:
        data = (str(body) if plain else json.dumps(body)).encode()
        if status == 200 and body is None:
            data = b""
        self.send_response(status)
        self.send_header(
            "Content-Type", "text/plain; charset=utf-8" if plain else "application/json"
        )
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if data:
            self.wfile.write(data)

    def _drain(self) -> bool:
        raw = self.headers.get("Content-Length", "0") or "0"
        length = int(raw) if raw.isdigit() else MAX_BODY_BYTES + 1
        if length > MAX_BODY_BYTES or self.headers.get("Transfer-Encoding"):
            # Said, not only done: a client that reads no `Connection: close` sends its next
            # request on this connection and is reset.
            self.close_connection = True
            self._send(
                413,
                {"error": f"the API takes no body (at most {MAX_BODY_BYTES} bytes)"},
                headers={"Connection": "close"},
            )
            return False
        if length:
            self.rfile.read(length)
        return True

    def _authorized(self, path: str) -> bool:
        token = self.server.config.token
        if token is None or path == "/discover":
            return True
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            self._send(
                401,
                {
                    "error": "Authentication required. Provide an Authorization: Bearer <token> header."
                },
                headers={"WWW-Authenticate": 'Bearer realm="zeusd"'},
            )
            return False
        if not hmac.compare_digest(given[7:].encode(), token.get_secret_value().encode()):
            self._send(
                401,
                {"error": "Invalid token."},
                headers={"WWW-Authenticate": 'Bearer realm="zeusd"'},
            )
            return False
        return True

    def _handle(self, method: str) -> None:
        if not self._drain():
            return
        url = urlsplit(self.path)
        if len(url.query) > MAX_QUERY_CHARS:
            self._send(414, {"error": f"query longer than {MAX_QUERY_CHARS} characters"})
            return
        if not self._authorized(url.path):
            return
        try:
            pairs = parse_qsl(
                url.query, keep_blank_values=True, strict_parsing=bool(url.query), max_num_fields=16
            )
        except ValueError as exc:
            self._send(400, f"Query deserialize error: {exc}", plain=True)
            return
        query = dict(pairs)
        try:
            status, body = route(
                self.server.state,
                method,
                url.path,
                query,
                len(pairs),
                peer=self.peer,
                auth_required=self.server.config.token is not None,
            )
        except RequestError as exc:
            self._send(exc.status, exc.body, plain=exc.plain)
            return
        self._send(status, body)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_OPTIONS(self) -> None:
        self._handle("OPTIONS")

    def do_HEAD(self) -> None:
        self.close_connection = True  # the 405's body must not be read as the next answer
        self._handle("HEAD")


class Overloaded(Handler):
    """Answers a connection that got no slot: 503 in zeusd's error shape, then closes it."""

    def handle_one_request(self) -> None:
        self.connection.settimeout(min(REFUSAL_TIMEOUT_S, self.server.config.request_timeout_s))
        self.close_connection = True
        http.server.BaseHTTPRequestHandler.handle_one_request(self)

    def _handle(self, method: str) -> None:
        self.close_connection = True
        if not self._drain():
            return
        self._send(
            503,
            {
                "error": f"perseus gpud is serving its maximum of "
                f"{self.server.config.max_connections} connections; retry shortly (or raise "
                "the daemon's --max-connections)"
            },
            headers={"Retry-After": "1", "Connection": "close"},
        )
