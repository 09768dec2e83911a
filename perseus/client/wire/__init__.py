"""The job and the coordinator, as one rank talks to them: the HTTP API
(``coordinator``, its errors in ``translate``), the job's registration and in-job fan-out
(``registration``, ``leaders``, ``job_table``, ``fold``), a round's exchange off the training
thread (``exchange``) and the job's normal end (``finish``).

It knows nothing of the GPU (`perseus.client.gpu`): it carries what the GPU side states
(`perseus.client.facts.GpuFacts`)."""
