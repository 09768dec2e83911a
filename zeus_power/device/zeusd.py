"""GPUs whose privileged calls go through a Zeus daemon (`zeusd`, or `perseus gpud`).

Locking SM clocks and setting power limits need root or CAP_SYS_ADMIN; a training job
rarely has either. A privileged daemon on the node does those writes for it over HTTP on a
Unix socket (`ZEUSD_SOCK_PATH`) or TCP (`ZEUSD_HOST_PORT`, ``host:port``), with an optional
bearer token (`ZEUSD_TOKEN`). These are the variable names of Zeus's own client.

Reads stay local where they can: on a real GPU through NVML (no privilege needed); for a
daemon that serves emulated GPUs, through a local, unprivileged `EmulatedGPU` of the same
type that follows every write the daemon accepted (the daemon cannot see the work the job
emulates, so the job's own model counts its energy). A daemon GPU that is neither gets its energy
and power limit from the daemon and `GPUNotSupportedError` for the supported-clock list.

The HTTP client and its settings: `zeus_power.device.zeusd_client`.
"""

from __future__ import annotations

from typing import Any

from zeus_power.device.base import (
    GPU,
    GPUError,
    GPUInitError,
    GPUNotSupportedError,
    StandIn,
)
from zeus_power.device.emulated import EmulatedGPU
from zeus_power.device.zeusd_client import ZeusdClient, ZeusdSettings, load_zeusd_settings

__all__ = ["ZeusdGPU", "open_zeusd_gpus"]


class ZeusdGPU(GPU):
    """A GPU whose writes go to the daemon and whose reads come from `reader` when given.

    Args:
        index: The CUDA-visible index this process knows the GPU by.
        client: The shared daemon connection.
        reader: Where reads come from: the same GPU through NVML, or an `EmulatedGPU`
            mirroring the daemon's emulated one (writes the daemon accepted are applied
            to it). None: energy and power limits are read from the daemon.
        name: The product name the daemon reported.
        daemon_index: The daemon's id of the GPU (zeusd numbers GPUs as NVML does, whatever
            `CUDA_VISIBLE_DEVICES` says); default `index`.
    """

    def __init__(
        self,
        index: int,
        client: ZeusdClient,
        reader: GPU | None,
        name: str,
        *,
        daemon_index: int | None = None,
    ) -> None:
        super().__init__(index)
        self.daemon_index = index if daemon_index is None else daemon_index
        self.client = client
        self.reader = reader
        self._name = name
        self._mirror = reader if isinstance(reader, EmulatedGPU) else None
        self._locked_mhz: int | None = None

    def _no_reader(self, what: str) -> GPUNotSupportedError:
        return GPUNotSupportedError(
            f"{what} is not in the zeusd API and NVML is not available in this process",
            gpu_index=self.index,
        )

    def name(self) -> str:
        return self._name

    def supported_memory_clocks_mhz(self) -> list[int]:
        if self.reader is None:
            raise self._no_reader("The list of memory clocks")
        return self.reader.supported_memory_clocks_mhz()

    def supported_sm_clocks_mhz(self, memory_clock_mhz: int | None = None) -> list[int]:
        if self.reader is None:
            raise self._no_reader("The list of SM clocks")
        return self.reader.supported_sm_clocks_mhz(memory_clock_mhz)

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        self.client.write(
            "set_gpu_locked_clocks",
            self.daemon_index,
            min_clock_mhz=int(min_mhz),
            max_clock_mhz=int(max_mhz),
        )
        # The daemon accepts supported clocks only, so the GPU now runs at max_mhz.
        self._locked_mhz = int(max_mhz)
        if self._mirror is not None:
            self._mirror.follow(self._locked_mhz, self._mirror.get_power_limit_mw())

    def reset_sm_clocks(self) -> None:
        self.client.write("reset_gpu_locked_clocks", self.daemon_index)
        self._locked_mhz = None
        if self._mirror is not None:
            self._mirror.follow(None, self._mirror.get_power_limit_mw())

    def current_sm_clock_mhz(self) -> int:
        if self.reader is None:
            raise self._no_reader("The current SM clock")
        return self.reader.current_sm_clock_mhz()

    def power_limit_constraints_mw(self) -> tuple[int, int]:
        if self.reader is not None:
            return self.reader.power_limit_constraints_mw()
        data = self.client.request(
            "GET", "/gpu/get_power_limit_constraints", {"gpu_ids": str(self.daemon_index)}
        )
        try:
            entry = data[str(self.daemon_index)]
            return int(entry["min_power_limit_mw"]), int(entry["max_power_limit_mw"])
        except (KeyError, TypeError, ValueError) as exc:
            raise GPUError(f"{self.client.where}: bad power-limit constraints {data!r}") from exc

    def default_power_limit_mw(self) -> int:
        if self.reader is None:
            raise self._no_reader("The default power limit")
        return self.reader.default_power_limit_mw()

    def get_power_limit_mw(self) -> int:
        if self.reader is not None:
            return self.reader.get_power_limit_mw()
        return self.client.read("get_power_limit", self.daemon_index, "power_limit_mw")

    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.client.write("set_power_limit", self.daemon_index, power_limit_mw=int(limit_mw))
        if self._mirror is not None:
            self._mirror.follow(self._locked_mhz, int(limit_mw))

    def supports_energy_counter(self) -> bool:
        return True if self.reader is None else self.reader.supports_energy_counter()

    def total_energy_mj(self) -> int:
        if self.reader is not None:
            return self.reader.total_energy_mj()
        return self.client.read("get_cumulative_energy", self.daemon_index, "energy_mj")

    def power_usage_mw(self) -> int:
        if self.reader is not None:
            return self.reader.power_usage_mw()
        data = self.client.request("GET", "/gpu/get_power", {"gpu_ids": str(self.daemon_index)})
        try:
            return int(data["power_mw"][str(self.daemon_index)])
        except (KeyError, TypeError, ValueError) as exc:
            raise GPUError(f"{self.client.where}: bad power answer {data!r}") from exc

    @property
    def stand_in(self) -> StandIn | None:
        return None if self.reader is None else self.reader.stand_in

    @property
    def emulated(self) -> bool:
        return self.reader is not None and self.reader.emulated

    def __repr__(self) -> str:
        return f"ZeusdGPU(index={self.index}, {self.client.where})"


