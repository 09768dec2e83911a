"""The rank's GPU as the hook drives and measures it: `RankGPU` (``rank_gpu``) opens it once
and makes its parts, each once: the frequency controller, the energy meter and its counter
poller (``meter``, ``sensing``), the instruction timing (``timing``, ``events``), what a round
measured (``rounds``) and, for a GPU with a `stand_in`, the emulator (``emulation``).

It knows nothing of the coordinator (`perseus.client.wire`): what it states about the GPU,
the wire registers (`perseus.client.facts.GpuFacts`)."""
