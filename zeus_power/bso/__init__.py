"""Batch-size optimizer: wire models, the exploration policy, the server and the client.

Import the pieces from their modules: `zeus_power.bso.models`, `zeus_power.bso.policy`,
`zeus_power.bso.local` (in-process optimizer for `ZeusMaster` and the simulator),
`zeus_power.bso.server` (`create_app`) and `zeus_power.bso.client`
(`BatchSizeOptimizer`). Nothing is imported here so that the client does not pull in
the server's dependencies.
"""
