"""Authentication and limits of the coordinator over real HTTP (uvicorn on loopback): the
bearer token (401), each job's credential (403), body size (413), world size and
frequency lists (422), the live-job cap (503), the header timeout, and `perseus serve`'s
refusal to listen beyond loopback without a token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from paths import REPO, require_module
from server_fixtures import GroundTruth, SimulatedJob, job_info, rank_infos, running_server

from perseus.client.wire.coordinator import CoordinatorClient
from perseus.errors import CoordinatorError
from perseus.protocol import JOB_TOKEN_HEADER, ProfilingResult
from perseus.settings import PerseusSettings

TOKEN = "test-token-0123456789abcdef"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """What the coordinator and our clients logged (httpcore's own DEBUG trace of the test's
    raw HTTP calls prints response headers; it is the test's transport, not ours)."""
    return "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("httpcore"))


def settings(**overrides: object) -> PerseusSettings:
    base: dict[str, object] = {
        "scheduler": "AllMaxFrequency",
        "scheduler_args": {"num_microbatches": 2},
        "token": TOKEN,
        "max_job_idle_time": 3600,
    }
    base.update(overrides)
    return PerseusSettings(**base)  # type: ignore[arg-type]


def register(url: str, pp: int = 1, **headers: str) -> tuple[str, str]:
    r = httpx.post(
        f"{url}/register_job", json=job_info(pp).model_dump(), headers={**AUTH, **headers}
    )
    assert r.status_code == 200, r.text
    return r.json(), r.headers[JOB_TOKEN_HEADER]


def test_every_route_needs_the_token_but_healthz(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with running_server(settings()) as url:
        for method, path in [
            ("GET", "/info"),
            ("POST", "/register_job"),
            ("GET", "/openapi.json"),
            ("POST", "/register_rank/anything"),
            ("GET", "/schedule/anything?rank=0"),
        ]:
            missing = httpx.request(method, url + path)
            wrong = httpx.request(method, url + path, headers={"authorization": "Bearer x" * 3})
            basic = httpx.request(method, url + path, headers={"authorization": f"Basic {TOKEN}"})
            for r in (missing, wrong, basic):
                assert r.status_code == 401, (method, path, r.status_code)
                assert r.headers["www-authenticate"].startswith("Bearer")
                assert TOKEN not in r.text
        assert "missing" in httpx.get(url + "/info").json()["detail"]
        assert httpx.get(url + "/info", headers=AUTH).status_code == 200
        # The health check is open: no token needed.
        assert httpx.get(url + "/healthz").status_code == 200
        info = httpx.get(url + "/info", headers=AUTH).text
    assert TOKEN not in info
    assert TOKEN not in logged(caplog)


def test_settings_read_the_limits_and_hide_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSEUS_TOKEN", f"  {TOKEN}\n")
    monkeypatch.setenv("PERSEUS_MAX_BODY_BYTES", "2048")
    monkeypatch.setenv("PERSEUS_MAX_WORLD_SIZE", "8")
    monkeypatch.setenv("PERSEUS_MAX_JOBS", "3")
    monkeypatch.setenv("PERSEUS_HEADER_TIMEOUT_S", "2.5")
    s = PerseusSettings()
    assert s.token_value == TOKEN
    assert (s.max_body_bytes, s.max_world_size, s.max_jobs, s.header_timeout_s) == (2048, 8, 3, 2.5)
    assert TOKEN not in repr(s) and TOKEN not in str(s.model_dump())
    monkeypatch.setenv("PERSEUS_TOKEN", "")
    assert PerseusSettings().token is None  # empty: no token


def test_info_hides_paths_in_scheduler_args() -> None:
    args = {"num_microbatches": 2, "profile_path": "/secret/place/profile.csv", "schedule": "zb"}
    with running_server(settings(scheduler="Perseus", scheduler_args=args)) as url:
        body = httpx.get(f"{url}/info", headers=AUTH).json()
    assert body["scheduler_args"] == {
        "num_microbatches": 2,
        "profile_path": "<redacted>",
        "schedule": "zb",
    }


def test_job_credential_guards_every_route_under_the_job(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    with running_server(settings(dump_data=True, dump_dir=str(tmp_path))) as url:
        job_id, job_token = register(url)
        _, other_token = register(url)
        assert len(job_token) >= 32 and job_token != other_token
        rank = rank_infos(1)[0].model_dump()
        result = ProfilingResult(
            rank=0, iter_time=[1.0], iter_energy=[1.0], time_breakdown={}, energy_breakdown={}
        ).model_dump()
        # A job's ranks' routes: the cluster token does not act as a job's rank.
        calls = [
            ("POST", f"/register_rank/{job_id}", rank),
            ("GET", f"/schedule/{job_id}?rank=0", None),
            ("POST", f"/result/{job_id}", result),
            ("POST", f"/finish/{job_id}", None),
        ]
        # The operator's actions: the cluster token may, another job's credential may not.
        operator_calls = [
            ("POST", f"/straggler/{job_id}", {"dp_rank": 0, "slowdown": 1.5}),
            ("GET", f"/jobs/{job_id}", None),
        ]
        for method, path, body in calls + operator_calls:
            tried = [{JOB_TOKEN_HEADER: other_token}, {JOB_TOKEN_HEADER: "x" * 43}]
            if (method, path, body) in calls:
                tried.append({})
            for headers in tried:
                r = httpx.request(method, url + path, json=body, headers={**AUTH, **headers})
                assert r.status_code == 403, (path, headers, r.text)
                assert job_id in r.json()["detail"]
                assert other_token not in r.text
        # Nothing of those reached the job: it still waits for its rank.
        r = httpx.post(
            f"{url}/register_rank/{job_id}",
            json=rank,
            headers={**AUTH, JOB_TOKEN_HEADER: job_token},
        )
        assert r.status_code == 200, r.text
        # Only the hash is stored, in job.json.
        stored = (tmp_path / job_id / "job.json").read_text()
        assert job_token not in stored
        from perseus.server.auth import hash_token

        assert hash_token(job_token) in stored
    assert job_token not in logged(caplog) and TOKEN not in logged(caplog)


def test_the_operator_acts_on_any_job_and_a_job_on_its_own_only() -> None:
    """Two roles: the cluster token (the operator) inspects any job and announces its
    stragglers; a job's credential, even without the cluster token, opens that job alone."""
    with running_server(
        settings(scheduler="Perseus", scheduler_args={"num_microbatches": 2})
    ) as url:
        a = SimulatedJob(url, GroundTruth([0.01, 0.012]), pp=2, num_microbatches=2, token=TOKEN)
        b = SimulatedJob(url, GroundTruth([0.01, 0.012]), pp=2, num_microbatches=2, token=TOKEN)
        a.run_sync(1)
        b.run_sync(1)
        a_token, b_token = a.headers[JOB_TOKEN_HEADER], b.headers[JOB_TOKEN_HEADER]
        for job in (a, b):  # the operator, on both jobs, without their credentials
            r = httpx.get(f"{url}/jobs/{job.job_id}", headers=AUTH)
            assert r.status_code == 200 and r.json()["job_id"] == job.job_id, r.text
            r = httpx.post(
                f"{url}/straggler/{job.job_id}", json={"dp_rank": 0, "slowdown": 1.2}, headers=AUTH
            )
            assert r.status_code == 200, r.text
        # A job's credential alone (no cluster token) opens its own job's routes ...
        own = {JOB_TOKEN_HEADER: a_token}
        assert httpx.get(f"{url}/jobs/{a.job_id}", headers=own).status_code == 200
        r = httpx.post(
            f"{url}/straggler/{a.job_id}", json={"dp_rank": 0, "slowdown": 1.0}, headers=own
        )
        assert r.status_code == 200, r.text
        # ... and nothing else: not the other job, not the operator's routes.
        r = httpx.get(f"{url}/jobs/{b.job_id}", headers=own)
        assert r.status_code == 403 and b.job_id in r.json()["detail"]
        r = httpx.post(
            f"{url}/straggler/{b.job_id}", json={"dp_rank": 0, "slowdown": 2}, headers=own
        )
        assert r.status_code == 403
        for method, path in (
            ("GET", "/jobs"),
            ("GET", "/info"),
            ("POST", "/register_job"),
            ("GET", "/metrics"),
        ):
            assert httpx.request(method, url + path, headers=own).status_code == 401, path
        # A wrong cluster token is refused even beside the job's own credential.
        wrong = {"authorization": "Bearer " + "w" * 20, JOB_TOKEN_HEADER: b_token}
        assert httpx.get(f"{url}/jobs/{b.job_id}", headers=wrong).status_code == 401
        # Without any credential: 401 everywhere but the health check.
        assert httpx.get(f"{url}/jobs/{a.job_id}").status_code == 401
        assert httpx.post(f"{url}/finish/{a.job_id}").status_code == 401


def test_a_whole_job_runs_with_the_token(tmp_path: Path) -> None:
    truth = GroundTruth(forward_s=[0.01, 0.012])
    profiler = settings(
        scheduler="InstructionProfiler",
        scheduler_args={"num_microbatches": 2, "warmup_rounds": 0},
        dump_dir=str(tmp_path),
    )
    with running_server(profiler) as url:
        job = SimulatedJob(url, truth, pp=2, num_microbatches=2, token=TOKEN)
        history = job.run_sync(rounds=3)
    assert len(history) == 3 and set(history[0]) == {0, 1}
    # The profiler swept the clocks: the results reached the scheduler.
    assert history[0][0].frequencies != history[2][0].frequencies


def test_the_client_sends_the_token_and_the_job_credential() -> None:
    with running_server(settings()) as url:
        with (
            CoordinatorClient(url, timeout_s=10) as anonymous,
            pytest.raises(CoordinatorError) as err,
        ):
            anonymous.register_job(job_info(1))
        assert err.value.status_code == 401
        with CoordinatorClient(url, timeout_s=10, token=TOKEN) as client:
            job_id = client.register_job(job_info(1))
            job_token = client.job_token(job_id)
            assert job_token
            # Another rank's client, told the credential by rank 0.
            with CoordinatorClient(url, timeout_s=10, token=TOKEN) as rank0:
                with pytest.raises(CoordinatorError) as err:
                    rank0.register_rank(job_id, rank_infos(1)[0])
                assert err.value.status_code == 403
                assert job_token not in str(err.value)
                rank0.set_job_token(job_id, job_token)
                rank0.register_rank(job_id, rank_infos(1)[0])
                schedule = rank0.get_schedule(job_id, 0, timeout_s=10)
            assert schedule.rank == 0


def test_without_a_token_nothing_changes() -> None:
    with running_server(settings(token=None)) as url:
        r = httpx.post(f"{url}/register_job", json=job_info(1).model_dump())
        assert r.status_code == 200
        job_id = r.json()
        assert r.headers[JOB_TOKEN_HEADER]  # issued (and stored hashed) all the same
        r = httpx.post(f"{url}/register_rank/{job_id}", json=rank_infos(1)[0].model_dump())
        assert r.status_code == 200, r.text


def test_a_big_body_is_refused_unread() -> None:
    limit = 4096
    with running_server(settings(max_body_bytes=limit)) as url:
        big = b'{"pad": "' + b"x" * 100_000 + b'"}'
        r = httpx.post(
            f"{url}/register_job",
            content=big,
            headers={**AUTH, "content-type": "application/json"},
        )
        assert r.status_code == 413
        assert str(limit) in r.json()["detail"]

        def chunks():  # no Content-Length: sent chunked
            for _ in range(100):
                yield b"x" * 1000

        r = httpx.post(
            f"{url}/register_job",
            content=chunks(),
            headers={**AUTH, "content-type": "application/json"},
        )
        assert r.status_code == 413, r.text
        assert r.request.headers.get("transfer-encoding") == "chunked"
        # The coordinator still serves.
        assert httpx.get(f"{url}/info", headers=AUTH).status_code == 200
        # A body under the limit, chunked, goes through.
        body = job_info(1).model_dump_json().encode()
        r = httpx.post(
            f"{url}/register_job",
            content=iter([body]),
            headers={**AUTH, "content-type": "application/json"},
        )
        assert r.status_code == 200, r.text


def test_huge_world_size_and_frequency_lists_are_refused_at_once() -> None:
    with running_server(settings()) as url:
        start = time.monotonic()
        r = httpx.post(
            f"{url}/register_job",
            json={"pp_degree": 1, "dp_degree": 10**7, "tp_degree": 1, "world_size": 10**7},
            headers=AUTH,
        )
        assert r.status_code == 422, r.text
        assert "65536" in r.json()["detail"] and "PERSEUS_MAX_WORLD_SIZE" in r.json()["detail"]
        assert time.monotonic() - start < 2.0
        job_id, job_token = register(url)
        rank = rank_infos(1)[0].model_dump()
        rank["available_frequencies"] = list(range(1025))
        r = httpx.post(
            f"{url}/register_rank/{job_id}",
            json=rank,
            headers={**AUTH, JOB_TOKEN_HEADER: job_token},
        )
        assert r.status_code == 422
        assert "available_frequencies" in r.json()["detail"]
        rank["available_frequencies"] = list(range(1500, 476, -1))  # 1,024 clocks
        r = httpx.post(
            f"{url}/register_rank/{job_id}",
            json=rank,
            headers={**AUTH, JOB_TOKEN_HEADER: job_token},
        )
        assert r.status_code == 200, r.text


def test_live_jobs_are_capped() -> None:
    with running_server(settings(max_jobs=2)) as url:
        register(url)
        register(url)
        r = httpx.post(f"{url}/register_job", json=job_info(1).model_dump(), headers=AUTH)
        assert r.status_code == 503
        assert "PERSEUS_MAX_JOBS" in r.json()["detail"]


def test_a_connection_without_headers_is_closed_after_the_header_timeout() -> None:
    with running_server(settings(header_timeout_s=0.5), serve_like_cli=True) as url:
        port = int(url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        start = time.monotonic()
        for sock in (silent, slow):
            sock.settimeout(10)
            assert sock.recv(1024) == b""  # closed by the server
        elapsed = time.monotonic() - start
        assert 0.3 < elapsed < 5, elapsed
        # A prompt request on a kept-alive connection is not cut (headers in time, twice).
        with httpx.Client(headers=AUTH) as client:
            assert client.get(f"{url}/info").status_code == 200
            time.sleep(0.8)
            assert client.get(f"{url}/info").status_code == 200
        silent.close()
        slow.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(*args: str, token: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PERSEUS_TOKEN"}
    env["PYTHONPATH"] = str(REPO)
    env["PERSEUS_SCHEDULER"] = "AllMaxFrequency"
    if token is not None:
        env["PERSEUS_TOKEN"] = token
    return subprocess.Popen(
        [sys.executable, "-m", "perseus", "serve", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_listening(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("perseus serve did not listen")


def test_serve_refuses_a_public_host_without_a_token(tmp_path: Path) -> None:
    port = _free_port()
    proc = _serve("--host", "0.0.0.0", "--port", str(port))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "PERSEUS_TOKEN" in out and "--insecure" in out
    # With --insecure it starts; with a token file it starts and the token is not printed.
    for args, token in (
        (["--insecure"], None),
        (["--token-file", str(tmp_path / "token")], None),
    ):
        (tmp_path / "token").write_text(TOKEN + "\n")
        port = _free_port()
        proc = _serve("--host", "0.0.0.0", "--port", str(port), *args, token=token)
        try:
            _wait_listening(port, proc)
            r = httpx.get(f"http://127.0.0.1:{port}/info")
            assert r.status_code == (200 if "--insecure" in args else 401)
            if "--token-file" in args:
                r = httpx.post(f"http://127.0.0.1:{port}/register_job", json={}, headers=AUTH)
                assert r.status_code == 422  # authenticated, then validated
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
        assert TOKEN not in out


def test_half_open_connections_past_the_descriptor_limit(tmp_path: Path) -> None:
    """The issue's storm: more half-open connections than the process has descriptors.
    Before: /info timed out and asyncio logged every accept() retry (1,991 records in
    16 s here). Now: the header timeout frees the descriptors and the log has one line."""
    require_module("resource")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERSEUS_")}
    env.update(
        PYTHONPATH=str(REPO), PERSEUS_SCHEDULER="AllMaxFrequency", PERSEUS_HEADER_TIMEOUT_S="1"
    )
    # `perseus serve` with 64 descriptors at most (set in the child itself: no preexec_fn).
    launch = (
        "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)); "
        f"sys.argv = ['perseus', 'serve', '--port', '{port}']; "
        "runpy.run_module('perseus', run_name='__main__')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launch],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    socks: list[socket.socket] = []
    try:
        _wait_listening(port, proc)
        for _ in range(150):
            with contextlib.suppress(OSError):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        time.sleep(3)
        assert httpx.get(f"http://127.0.0.1:{port}/info", timeout=10).status_code == 200
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    storm = [line for line in out.splitlines() if "accept() out of system resource" in line]
    assert 1 <= len(storm) <= 2, out[-3000:]


def test_a_short_token_is_refused_without_echoing_it() -> None:
    bad = "short-secret"
    proc = _serve("--port", str(_free_port()), token=bad)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert "PERSEUS_TOKEN" in out and bad not in out


def test_a_straggler_storm_is_refused() -> None:
    """The attack of the issue, POST /straggler with slowdown 1e300: from outside the
    coordinator's credentials (401), with another job's credential (403), and even from the
    operator, since the factor is bounded (422)."""

    async def main(url: str) -> list[int]:
        job_id, _ = await asyncio.to_thread(register, url)
        _, other_token = await asyncio.to_thread(register, url)
        body = {"dp_rank": 0, "slowdown": 1e300}
        async with httpx.AsyncClient() as client:
            return [
                (await client.post(f"{url}/straggler/{job_id}", json=body, headers=h)).status_code
                for h in ({}, {**AUTH, JOB_TOKEN_HEADER: other_token}, AUTH)
            ]

    with running_server(settings()) as url:
        assert asyncio.run(main(url)) == [401, 403, 422]
