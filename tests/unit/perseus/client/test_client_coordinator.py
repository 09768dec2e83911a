"""`CoordinatorClient` against the real coordinator app, in process, through its transport.

The app is `perseus.server.create_app`, its lifespan run, behind `AppTransport` (httpx's
`ASGITransport` driven from a private event loop, for a synchronous client), injected with
``transport=``. Answers the coordinator never gives (a proxy's HTML page, a malformed
schedule) come from a small WSGI app behind `httpx.WSGITransport`; network failures from
real sockets on loopback.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from server_fixtures import job_info, rank_infos

from perseus.client import CoordinatorClient
from perseus.errors import (
    ConfigurationError,
    CoordinatorError,
    CoordinatorRequestError,
    CoordinatorUnreachableError,
    JobNotFoundError,
)
from perseus.protocol import FrequencySchedule, ProfilingResult
from perseus.server import create_app
from perseus.settings import PerseusSettings

URL = "http://127.0.0.1:7787"


class AppTransport(httpx.BaseTransport):
    """A synchronous transport into an ASGI app, whose lifespan it runs on its own loop."""

    def __init__(self, app: FastAPI) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._asgi = httpx.ASGITransport(app=app)
        self._lifespan = app.router.lifespan_context(app)
        self._run(self._lifespan.__aenter__())

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def send() -> httpx.Response:
            response = await self._asgi.handle_async_request(request)
            content = await response.aread()
            return httpx.Response(response.status_code, headers=response.headers, content=content)

        return self._run(send())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._lifespan.__aexit__(None, None, None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@pytest.fixture
def coordinator(tmp_path) -> Iterator[CoordinatorClient]:
    settings = PerseusSettings(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": 2},
        dump_dir=str(tmp_path / "dump"),
    )
    transport = AppTransport(create_app(settings))
    try:
        with CoordinatorClient(URL, transport=transport) as client:
            yield client
    finally:
        transport.close()


def test_a_one_rank_round_trip(coordinator):
    job_id = coordinator.register_job(job_info(1))
    info = rank_infos(1)[0]
    coordinator.register_rank(job_id, info)
    schedule = coordinator.get_schedule(job_id, 0, timeout_s=10)
    assert isinstance(schedule, FrequencySchedule) and schedule.rank == 0
    assert [name for name, _ in schedule.frequencies] == ["forward", "backward"] * 2
    assert {freq for _, freq in schedule.frequencies} == {max(info.available_frequencies)}
    n = len(schedule.frequencies)
    coordinator.report_result(
        job_id,
        ProfilingResult(
            rank=0,
            iter_time=[1.0],
            iter_energy=[100.0],
            time_breakdown={"forward": [[0.1] * (n // 2)], "backward": [[0.2] * (n // 2)]},
            energy_breakdown={"forward": [[10.0] * (n // 2)], "backward": [[20.0] * (n // 2)]},
        ),
    )


def test_an_unknown_job_is_job_not_found_with_the_url(coordinator):
    with pytest.raises(JobNotFoundError, match="answered 404") as info:
        coordinator.register_rank("no-such-job", rank_infos(1)[0])
    assert info.value.status_code == 404
    assert info.value.url == f"{URL}/register_rank/no-such-job"


def test_a_rejected_request_carries_the_status_and_the_detail(coordinator):
    job_id = coordinator.register_job(job_info(1))
    coordinator.register_rank(job_id, rank_infos(1)[0])
    with pytest.raises(CoordinatorError) as info:  # AllMaxFrequency takes no stragglers
        coordinator.announce_straggler(job_id, 0, 1.5)
    assert type(info.value) is CoordinatorRequestError and info.value.status_code == 400
    assert not info.value.retryable  # a refusal is final: the client does not send it again
    assert info.value.url == f"{URL}/straggler/{job_id}"
    message = str(info.value)
    assert message.startswith(f"The Perseus coordinator at {URL}/straggler/{job_id} answered 400")
    assert "straggler" in message.split("answered 400", 1)[1]  # the coordinator's detail
    with pytest.raises(CoordinatorError) as info:  # a body the coordinator's model rejects
        coordinator.announce_straggler(job_id, 0, 0.5)
    assert info.value.status_code == 422


def _misbehaving_app(environ, start_response):
    """A server in the coordinator's place that answers what the coordinator never would."""
    path = environ["PATH_INFO"]
    if path == "/register_job":
        body, kind = b"[1, 2]", "application/json"  # not a job id
    elif path.startswith("/schedule/"):
        body, kind = json.dumps({"rank": -1, "frequencies": []}).encode(), "application/json"
    else:
        body, kind = b"<html>502 from a proxy</html>", "text/html"
    start_response("200 OK", [("content-type", kind)])
    return [body]


