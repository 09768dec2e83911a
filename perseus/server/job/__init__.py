"""One coordinated job and the parts it owns.

- `coordinated`: `CoordinatedJob`, the job's state, registration and lifecycle.
- `rounds`: `JobRounds`, its rounds (the barrier, the scheduler's turn, the ranks' results),
  a part the job owns and lends only its public side (`RoundsHost`).
- `barrier`: `JobPhase` and `Round`, the lifecycle and one round's barrier.
- `leaders`: protocol 2's admission rules for a leader's registration and results.
- `dump`: `JobDump`, what a restarted coordinator needs, written as it is known.
- `stats`: `JobStats`, what the operator's view shows.
"""

from perseus.server.job.barrier import JobPhase, Round, ranks_text
from perseus.server.job.coordinated import CoordinatedJob

__all__ = ["CoordinatedJob", "JobPhase", "Round", "ranks_text"]
