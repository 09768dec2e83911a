"""An in-process batch-size optimizer: the server's service over an in-memory database.

`LocalBatchSizeOptimizer` is `BSOService` on a private in-memory SQLite database, so
`ZeusMaster` and the simulator get exactly the server's trial logic (numbering, expiry,
policy) without running a server. It is not shared between processes; use the server
(`perseus bso serve`) for that.
"""

from __future__ import annotations

from zeus_power.bso.db import make_engine
from zeus_power.bso.service import BSOService

__all__ = ["LocalBatchSizeOptimizer"]


class LocalBatchSizeOptimizer(BSOService):
    """Pruning + Gaussian Thompson sampling for any number of jobs, in memory.

    Args:
        trial_timeout_s: As the server's ``ZEUS_BSO_TRIAL_TIMEOUT_S`` (None: never).
    """

    def __init__(self, *, trial_timeout_s: float | None = None) -> None:
        super().__init__(make_engine("sqlite://"), trial_timeout_s=trial_timeout_s)
        self.create_tables()
