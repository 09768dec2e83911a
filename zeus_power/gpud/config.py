"""How `perseus gpud` listens and what it serves: one frozen value."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["GpudConfig"]


class GpudConfig(BaseModel):
    """How `perseus gpud` listens and what it serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["uds", "tcp"] = "uds"
    """``uds`` (default, zeusd's too) or ``tcp`` (needs `token`)."""
    socket_path: str = Field(default="/var/run/zeusd.sock", min_length=1, max_length=107)
    """[uds] Path of the socket (zeusd's default)."""
    socket_permissions: int = Field(default=0o660, ge=0, le=0o777)
    """[uds] Mode of the socket file: owner and group by default, never others."""
    socket_uid: int | None = Field(default=None, ge=0)
    """[uds] Owner to chown the socket to."""
    socket_gid: int | None = Field(default=None, ge=0)
    """[uds] Group to chown the socket to (the group of users allowed to set clocks)."""
    tcp_bind_address: str = "127.0.0.1:4938"
    """[tcp] host:port to listen on."""
    token: SecretStr | None = None
    """Bearer token required on every endpoint but /discover; mandatory over TCP."""
    reap_interval_s: float = Field(default=0.5, gt=0, le=60)
    """How often the owners of changed GPUs are checked."""
