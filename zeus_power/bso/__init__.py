"""Batch-size optimizer: wire models, the exploration policy, the service, the server, the client.

Import the pieces from their modules: `zeus_power.bso.models` (our wire models),
`zeus_power.bso.zeus_models` (Zeus 0.16's, for its own client), `zeus_power.bso.policy`
(the decisions), `zeus_power.bso.service` (`BSOService`: the one implementation of the
trial logic, over `zeus_power.bso.db`), `zeus_power.bso.local` (`LocalBatchSizeOptimizer`:
that service in process, for `ZeusMaster` and the simulator), `zeus_power.bso.server`
(`create_app`) and `zeus_power.bso.client` (`BatchSizeOptimizer`). Nothing is imported here
so that the client does not pull in the server's dependencies.
"""
