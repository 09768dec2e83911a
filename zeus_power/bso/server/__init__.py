"""The batch-size optimizer server: `create_app(settings)` and its settings."""

from zeus_power.bso.server.app import create_app
from zeus_power.bso.server.settings import BSOSettings

__all__ = ["BSOSettings", "create_app"]
