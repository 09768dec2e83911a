"""The batch-size optimizer server's token (ZEUS_BSO_TOKEN) and body limit, through a real
server on loopback, the real client and the real CLI."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner
from zeus_assets.bso_server import running_server

from zeus_power.bso.client import BatchSizeOptimizer
from zeus_power.bso.models import JobSpec
from zeus_power.cli import app
from zeus_power.device.emulated import EmulatedGPU, VirtualClock
from zeus_power.errors import ZeusBSORuntimeError
from zeus_power.monitor import ZeusMonitor

TOKEN = "bso-token-0123456789abcdef"
JOB = {
    "job_id": "auth",
    "batch_sizes": [32, 64],
    "default_batch_size": 32,
    "max_power_w": 300.0,
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with running_server(
        f"sqlite:///{tmp_path / 'bso.db'}", token=TOKEN, max_body_bytes=4096
    ) as url:
        yield url


def _monitor() -> ZeusMonitor:
    clock = VirtualClock()
    return ZeusMonitor(gpus=[EmulatedGPU(0, gpu_type="A40", clock=clock)], time_fn=clock)


def test_every_route_needs_the_token_but_health(server: str) -> None:
    assert httpx.get(f"{server}/health").status_code == 200
    for headers in ({}, {"authorization": "Bearer wrong-token-0123456789"}):
        r = httpx.post(f"{server}/jobs", json=JOB, headers=headers)
        assert r.status_code == 401 and TOKEN not in r.text
        assert httpx.get(f"{server}/jobs/auth/trials", headers=headers).status_code == 401
    r = httpx.post(f"{server}/jobs", json=JOB, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code in (200, 201), r.text


def test_the_client_sends_the_token(
    server: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="zeus_power")
    job = JobSpec(job_id="client", batch_sizes=[32, 64], default_batch_size=64)
    monkeypatch.delenv("ZEUS_BSO_TOKEN", raising=False)
    with pytest.raises(ZeusBSORuntimeError, match="401") as err:
        BatchSizeOptimizer(_monitor(), server, job)
    assert TOKEN not in str(err.value)
    with BatchSizeOptimizer(_monitor(), server, job, token=TOKEN) as bso:
        assert bso.get_batch_size() == 64
    monkeypatch.setenv("ZEUS_BSO_TOKEN", TOKEN)
    with BatchSizeOptimizer(_monitor(), server, job) as bso:
        assert bso.get_batch_size() == 64
    assert TOKEN not in caplog.text


def test_a_big_body_is_refused_unread(server: str) -> None:
    auth = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    r = httpx.post(f"{server}/jobs", content=b"x" * 100_000, headers=auth)
    assert r.status_code == 413 and "4096" in r.json()["detail"]
    r = httpx.post(f"{server}/jobs", content=iter([b"x" * 1000] * 100), headers=auth)
    assert r.status_code == 413
    assert httpx.get(f"{server}/health").status_code == 200


def test_serve_refuses_a_public_host_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ZEUS_BSO_TOKEN", raising=False)
    db = f"sqlite:///{tmp_path / 'bso.db'}"
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--db-url", db])
    assert result.exit_code == 2
    assert "ZEUS_BSO_TOKEN" in result.output and "--insecure" in result.output
    monkeypatch.setenv("ZEUS_BSO_TOKEN", "short")
    result = CliRunner().invoke(app, ["serve", "--db-url", db])
    assert result.exit_code == 2 and "token" in result.output
    assert "'short'" not in result.output
