"""`perseus gpud` as a real process on a real socket (emulated A40s), and the zeusd client
backend (`ZEUS_GPU_BACKEND=zeusd`) against it.

The error shapes are zeusd 0.5's: per-GPU failures ``{"errors": {"<id>": msg}}``, query
problems ``{"error": msg}`` or actix's plain-text ``Query deserialize error``, an unknown
GPU on a write zeusd's plain ``GPU index N does not exist.``, auth ``{"error": msg}`` 401.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from zeus_assets.gpud import Gpud

from perseus.demo import free_port
from zeus_power.device import (
    GPUInitError,
    GPUPermissionError,
    GPUValueError,
    open_gpus,
)
from zeus_power.device.emulated import EmulatedGPU
from zeus_power.device.zeusd import ZeusdGPU
from zeus_power.device.zeusd_client import ZeusdClient, ZeusdSettings

A40_MAX_MHZ = 1740
A40_DEFAULT_MW = 300_000
A40_RANGE_MW = (100_000, 300_000)


@pytest.fixture(scope="module")
def gpud() -> Iterator[Gpud]:
    daemon = Gpud(gpus=2).wait_ready()
    yield daemon
    assert daemon.stop() == 0, daemon.log()
    daemon.cleanup()


def _wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_discover_and_a_socket_only_owner_and_group_may_use(gpud):
    with gpud.client() as c:
        r = c.get("/discover")
    assert r.status_code == 200
    body = r.json()
    assert [g["id"] for g in body["gpus"]] == [0, 1]
    assert {g["name"] for g in body["gpus"]} == {"NVIDIA A40 (emulated)"}
    assert body["auth_required"] is False
    assert body["enabled_api_groups"] == ["gpu-control", "gpu-read"]
    mode = stat.S_IMODE(os.stat(gpud.sock).st_mode)
    assert mode == 0o660, oct(mode)


def test_unsupported_clock_is_a_400_naming_the_value_and_range(gpud):
    with gpud.client() as c:
        ok = c.post(
            "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=1200&max_clock_mhz=1200&block=true"
        )
        bad = c.post(
            "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=1201&max_clock_mhz=1201&block=true"
        )
        reversed_ = c.post(
            "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=1200&max_clock_mhz=900&block=true"
        )
        c.post("/gpu/reset_gpu_locked_clocks?gpu_ids=0&block=true").raise_for_status()
    assert ok.status_code == 200 and ok.content == b""
    assert bad.status_code == 400
    (message,) = bad.json()["errors"].values()
    assert list(bad.json()["errors"]) == ["0"]
    assert "min_clock_mhz=1201" in message and "210..1740 MHz" in message
    assert reversed_.status_code == 400
    assert "exceeds max_clock_mhz=900" in reversed_.json()["errors"]["0"]


def test_power_limit_out_of_range_is_a_400_and_leaves_the_limit(gpud):
    with gpud.client() as c:
        before = c.get("/gpu/get_power_limit?gpu_ids=1").json()
        r = c.post("/gpu/set_power_limit?gpu_ids=1&power_limit_mw=5000&block=true")
        after = c.get("/gpu/get_power_limit?gpu_ids=1").json()
        constraints = c.get("/gpu/get_power_limit_constraints").json()
    assert r.status_code == 400
    assert "power_limit_mw=5000" in r.json()["errors"]["1"]
    assert "100000..300000 mW" in r.json()["errors"]["1"]
    assert before == after == {"1": {"power_limit_mw": A40_DEFAULT_MW}}
    assert constraints["0"] == {
        "min_power_limit_mw": A40_RANGE_MW[0],
        "max_power_limit_mw": A40_RANGE_MW[1],
    }


def test_unknown_gpu_is_a_400_in_zeusds_shapes(gpud):
    with gpud.client() as c:
        write = c.post("/gpu/set_power_limit?gpu_ids=7&power_limit_mw=200000&block=true")
        read = c.get("/gpu/get_cumulative_energy?gpu_ids=0,7")
        garbage = c.get("/gpu/get_cumulative_energy?gpu_ids=0,x")
    assert write.status_code == 400
    assert write.headers["content-type"].startswith("text/plain")
    assert write.text == "GPU index 7 does not exist."
    assert read.status_code == 400 and read.json() == {"error": "GPU 7 not found"}
    assert garbage.status_code == 400 and "'x' is not a GPU index" in garbage.json()["error"]


@pytest.mark.parametrize(
    ("request_", "status", "needle"),
    [
        ("POST /gpu/set_power_limit?gpu_ids=0&block=true", 400, "missing field `power_limit_mw`"),
        ("POST /gpu/set_power_limit?gpu_ids=0&power_limit_mw=-5&block=true", 400, "power_limit_mw"),
        (
            "POST /gpu/set_power_limit?gpu_ids=0&power_limit_mw=99999999999&block=true",
            400,
            "32-bit",
        ),
        ("POST /gpu/set_power_limit?gpu_ids=0&power_limit_mw=200000&block=maybe", 400, "block"),
        (
            "POST /gpu/set_power_limit?gpu_ids=0&power_limit_mw=1&power_limit_mw=2&block=true",
            400,
            "repeated",
        ),
        ("POST /gpu/reset_gpu_locked_clocks?gpu_ids=0&block=true&sudo=1", 400, "sudo"),
        ("POST /gpu/reset_gpu_locked_clocks?block=true", 400, "missing field `gpu_ids`"),
        ("GET /gpu/set_power_limit?gpu_ids=0&power_limit_mw=200000&block=true", 405, "not allowed"),
        (
            "POST /gpu/set_mem_locked_clocks?gpu_ids=0&min_clock_mhz=1&max_clock_mhz=1&block=true",
            404,
            "No such endpoint",
        ),
        ("GET /time", 404, "No such endpoint"),
    ],
)
def test_malformed_requests_are_4xx_and_change_nothing(gpud, request_, status, needle):
    method, url = request_.split(" ")
    with gpud.client() as c:
        r = c.request(method, url)
        limit = c.get("/gpu/get_power_limit?gpu_ids=0").json()
    assert r.status_code == status, r.text
    assert needle in r.text
    assert limit == {"0": {"power_limit_mw": A40_DEFAULT_MW}}


def test_an_oversized_query_or_body_is_refused(gpud):
    with gpud.client() as c:
        long = c.get("/gpu/get_power_limit?gpu_ids=" + "0," * 2000 + "0")
        body = c.post("/gpu/reset_gpu_locked_clocks?gpu_ids=0&block=true", content=b"x" * 10_000)
        # The body is not read: the connection closes, and the answer says so, so that the
        # client's next request goes on a new connection instead of being reset.
        after = c.get("/discover")
    assert long.status_code == 414
    assert body.status_code == 413
    assert body.headers["connection"] == "close"
    assert after.status_code == 200


_CLIENT = """
import sys, time, httpx
c = httpx.Client(transport=httpx.HTTPTransport(uds=sys.argv[1]), base_url="http://gpud")
c.post("/gpu/set_gpu_locked_clocks?gpu_ids=1&min_clock_mhz=900&max_clock_mhz=900&block=true").raise_for_status()
c.post("/gpu/set_power_limit?gpu_ids=1&power_limit_mw=150000&block=true").raise_for_status()
print("set", flush=True)
time.sleep(60)
"""


def test_a_killed_client_leaves_its_gpu_at_defaults(gpud):
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, gpud.sock], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "set"
        with gpud.client() as c:
            assert c.get("/gpu/get_power_limit?gpu_ids=1").json()["1"]["power_limit_mw"] == 150_000
            time.sleep(0.5)  # a living client keeps its settings
            assert c.get("/gpu/get_power_limit?gpu_ids=1").json()["1"]["power_limit_mw"] == 150_000
            proc.kill()
            proc.wait()
            _wait_for(
                lambda: (
                    c.get("/gpu/get_power_limit?gpu_ids=1").json()["1"]["power_limit_mw"]
                    == A40_DEFAULT_MW
                )
            )
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert (
        f"GPU 1: clocks and power limit restored to defaults (client pid {proc.pid} exited)"
        in gpud.log()
    )


def test_sigterm_restores_every_gpu_and_removes_the_socket():
    # Clocks land at once: with the emulator's default 15 ms a quiet host stopped the daemon
    # before the locked clock was in force, and the exit line read the old one.
    daemon = Gpud(gpus=2, env={"ZEUS_EMULATED_SWITCH_LATENCY_MS": "0"}).wait_ready()
    try:
        with daemon.client() as c:  # this process stays alive: only the exit resets
            c.post(
                "/gpu/set_gpu_locked_clocks?gpu_ids=0,1&min_clock_mhz=1005&max_clock_mhz=1005&block=true"
            ).raise_for_status()
            c.post(
                "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=200000&block=true"
            ).raise_for_status()
        assert daemon.stop() == 0
        log = daemon.log()
        assert (
            "GPU 0 at exit: SM clock 1005 MHz, power limit 200000 mW (default 300000), changed: clocks, power limit"
            in log
        )
        assert "GPU 1 at exit: SM clock 1005 MHz" in log
        for index in (0, 1):
            assert (
                f"GPU {index}: clocks and power limit restored to defaults (daemon exiting)" in log
            )
        assert not os.path.exists(daemon.sock)
        assert "Traceback" not in log
    finally:
        daemon.cleanup()


def test_tcp_needs_a_token_and_checks_it(tmp_path):
    refused = subprocess.run(
        [sys.executable, "-m", "perseus", "gpud", "--backend", "emulated", "--mode", "tcp",
         "--tcp-bind-address", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "TCP mode needs a token" in refused.stderr
    token = "s3cret-token-0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    daemon = Gpud(gpus=1, tcp_port=free_port(), token_file=token_file).wait_ready()
    try:
        url = "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=200000&block=true"
        with daemon.client() as c:
            missing = c.post(url)
            discover = c.get("/discover")
        with daemon.client(token="wrong-token-0123456789") as c:
            wrong = c.post(url)
        with daemon.client(token=token) as c:
            right = c.post(url)
            limit = c.get("/gpu/get_power_limit").json()
        assert missing.status_code == 401 and "Authentication required" in missing.json()["error"]
        assert missing.headers["www-authenticate"] == 'Bearer realm="zeusd"'
        assert wrong.status_code == 401 and wrong.json() == {"error": "Invalid token."}
        assert discover.status_code == 200 and discover.json()["auth_required"] is True
        assert right.status_code == 200 and limit == {"0": {"power_limit_mw": 200_000}}
        assert token not in daemon.log()
    finally:
        daemon.stop()
        daemon.cleanup()


def test_a_world_readable_token_file_is_refused(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789")
    token_file.chmod(0o644)
    r = subprocess.run(
        [sys.executable, "-m", "perseus", "gpud", "--backend", "emulated", "--token-file",
         str(token_file), "--socket-path", str(tmp_path / "s")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "readable by every user" in r.stderr


# -- the client backend against the daemon ------------------------------------------------------
def test_zeusd_backend_sends_writes_to_the_daemon_and_mirrors_them(gpud, monkeypatch):
    monkeypatch.setenv("ZEUSD_SOCK_PATH", gpud.sock)
    gpus = open_gpus(backend="zeusd")
    assert [type(g) for g in gpus] == [ZeusdGPU, ZeusdGPU]
    gpu = gpus[0]
    mirror = gpu.stand_in
    assert isinstance(mirror, EmulatedGPU) and gpu.name() == "NVIDIA A40 (emulated)"
    with pytest.raises(GPUPermissionError):  # the job's own copy cannot change a clock
        mirror.lock_sm_clocks(1200, 1200)
    gpu.lock_sm_clocks(1200, 1200)
    assert mirror.current_sm_clock_mhz() == 1200
    assert (
        "set_gpu_locked_clocks {'min_clock_mhz': 1200, 'max_clock_mhz': 1200} on GPUs [0] by pid "
        + str(os.getpid())
        in gpud.log()
    )
    gpu.set_power_limit_mw(250_000)
    assert mirror.get_power_limit_mw() == 250_000 and mirror.current_sm_clock_mhz() == 1200
    with pytest.raises(
        GPUValueError, match=r"answered 400: GPU 0: Invalid argument: min_clock_mhz=1201"
    ) as info:
        gpu.lock_sm_clocks(1201, 1201)
    assert info.value.gpu_index == 0
    assert mirror.current_sm_clock_mhz() == 1200  # a refused write changes nothing
    with pytest.raises(GPUValueError, match=r"outside GPU 0's range 100000\.\.300000 mW"):
        gpu.set_power_limit_mw(1)
    gpu.reset_sm_clocks()
    gpu.set_power_limit_mw(A40_DEFAULT_MW)
    assert mirror.current_sm_clock_mhz() == A40_MAX_MHZ
    gpu.client.close()


def test_auto_prefers_the_daemon_and_unknown_gpus_are_named(gpud, monkeypatch):
    monkeypatch.setenv("ZEUSD_SOCK_PATH", gpud.sock)
    monkeypatch.setenv("ZEUS_GPU_BACKEND", "auto")  # the suite opts in to emulation
    (gpu,) = open_gpus([1])
    assert isinstance(gpu, ZeusdGPU)
    gpu.client.close()
    with pytest.raises(GPUInitError, match=r"serves GPUs \[0, 1\], not GPU 3"):
        open_gpus([3], backend="zeusd")


def test_reads_come_from_the_daemon_without_a_local_reader(gpud):
    client = ZeusdClient(ZeusdSettings(sock_path=gpud.sock))
    gpu = ZeusdGPU(1, client, None, "remote")
    first = gpu.total_energy_mj()
    time.sleep(0.2)
    assert gpu.total_energy_mj() > first  # the emulated idle power accrues in the daemon
    assert gpu.get_power_limit_mw() == A40_DEFAULT_MW
    assert gpu.power_limit_constraints_mw() == A40_RANGE_MW
    assert gpu.power_usage_mw() > 0
    client.close()


def test_token_errors_and_an_absent_daemon_are_our_errors(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789")
    token_file.chmod(0o600)
    port = free_port()
    daemon = Gpud(gpus=1, tcp_port=port, token_file=token_file).wait_ready()
    try:
        wrong = ZeusdClient(ZeusdSettings(host_port=f"127.0.0.1:{port}", token="nope"))
        with pytest.raises(GPUPermissionError, match=r"answered 401: Invalid token\..*ZEUSD_TOKEN"):
            ZeusdGPU(0, wrong, None, "x").lock_sm_clocks(1200, 1200)
        wrong.close()
        right = ZeusdClient(
            ZeusdSettings(host_port=f"127.0.0.1:{port}", token="s3cret-token-0123456789")
        )
        ZeusdGPU(0, right, None, "x").set_power_limit_mw(200_000)
        assert right.read("get_power_limit", 0, "power_limit_mw") == 200_000
        right.close()
    finally:
        daemon.stop()
        daemon.cleanup()
    gone = ZeusdClient(ZeusdSettings(sock_path=str(tmp_path / "none.sock")))
    with pytest.raises(GPUInitError, match=r"Cannot reach zeusd at unix:.*none\.sock"):
        gone.discover()


def test_bad_zeusd_variables_are_named(monkeypatch):
    monkeypatch.setenv("ZEUSD_HOST_PORT", "node1:99999")
    with pytest.raises(GPUValueError, match="ZEUSD_HOST_PORT"):
        open_gpus(backend="zeusd")
    monkeypatch.delenv("ZEUSD_HOST_PORT")
    with pytest.raises(GPUInitError, match="set ZEUSD_SOCK_PATH"):
        open_gpus(backend="zeusd")


def test_log_never_holds_a_traceback(gpud):
    # Bad input of every kind first, so the check does not depend on other tests running.
    with gpud.client() as c:
        bad = [
            c.post(
                "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=x&max_clock_mhz=1&block=true"
            ),
            c.post("/gpu/set_power_limit?gpu_ids=9&power_limit_mw=1&block=true"),
            c.get("/gpu/get_power_limit?gpu_ids=" + "0," * 2000 + "0"),
            c.post("/gpu/reset_gpu_locked_clocks?gpu_ids=0&block=true", content=b"x" * 10_000),
            c.request("PATCH", "/discover"),
        ]
    assert all(400 <= r.status_code < 500 for r in bad), [r.status_code for r in bad]
    assert not re.search(r"Traceback|Exception occurred", gpud.log())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--socket-permissions", "999"], "not an octal file mode"),
        (["--mode", "udp"], "use uds or tcp"),
        (["--backend", "cuda", "--allow-unprivileged"], "use nvml or emulated"),
        (["--emulated-gpus", "0"], "--emulated-gpus"),
        (["--max-connections", "0"], "--max-connections"),
    ],
)
def test_bad_daemon_options_are_refused_by_name(tmp_path, args, needle):
    from typer.testing import CliRunner

    from perseus.cli import app

    result = CliRunner().invoke(
        app, ["gpud", "--socket-path", str(tmp_path / "s.sock"), "--backend", "emulated", *args]
    )
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not (tmp_path / "s.sock").exists()


def test_a_short_token_is_refused_by_the_cli_without_echoing_it(tmp_path):
    from typer.testing import CliRunner

    from perseus.cli import app

    token_file = tmp_path / "token"
    token_file.write_text("too-short-tok\n")
    token_file.chmod(0o600)
    result = CliRunner().invoke(
        app,
        ["gpud", "--socket-path", str(tmp_path / "s.sock"), "--backend", "emulated",
         "--token-file", str(token_file)],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--token-file: the token has 13 characters; it needs 16 to 4096" in result.output
    assert "too-short-tok" not in result.output
    assert not (tmp_path / "s.sock").exists()


def test_a_discover_answer_in_the_earlier_gpu_ids_form_is_understood(tmp_path):
    """An earlier zeusd answered ``{"gpu_ids": [...]}``; the client takes those as GPUs."""
    import http.server
    import socketserver
    import tempfile
    import threading

    class Old(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"gpu_ids": [0, 1], "cpu_ids": [], "dram_available": [], "enabled_api_groups": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    sock = os.path.join(tempfile.mkdtemp(prefix="oldzeusd", dir="/tmp"), "s.sock")
    with Server(sock, Old) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        client = ZeusdClient(ZeusdSettings(sock_path=sock))
        assert [g["id"] for g in client.discover()["gpus"]] == [0, 1]
        client.close()
        server.shutdown()


def test_a_403_and_a_per_gpu_400_from_the_driver_keep_the_daemons_message():
    """A daemon whose GPU refuses for lack of privilege (403, as NVML's NO_PERMISSION) or has
    no energy counter (400): the client raises our errors with the daemon's words."""
    import tempfile
    import threading

    from zeus_power.gpud import GpudConfig, GpudServer

    sock = os.path.join(tempfile.mkdtemp(prefix="gpud403", dir="/tmp"), "s.sock")
    gpus = [EmulatedGPU(0, gpu_type="A40", privileged=False, energy_counter=False)]
    server = GpudServer(GpudConfig(socket_path=sock), gpus)
    thread = threading.Thread(target=server.serve)
    thread.start()
    try:
        client = ZeusdClient(ZeusdSettings(sock_path=sock))
        gpu = ZeusdGPU(0, client, None, "unprivileged")
        with pytest.raises(GPUPermissionError, match=r"answered 403: GPU 0: .*needs root") as info:
            gpu.lock_sm_clocks(1200, 1200)
        assert info.value.gpu_index == 0
        with pytest.raises(GPUValueError, match=r"answered 400: GPU 0: .*no energy counter"):
            gpu.total_energy_mj()
        client.close()
    finally:
        server.stop()
        thread.join(10)
    assert not os.path.exists(sock)
