"""`GpudConfig`'s rules, checked when it is built: TCP needs a token, a token is 16 to
4096 printable ASCII characters, the TCP address is host:port, and a refusal never
echoes the token."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from zeus_power.gpud import GpudConfig

GOOD = "0123456789abcdef0123"


def test_a_unix_socket_needs_no_token_and_tcp_takes_one():
    assert GpudConfig().token is None
    config = GpudConfig(mode="tcp", token=GOOD, tcp_bind_address="[::1]:4938")
    assert config.token is not None and config.token.get_secret_value() == GOOD
    assert config.tcp_host_port == ("::1", 4938)


def test_tcp_without_a_token_is_refused():
    with pytest.raises(ValidationError, match="TCP mode needs a token"):
        GpudConfig(mode="tcp")


@pytest.mark.parametrize(
    ("token", "needle"),
    [
        ("short-secret", "has 12 characters; it needs 16 to 4096"),
        ("x" * 4097, "has 4097 characters"),
        ("two words of secret text", "a space, a control or a non-ASCII character"),
        ("sécret-sécret-sécret", "non-ASCII"),
        ("line-one-secret\nline-two", "control"),
    ],
)
def test_a_weak_or_unsendable_token_is_refused_without_echoing_it(token, needle):
    for mode in ("uds", "tcp"):
        with pytest.raises(ValidationError, match=needle) as info:
            GpudConfig(mode=mode, token=token)
        assert token not in str(info.value) and token[:12] not in str(info.value)


@pytest.mark.parametrize("address", ["4938", ":4938", "host:", "host:port", "host:70000"])
def test_a_tcp_address_that_is_not_host_port_is_refused(address):
    with pytest.raises(ValidationError, match="is not host:port"):
        GpudConfig(mode="tcp", token=GOOD, tcp_bind_address=address)


def test_limits_are_bounded():
    with pytest.raises(ValidationError, match="max_connections"):
        GpudConfig(max_connections=0)
    with pytest.raises(ValidationError, match="request_timeout_s"):
        GpudConfig(request_timeout_s=600)
