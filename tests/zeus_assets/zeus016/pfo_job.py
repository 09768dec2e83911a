"""A 2-rank pipeline job driven by Zeus 0.16's own `PipelineFrequencyOptimizer` (Zeus venv).

Usage: ``python pfo_job.py OUT_JSON CASE=URL [CASE=URL ...]``

Two processes (forked, gloo on loopback) are pipeline ranks 0 and 1 of one job (pp=2).
For each case, in order, every rank constructs Zeus's `PipelineFrequencyOptimizer` against
that coordinator (rank 0 registers the job, every rank registers itself and fetches its
schedule, and Zeus's `FrequencyController` locks its emulated GPU's clocks, `zeus016_gpu`),
then runs `ROUNDS` rounds of `STEPS` iterations through Zeus's hooks (`on_step_begin`,
`on_instruction_begin` / `_end` for each instruction of its schedule, `on_step_end`),
measuring each iteration with Zeus's `ZeusMonitor`.

Zeus 0.16's client fetches one schedule and reports nothing (its `on_step_end` is a TODO),
so after each round this script does what it leaves out, with Zeus's own models and
routes: it posts Zeus's default `ProfilingResult(rank, iter_time, iter_energy)` (empty
breakdowns) to ``/result/{job_id}`` and fetches the next round's schedule. A refused
result ends the case. Writes, per case and rank: the job id, the schedules received, and
the status and body of every result posted.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
import sys
import time

from zeus016_gpu import install

WORLD_SIZE = 2
ROUNDS = 2
STEPS = 2


def rank_main(rank: int, port: int, cases: list[tuple[str, str]], queue: mp.Queue) -> None:
    install(num_gpus=WORLD_SIZE)
    import httpx
    import torch.distributed as dist
    from zeus.monitor import ZeusMonitor
    from zeus.optimizer.pipeline_frequency.common import (
        GET_FREQUENCY_SCHEDULE_URL,
        REPORT_PROFILING_RESULT_URL,
        FrequencySchedule,
        ProfilingResult,
    )
    from zeus.optimizer.pipeline_frequency.optimizer import PipelineFrequencyOptimizer

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    monitor = ZeusMonitor(gpu_indices=[rank], cpu_indices=[])
    out = {}
    for case, url in cases:
        opt = PipelineFrequencyOptimizer(
            rank=rank,
            dp_rank=0,
            pp_rank=rank,
            tp_rank=0,
            device_id=rank,
            dp_degree=1,
            pp_degree=WORLD_SIZE,
            tp_degree=1,
            world_size=WORLD_SIZE,
            server_url=url,
            job_metadata=f"zeus016-{case}",
        )
        schedules = [[list(x) for x in opt.freq_schedule]]
        results = []
        for _ in range(ROUNDS):
            iter_time, iter_energy = [], []
            for _ in range(STEPS):
                monitor.begin_window("iteration")
                opt.on_step_begin()
                for name, _freq in opt.freq_schedule:
                    opt.on_instruction_begin(name)
                    time.sleep(0.005)  # the instruction's computation
                    opt.on_instruction_end(name)
                opt.on_step_end()
                m = monitor.end_window("iteration")
                iter_time.append(m.time)
                iter_energy.append(m.total_energy)
            result = ProfilingResult(rank=rank, iter_time=iter_time, iter_energy=iter_energy)
            r = httpx.post(
                url + REPORT_PROFILING_RESULT_URL.format(job_id=opt.job_id),
                json=result.dict(),
                timeout=30,
            )
            results.append([r.status_code, r.text[:1000]])
            if r.status_code != 200:
                break
            r = httpx.get(
                url + GET_FREQUENCY_SCHEDULE_URL.format(job_id=opt.job_id),
                params={"rank": rank},
                timeout=30,
            )
            r.raise_for_status()
            schedule = FrequencySchedule.parse_raw(r.text)
            assert schedule.rank == rank
            opt.freq_schedule = schedule.frequencies
            opt.freq_schedule_iter = iter(opt.freq_schedule)
            schedules.append([list(x) for x in schedule.frequencies])
        opt.frequency_controller.end()
        opt.frequency_controller._proc.join(timeout=30)
        out[case] = {"job_id": opt.job_id, "schedules": schedules, "results": results}
        dist.barrier()
    dist.destroy_process_group()
    queue.put((rank, out))


def main() -> None:
    out_path = sys.argv[1]
    cases = [tuple(arg.split("=", 1)) for arg in sys.argv[2:]]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, cases, queue)) for r in range(WORLD_SIZE)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    codes = [p.exitcode for p in procs]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"ranks": {str(r): got[r] for r in sorted(got)}, "exitcodes": codes}, f)
    sys.exit(0 if codes == [0] * WORLD_SIZE else 1)


if __name__ == "__main__":
    main()
