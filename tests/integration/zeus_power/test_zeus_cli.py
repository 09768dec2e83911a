"""`perseus bso serve` (the zeus_power typer sub-app), run for real."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from zeus_power.cli import app


def test_serve_help_lists_the_options() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--db-url", "--log-level", "--trial-timeout"):
        assert option in result.output


def test_bad_log_level_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["serve", "--log-level", "loud"])
    assert result.exit_code == 2
    assert "log_level" in result.output


def test_non_positive_trial_timeout_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["serve", "--trial-timeout", "0"])
    assert result.exit_code == 2
    assert "trial_timeout_s" in result.output


def test_bad_database_url_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["serve", "--db-url", "postgresql+nosuchdriver://u@h/db"])
    assert result.exit_code == 2
    assert "nosuchdriver" in result.output


def test_a_database_that_cannot_be_opened_is_a_usage_error(tmp_path: Path) -> None:
    # Found before the server starts (it was a traceback from the startup), and the file
    # that is not a database is left as it was.
    not_a_db = tmp_path / "notes.db"
    not_a_db.write_text("my notes")
    for url, message in (
        (f"sqlite:///{tmp_path}/missing/dir/x.db", "unable to open database file"),
        (f"sqlite:///{not_a_db}", "file is not a database"),
    ):
        result = CliRunner().invoke(app, ["serve", "--db-url", url])
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.replace("│", " ").split())
    assert not_a_db.read_text() == "my notes"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_starts_a_server_on_the_given_database(tmp_path: Path) -> None:
    port = _free_port()
    db = tmp_path / "cli.db"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zeus_power.cli",
            "serve",
            "--port",
            str(port),
            "--db-url",
            f"sqlite:///{db}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline
            time.sleep(0.1)
        job = {"job_id": "cli", "batch_sizes": [32], "default_batch_size": 32, "max_power_w": 300}
        assert httpx.post(f"http://127.0.0.1:{port}/jobs", json=job).status_code == 201
        assert db.is_file()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
