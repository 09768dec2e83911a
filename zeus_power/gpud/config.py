"""How `perseus gpud` listens and what it serves: one validated, frozen value.

Every rule about the daemon's settings is checked here, when the config is built, so the
rest of the daemon trusts it: a bad value never gets as far as binding a socket.

The token rule. Over TCP anyone who can reach the port could otherwise slow the GPUs down,
so TCP needs a token; on the Unix socket the file mode and the kernel's peer credentials
already say who may connect, and a token is optional (zeusd's rule too). A token travels
in an HTTP header and is compared in constant time: it is 16 to 4096 printable ASCII
characters without spaces (what ``openssl rand -hex 16`` or ``-base64 24`` prints), so a
guessable one-word token and one that would break the header are both refused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["MAX_TOKEN_CHARS", "MIN_TOKEN_CHARS", "GpudConfig"]

MIN_TOKEN_CHARS = 16
"""Shortest token accepted (16 random hex characters are 64 bits)."""
MAX_TOKEN_CHARS = 4096
"""Longest token accepted (an HTTP header line stays small)."""


class GpudConfig(BaseModel):
    """How `perseus gpud` listens and what it serves (validated when built)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    """Refusals never echo their input: it may be the token."""

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
    tcp_bind_address: str = Field(default="127.0.0.1:4938", min_length=3, max_length=300)
    """[tcp] host:port to listen on."""
    token: SecretStr | None = None
    """Bearer token required on every endpoint but /discover; mandatory over TCP (see the
    module's documentation for the rule)."""
    reap_interval_s: float = Field(default=0.5, gt=0, le=60)
    """How often the owners of changed GPUs are checked."""
    max_connections: int = Field(default=64, ge=1, le=1024)
    """Connections served at once, one thread each; one more is answered 503."""
    request_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Seconds a started request may take to arrive and its answer to be taken."""
    idle_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """Seconds a keep-alive connection may wait for its next request (the client reconnects)."""

    @field_validator("token")
    @classmethod
    def _check_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is None:
            return None
        value = token.get_secret_value()
        if not MIN_TOKEN_CHARS <= len(value) <= MAX_TOKEN_CHARS:
            raise ValueError(
                f"the token has {len(value)} characters; it needs {MIN_TOKEN_CHARS} to "
                f"{MAX_TOKEN_CHARS} (e.g. the output of `openssl rand -hex 16`)"
            )
        if not all("!" <= c <= "~" for c in value):
            raise ValueError(
                "the token holds a space, a control or a non-ASCII character; use printable "
                "ASCII only (e.g. the output of `openssl rand -hex 16`)"
            )
        return token

    @field_validator("tcp_bind_address")
    @classmethod
    def _check_address(cls, address: str) -> str:
        host, _, port = address.rpartition(":")
        if not host.strip("[]") or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"{address!r} is not host:port (e.g. 127.0.0.1:4938)")
        return address

    @model_validator(mode="after")
    def _tcp_needs_a_token(self) -> GpudConfig:
        if self.mode == "tcp" and self.token is None:
            raise ValueError(
                "TCP mode needs a token (--token-file): anyone who can reach the port could "
                "otherwise slow the GPUs down. Use the Unix socket for local jobs"
            )
        return self

    @property
    def tcp_host_port(self) -> tuple[str, int]:
        """`tcp_bind_address` split, the brackets of an IPv6 host removed."""
        host, _, port = self.tcp_bind_address.rpartition(":")
        return host.strip("[]"), int(port)
