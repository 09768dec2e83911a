"""Check `perseus gpud --backend nvml` and the zeusd client on a real GPU, changing nothing.

Starts the daemon on a Unix socket in a temporary directory, opens the GPUs with
``ZEUS_GPU_BACKEND=zeusd`` (reads through NVML, writes to the daemon) and checks: the
daemon lists the real GPUs; energy and power limit read through the daemon agree with
NVML; writes the daemon must refuse (an unsupported clock, a power limit out of range, an
unknown GPU) come back as `GPUValueError` naming the value, before anything reaches the
driver. No write that would pass validation is sent, so clocks and limits stay as found
(``nvidia-smi`` before and after is printed). Ends with SIGTERM: exit status 0 and
"changed: nothing" for every GPU.

    python scripts/gpud_nvml_probe.py [--out DIR]

Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_DAEMON = """
import logging, sys
import pynvml
# A second guard: whatever the daemon's validation lets through never reaches the driver.
def _blocked(*args, **kwargs):
    print("BLOCKED WRITE reached NVML", flush=True)
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
for _name in ("nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks",
              "nvmlDeviceSetPowerManagementLimit", "nvmlDeviceSetApplicationsClocks",
              "nvmlDeviceResetApplicationsClocks", "nvmlDeviceSetMemoryLockedClocks"):
    setattr(pynvml, _name, _blocked)
from zeus_power.gpud import GpudConfig, run_gpud
logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
run_gpud(GpudConfig(socket_path=sys.argv[1], reap_interval_s=0.2), backend="nvml")
"""


def _smi() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,power.limit,clocks.sm,clocks.max.sm",
             "--format=csv"], capture_output=True, text=True, timeout=30,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(nvidia-smi: {exc})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="Where to write gpud.log.")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpud"))
    sock = str(tmp / "gpud.sock")
    log_path = (args.out or tmp) / "gpud.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    print("nvidia-smi before:\n" + _smi(), flush=True)
    with log_path.open("w") as log:
        daemon = subprocess.Popen([sys.executable, "-c", _DAEMON, sock], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(log_path.read_text())
                return 1
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(sock)
                break
            except OSError:
                time.sleep(0.1)
        os.environ["ZEUSD_SOCK_PATH"] = sock
        from zeus_power.device import GPUValueError, open_gpus
        from zeus_power.device.nvml import NVMLGPU

        gpus = open_gpus(backend="zeusd")
        for gpu in gpus:
            reader = gpu.reader  # type: ignore[attr-defined]
            check(
                isinstance(reader, NVMLGPU), f"GPU {gpu.index}: reads through NVML ({gpu.name()})"
            )
            client = gpu.client  # type: ignore[attr-defined]
            daemon_mj = client.read("get_cumulative_energy", gpu.daemon_index, "energy_mj")  # type: ignore[attr-defined]
            local_mj = gpu.total_energy_mj()
            check(
                0 <= local_mj - daemon_mj < 5_000_000,
                f"energy: daemon {daemon_mj} mJ, NVML {local_mj} mJ",
            )
            limit = client.read("get_power_limit", gpu.daemon_index, "power_limit_mw")  # type: ignore[attr-defined]
            check(limit == gpu.get_power_limit_mw(), f"power limit: daemon {limit} mW = NVML")
            clocks = gpu.supported_sm_clocks_mhz()
            bad = clocks[0] + 1
            try:
                gpu.lock_sm_clocks(bad, bad)
                check(False, f"clock {bad} MHz refused")
            except GPUValueError as exc:
                check(f"min_clock_mhz={bad}" in str(exc), f"clock {bad} MHz refused: {exc}")
            low, _high = gpu.power_limit_constraints_mw()
            try:
                gpu.set_power_limit_mw(low - 1)
                check(False, f"power limit {low - 1} mW refused")
            except GPUValueError as exc:
                check("outside" in str(exc), f"power limit {low - 1} mW refused: {exc}")
        try:
            gpus[0].client.write("set_power_limit", 999, power_limit_mw=1)  # type: ignore[attr-defined]
            check(False, "GPU 999 refused")
        except GPUValueError as exc:
            check("GPU index 999 does not exist." in str(exc), f"GPU 999 refused: {exc}")
        gpus[0].client.close()  # type: ignore[attr-defined]
    finally:
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(30)
    text = log_path.read_text()
    print(text)
    check(rc == 0, f"daemon exit status {rc}")
    check("BLOCKED WRITE" not in text, "no write reached NVML (the guard saw none)")
    exits = re.findall(r"GPU \d+ at exit: .*changed: nothing", text)
    check(
        len(exits) >= 1 and "changed: clocks" not in text, f"{len(exits)} GPU(s) unchanged at exit"
    )
    print("nvidia-smi after:\n" + _smi(), flush=True)
    print("FAILED: " + "; ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