def test_answers_the_coordinator_never_gives_are_coordinator_errors():
    with CoordinatorClient(URL, transport=httpx.WSGITransport(app=_misbehaving_app)) as client:
        with pytest.raises(CoordinatorError, match=r"answered /register_job with \[1, 2\]"):
            client.register_job(job_info(1))
        with pytest.raises(CoordinatorError, match="sent rank 0 an invalid schedule"):
            client.get_schedule("job", 0, timeout_s=5)
        with pytest.raises(CoordinatorError, match="a body that is not JSON") as info:
            client.report_result("job", ProfilingResult(rank=0, iter_time=[1.0], iter_energy=[1.0]))
        assert info.value.status_code == 200


def test_an_unreachable_coordinator_names_the_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed once the block ends
    with (
        CoordinatorClient(url, timeout_s=5, reconnect_s=0) as client,  # no wait for a restart
        pytest.raises(CoordinatorError, match=f"Cannot reach the Perseus coordinator at {url}"),
    ):
        client.register_job(job_info(1))


def test_a_silent_coordinator_times_out_with_the_route_named():
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with (
            CoordinatorClient(url, timeout_s=5) as client,
            pytest.raises(CoordinatorError, match=r"did not answer GET /schedule/job within 0.2 s"),
        ):
            client.get_schedule("job", 0, timeout_s=0.2)


def test_the_url_must_be_http_and_loses_its_trailing_slash():
    assert CoordinatorClient(URL + "/").server_url == URL
    with pytest.raises(ConfigurationError, match="must be an http"):
        CoordinatorClient("127.0.0.1:7787")
    with pytest.raises(ConfigurationError, match="a transport or a client"):
        CoordinatorClient(URL, transport=httpx.HTTPTransport(), client=httpx.Client())


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (httpx.Response(503, text="proxy: upstream restarting"), CoordinatorUnreachableError),
        (httpx.Response(502, text="bad gateway"), CoordinatorUnreachableError),
        (httpx.Response(504, text="proxy timeout"), CoordinatorUnreachableError),
        (httpx.Response(504, json={"detail": "round timed out"}), CoordinatorRequestError),
        (httpx.Response(409, json={"detail": "job failed"}), CoordinatorRequestError),
        (httpx.Response(404, json={"detail": "no such job"}), JobNotFoundError),
        (httpx.ConnectError("refused"), CoordinatorUnreachableError),
        (httpx.ReadTimeout("slow"), CoordinatorRequestError),
    ],
)
def test_which_failures_are_retryable_is_a_property_of_their_class(
    answer: httpx.Response | Exception, kind: type[CoordinatorError]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = CoordinatorClient(
        "http://coordinator.test", transport=httpx.MockTransport(handler), reconnect_s=0
    )
    with client, pytest.raises(CoordinatorError) as caught:
        client.request("GET", "/info")
    assert type(caught.value) is kind
    assert caught.value.retryable is (kind is CoordinatorUnreachableError)
    assert caught.value.url == "http://coordinator.test/info"
