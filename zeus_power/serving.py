"""What an HTTP server of ours needs in front of its app when it listens beyond loopback.

Shared by the batch-size optimizer server (`zeus_power.bso.server`) and the Perseus
coordinator (`perseus.server`), both FastAPI apps served by uvicorn:

- `BearerAuthMiddleware`: every request but the open paths needs
  ``Authorization: Bearer <token>`` (compared in constant time), else 401;
- `BodyLimitMiddleware`: a body over the limit is refused with 413 before it is read
  whole: at once from ``Content-Length``, else while it streams in (chunked);
- `header_timeout_protocol`: a uvicorn HTTP protocol that closes a connection whose
  request headers have not all arrived within a timeout (half-open or slow-loris clients);
- `AcceptErrorFilter`: asyncio logs every failed ``accept()`` (e.g. EMFILE, out of file
  descriptors) again and again; this filter lets one through per period and counts the rest;
- `is_loopback`: whether a host to listen on is loopback only.

The token never enters a log line, an error body or a repr: responses only say that it is
missing or wrong.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import h11
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from zeus_power.errors import ZeusError

__all__ = [
    "ASGIApp",
    "AcceptErrorFilter",
    "BearerAuthMiddleware",
    "BodyLimitMiddleware",
    "BodyTooLargeError",
    "Receive",
    "Scope",
    "Send",
    "bearer_token",
    "header",
    "header_timeout_protocol",
    "install_accept_error_filter",
    "is_loopback",
    "send_json",
    "tokens_match",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether listening on `host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def tokens_match(given: str | bytes | None, expected: str | bytes) -> bool:
    """Constant-time comparison of a presented credential with the expected one."""
    if given is None:
        return False
    a = given.encode() if isinstance(given, str) else given
    b = expected.encode() if isinstance(expected, str) else expected
    return hmac.compare_digest(a, b)


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first request header `name` (lower case), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def bearer_token(scope: Scope) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    value = header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


async def send_json(send: Send, status: int, body: dict[str, Any], **headers: str) -> None:
    """Answer with a JSON body (and close the connection when the body is left unread)."""
    payload = json.dumps(body).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ] + [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


class BearerAuthMiddleware:
    """ASGI middleware: 401 unless the request carries ``Authorization: Bearer <token>``.

    Args:
        app: The wrapped ASGI app.
        token: The expected token; None lets every request through (auth off).
        open_paths: ``(method, path)`` pairs that need no token (a health check).
        realm: Named in the 401's ``WWW-Authenticate`` header.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        open_paths: Iterable[tuple[str, str]] = (),
        realm: str = "api",
    ) -> None:
        self.app = app
        self._token = token.encode() if token else None
        self._open = frozenset(open_paths)
        self._realm = realm

    def __repr__(self) -> str:
        return f"BearerAuthMiddleware(auth={'on' if self._token else 'off'})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self._token is None
            or scope["type"] != "http"
            or (scope["method"], scope["path"]) in self._open
        ):
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope)
        if given is None or not tokens_match(given, self._token):
            problem = "missing" if given is None else "wrong"
            await send_json(
                send,
                401,
                {
                    "detail": f"Unauthorized: the bearer token is {problem}; send "
                    "'Authorization: Bearer <token>' with the server's token"
                },
                www_authenticate=f'Bearer realm="{self._realm}"',
            )
            return
        await self.app(scope, receive, send)


class BodyTooLargeError(HTTPException, ZeusError):
    """Raised by the body's ``receive`` once a streamed body passes the limit: FastAPI
    re-raises HTTP exceptions met while reading a body, and Starlette answers them."""


class BodyLimitMiddleware:
    """ASGI middleware: 413 for a request body over `max_bytes`, never read whole.

    A ``Content-Length`` over the limit is refused before the app runs; a body without
    one (chunked) is counted as it arrives, and the app's read fails with 413 as soon as
    the count passes the limit (the rest is never read; the connection is closed).
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    def _detail(self, size: str) -> dict[str, str]:
        return {
            "detail": f"Request body too large: {size} bytes, the limit is {self.max_bytes} "
            "bytes (PERSEUS_MAX_BODY_BYTES / ZEUS_BSO_MAX_BODY_BYTES)"
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = header(scope, b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await send_json(send, 400, {"detail": "Invalid Content-Length header"})
                return
            if declared > self.max_bytes:
                await send_json(send, 413, self._detail(str(declared)), connection="close")
                return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLargeError(
                        413, self._detail(f"more than {self.max_bytes}")["detail"]
                    )
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLargeError:
            if started:
                raise
            await send_json(
                send, 413, self._detail(f"more than {self.max_bytes}"), connection="close"
            )


def header_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """A uvicorn HTTP protocol class (``uvicorn.Config(http=...)``) that closes a connection
    whose request line and headers have not all arrived `timeout_s` after it opened (or,
    on a kept-alive connection, after the next request's first byte).

    uvicorn has a keep-alive timeout but none for headers: without this, a client that
    connects and sends nothing (or one byte at a time) holds a descriptor for ever.
    """
    if not timeout_s > 0:
        raise ValueError(f"the header timeout must be positive, got {timeout_s!r}")

    class HeaderTimeoutH11Protocol(H11Protocol):
        header_timeout_s = float(timeout_s)
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(
                    self.header_timeout_s, self._on_header_timeout
                )

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE:
                self._arm_header_timer()  # a new request starts: its headers are due
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm_header_timer()

        def _on_header_timeout(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

    return HeaderTimeoutH11Protocol


class AcceptErrorFilter(logging.Filter):
    """Let one "accept() out of system resource" record through per `period_s`.

    asyncio's event loop logs this error (EMFILE/ENFILE/ENOBUFS/ENOMEM: the process is out
    of descriptors) on every retry of its listening socket, which under a flood of
    half-open connections writes hundreds of thousands of lines. The first one passes
    (with how many were suppressed since the last), the rest of the period is counted.
    """

    MARKER = "accept() out of system resource"

    def __init__(self, period_s: float = 60.0) -> None:
        super().__init__()
        self.period_s = period_s
        self._last = -float("inf")
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if self.MARKER not in record.getMessage():
            return True
        now = time.monotonic()
        if now - self._last < self.period_s:
            self.suppressed += 1
            return False
        self._last = now
        if self.suppressed:
            record.msg = f"{record.msg} ({self.suppressed} more suppressed in the last period)"
            self.suppressed = 0
        # The traceback of each attempt adds nothing to the first line.
        record.exc_info = None
        record.exc_text = None
        return True


def install_accept_error_filter(period_s: float = 60.0) -> AcceptErrorFilter:
    """Add one `AcceptErrorFilter` to the ``asyncio`` logger (idempotent); returns it."""
    logger = logging.getLogger("asyncio")
    for existing in logger.filters:
        if isinstance(existing, AcceptErrorFilter):
            return existing
    flt = AcceptErrorFilter(period_s)
    logger.addFilter(flt)
    return flt
