"""`perseus gpud`: a minimal privileged GPU daemon speaking a subset of zeusd's HTTP API.

For sites without zeusd. The daemon runs as root (or with CAP_SYS_ADMIN) next to the
GPUs; training jobs, unprivileged, set clocks and power limits through it with
``ZEUS_GPU_BACKEND=zeusd`` and ``ZEUSD_SOCK_PATH`` (`zeus_power.device.zeusd`). It serves
exactly these zeusd 0.5 endpoints, with zeusd's parameters, answers and error shapes:

```
GET  /discover                          GPUs, enabled API groups, whether auth is required
POST /gpu/set_gpu_locked_clocks         gpu_ids, min_clock_mhz, max_clock_mhz, block
POST /gpu/reset_gpu_locked_clocks       gpu_ids, block
POST /gpu/set_power_limit               gpu_ids, power_limit_mw, block
GET  /gpu/get_cumulative_energy         gpu_ids (optional)
GET  /gpu/get_power_limit               gpu_ids (optional)
GET  /gpu/get_power_limit_constraints   gpu_ids (optional)
GET  /gpu/get_power                     gpu_ids (optional)
```

What it adds to zeusd: every value is checked against the GPU's supported clocks and
power range before it reaches the driver (400 with the GPU's range), the socket is
owner/group only by default, TCP refuses to start without a token (`GpudConfig` has the
token rule), connections are bounded (`max_connections`, one more gets 503) and timed out
(`request_timeout_s`, `idle_timeout_s`), and whatever it set is
undone when it exits (SIGTERM, SIGINT) or when the process that set it is gone, so a
crashed job never leaves a GPU slowed.

Backends: NVML (real GPUs) or the emulator (`zeus_power.device.emulated`), whose clock
state then lives in the daemon. Stdlib only (`http.server`): the peer-credential check
needs the raw Unix socket of each connection, and the daemon must not pull a web
framework into a root process.

Modules, one concept each: `config` (the validated settings), `peers` (who is at the other
end of a connection, and whether it still runs), `state` (the GPUs, their owners, what
was changed and how it is undone), `routes` (the API: query parsing, routing, zeusd's
answers), `handler` (one HTTP connection: limits, token, timeouts), `server` (the
listener, the reaper, start and stop).
"""

from __future__ import annotations

from zeus_power.gpud.config import GpudConfig
from zeus_power.gpud.server import GpudServer, run_gpud

__all__ = ["GpudConfig", "GpudServer", "run_gpud"]