def open_zeusd_gpus(
    indices: list[int] | None,
    *,
    settings: ZeusdSettings | None = None,
    emulated: Any = None,
) -> list[GPU]:
    """Open GPUs served by the daemon; see the module docstring for where reads come from.

    Args:
        indices: CUDA-visible indices; None: every GPU the daemon lists.
        settings: Where the daemon is; default from `ZEUSD_*`.
        emulated: ``(index, GPUSpec) -> GPU`` making the local mirror of an emulated GPU.

    Raises:
        GPUInitError: No daemon address, daemon unreachable, a GPU it does not serve.
    """
    settings = load_zeusd_settings() if settings is None else settings
    client = ZeusdClient(settings)
    try:
        return _open(client, indices, emulated)
    except BaseException:
        client.close()
        raise


def _open(client: ZeusdClient, indices: list[int] | None, emulated: Any) -> list[GPU]:
    from zeus_power.device.specs import GPU_SPECS

    gpus = client.discover()["gpus"]
    names: dict[int, str] = {}
    for entry in gpus:
        try:
            names[int(entry["id"])] = str(entry.get("name", ""))[:200]
        except (KeyError, TypeError, ValueError) as exc:
            raise GPUInitError(
                f"{client.where}: /discover listed a GPU without an id: {entry!r}"
            ) from exc
    wanted = sorted(names) if indices is None else list(indices)
    emulated_specs = {f"{s.product_name} (emulated)": s for s in GPU_SPECS.values()}
    nvml: dict[int, GPU] = {}
    if not all(names.get(i, "") in emulated_specs for i in wanted):
        from zeus_power.device.nvml import open_nvml_gpus

        try:
            nvml = {g.index: g for g in open_nvml_gpus(wanted)}
        except GPUInitError:
            nvml = {}
    out: list[GPU] = []
    for index in wanted:
        reader = nvml.get(index)
        daemon_index = getattr(reader, "nvml_index", index)
        if daemon_index not in names:
            raise GPUInitError(
                f"{client.where} serves GPUs {sorted(names)}, not GPU {daemon_index}",
                gpu_index=index,
            )
        name = names[daemon_index]
        if name in emulated_specs and emulated is not None:
            reader = emulated(index, emulated_specs[name])
        out.append(ZeusdGPU(index, client, reader, name, daemon_index=daemon_index))
    return out
