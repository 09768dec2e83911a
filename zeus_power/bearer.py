"""The shared-secret rule both servers apply to their bearer token (``PERSEUS_TOKEN``,
``ZEUS_BSO_TOKEN``): a settings validator, never echoing the value."""

from __future__ import annotations

from pydantic import SecretStr

__all__ = ["MIN_TOKEN_CHARS", "check_bearer_token"]

MIN_TOKEN_CHARS = 16


def check_bearer_token(value: object) -> str | None:
    """The token, stripped; None for no token (unset or blank).

    Raises:
        ValueError: Not a string, or shorter than `MIN_TOKEN_CHARS`, or with spaces or
            unprintable characters (the message never contains the value).
    """
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("the token must be a string")
    value = value.strip()
    if not value:
        return None
    if len(value) < MIN_TOKEN_CHARS or any(c.isspace() for c in value) or not value.isprintable():
        raise ValueError(
            f"the token must be at least {MIN_TOKEN_CHARS} printable characters without "
            "spaces, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return value
