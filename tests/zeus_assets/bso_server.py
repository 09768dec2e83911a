"""A real batch-size optimizer server on loopback (uvicorn in a thread), for tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from zeus_power.bso.server import BSOSettings, create_app


@contextmanager
def running_server(db_url: str, **settings: Any) -> Iterator[str]:
    """Serve `create_app(BSOSettings(db_url=..., **settings))` on loopback; yield its URL."""
    app = create_app(BSOSettings(db_url=db_url, log_level="warning", **settings))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="bso-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("The test BSO server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
