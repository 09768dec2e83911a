"""`ClientSettings`: every PERSEUS_* variable the client reads, read and checked in one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from perseus.client.settings import DEFAULT_RECONNECT_S, ClientSettings
from perseus.errors import ConfigurationError

SECRET = "a-coordinator-token-0123456789"


def test_defaults_without_environment() -> None:
    settings = ClientSettings.load()
    assert settings.timing == "auto"
    assert settings.token is None and settings.token_value is None
    assert settings.reconnect_s == DEFAULT_RECONNECT_S
    assert settings.log_level is None and settings.trace_dir is None
    assert settings.emulation.kinds == "gpt3"


def test_the_environment_is_read_once_and_arguments_win(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PERSEUS_TIMING", "sync")
    monkeypatch.setenv("PERSEUS_TOKEN", f"  {SECRET}\n")
    monkeypatch.setenv("PERSEUS_RECONNECT_S", "7.5")
    monkeypatch.setenv("PERSEUS_LOG_LEVEL", "debug")
    monkeypatch.setenv("PERSEUS_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("PERSEUS_EMULATE_KINDS", "uniform")
    monkeypatch.setenv("PERSEUS_SCHEDULER", "Perseus")  # the coordinator's: ignored here
    settings = ClientSettings.load()
    assert settings.timing == "sync" and settings.token_value == SECRET
    assert settings.reconnect_s == 7.5 and settings.log_level == "debug"
    assert settings.trace_dir == Path(tmp_path) and settings.emulation.kinds == "uniform"
    assert SECRET not in repr(settings)
    assert ClientSettings.load(timing="events", reconnect_s=None).timing == "events"


def test_an_empty_variable_counts_as_unset(monkeypatch) -> None:
    for name in ("PERSEUS_TOKEN", "PERSEUS_RECONNECT_S", "PERSEUS_TRACE_DIR", "PERSEUS_TIMING"):
        monkeypatch.setenv(name, "")
    settings = ClientSettings.load()
    assert settings.token is None and settings.trace_dir is None
    assert settings.reconnect_s == DEFAULT_RECONNECT_S and settings.timing == "auto"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PERSEUS_TIMING", "cuda", r"timing='cuda' \(PERSEUS_TIMING\) is not one of"),
        ("PERSEUS_RECONNECT_S", "-1", "PERSEUS_RECONNECT_S='-1' must be a number of seconds"),
        ("PERSEUS_RECONNECT_S", "nan", "PERSEUS_RECONNECT_S='nan'"),
        ("PERSEUS_LOG_LEVEL", "loud", "PERSEUS_LOG_LEVEL='loud' is not one of"),
        ("PERSEUS_EMULATE_NOMINAL_MS", '{"forward": -5}', "PERSEUS_EMULATE_NOMINAL_MS: .*than 0"),
        ("PERSEUS_EMULATE_KINDS", "gpt4", "PERSEUS_EMULATE_KINDS: Input should be"),
    ],
)
def test_a_bad_value_names_its_variable(monkeypatch, name, value, message) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=message):
        ClientSettings.load()


def test_an_unknown_keyword_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="PERSEUS_TIMNG: Extra inputs"):
        ClientSettings.load(timng="sync")


def test_the_hooks_keyword_types_list_exactly_its_options() -> None:
    import dataclasses

    from perseus.client.options import HookKeywords, HookOptions

    assert set(HookKeywords.__annotations__) == {f.name for f in dataclasses.fields(HookOptions)}
