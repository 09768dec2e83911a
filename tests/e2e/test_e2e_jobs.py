"""End to end: one coordinator, several jobs; one job over two (loopback) nodes.

- Two jobs of different shapes (1F1B with 2 microbatches, interleaved 1F1B with 4) train at
  the same time against ONE coordinator that has no default pipeline: each describes its
  own at registration (`attach`), and each gets its own plan.
- A 4-rank job launched as two torchrun "nodes" (``--nnodes 2 --node-rank 0|1``, c10d
  rendezvous on loopback), the coordinator its own process: the job finishes and Perseus
  deploys its plan to the ranks of both nodes.
"""

from __future__ import annotations

import subprocess
import threading

from e2e_fixtures import Coordinator, DemoJob, executed, require_torch, run_job, torchrun_command

from perseus.demo import free_port, read_traces
from perseus.io.plan_file import load_plan

require_torch()

# A 5 % budget: a two-clock sweep's plan then saves several times the spread of the all-max
# rounds' energy on a busy host, which the scheduler asks of a saving it promises; no guard
# (these jobs check plumbing; a busy host moves single rounds by 10 %; the guard has its
# own tests).
QUICK_SWEEP = {"freq_step": 40, "min_frequency": 800, "max_slowdown": 0.05, "guard": False}
# These tests check that jobs register, profile and get their own plans, not measurement:
# ideal sensors and one compute-bound workload for every kind, so that the two-clock sweep
# finds the saving it always found and no noise of a counter refreshing every 100 ms holds
# it back (measurement has its own tests: test_e2e_sensors, test_e2e_perseus).
IDEAL = {"ZEUS_EMULATED_SENSORS": "ideal", "PERSEUS_EMULATE_KINDS": "uniform"}
STEPS = 48  # sweep rounds last at least 0.5 s: several steps of these small jobs


def test_two_jobs_of_different_shapes_share_one_coordinator(tmp_path):
    jobs = {
        "a": DemoJob(nproc=2, layers="1,3", microbatches=2, steps=STEPS, env=IDEAL),
        "b": DemoJob(
            nproc=2, layers="2,6", schedule="interleaved", microbatches=4, steps=STEPS, env=IDEAL
        ),
    }
    results = {}
    with Coordinator(
        scheduler="Perseus",
        scheduler_args=QUICK_SWEEP,  # no num_microbatches: no default pipeline
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true"},
    ) as coordinator:

        def run(name):
            results[name] = run_job(tmp_path, jobs[name], coordinator, name=name)

        threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        job_dirs = coordinator.job_dirs()
    for name, (status, _, log) in results.items():
        assert status == 0, (name, log)
    plans = [load_plan(d / "deployed_plan.json") for d in job_dirs]
    assert sorted((p.num_microbatches, p.pipeline_schedule().num_chunks) for p in plans) == [
        (2, 1),
        (4, 2),
    ]
    for name, (_, traces, _) in results.items():
        (plan,) = [p for p in plans if p.num_microbatches == jobs[name].microbatches]
        for rank, records in traces.items():
            assert executed(records, STEPS - 1) == [tuple(x) for x in plan.frequencies[rank]]


def test_a_two_node_launch_on_loopback_trains_and_deploys(tmp_path):
    spec = DemoJob(nproc=2, layers="2,4,3,1", microbatches=4, steps=STEPS, env=IDEAL)
    endpoint = f"127.0.0.1:{free_port()}"
    trace = tmp_path / "trace"
    trace.mkdir()
    with Coordinator(
        scheduler="Perseus",
        scheduler_args=QUICK_SWEEP,
        dump_dir=tmp_path / "dump",
        log_path=tmp_path / "coordinator.log",
        env={"PERSEUS_DUMP_DATA": "true"},
    ) as coordinator:
        nodes, logs = [], []
        for node_rank in (0, 1):
            launcher = (
                "--nnodes", "2", "--node-rank", str(node_rank),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes",
            )  # fmt: skip
            logs.append(log := (tmp_path / f"node{node_rank}.log").open("wb"))
            nodes.append(
                subprocess.Popen(
                    torchrun_command(2, spec.train_args(coordinator.url), launcher_args=launcher),
                    env=spec.environment(trace),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        statuses = [node.wait(timeout=240) for node in nodes]
        for log in logs:
            log.close()
        (job_dir,) = coordinator.job_dirs()
    texts = [(tmp_path / f"node{n}.log").read_text(errors="replace") for n in (0, 1)]
    assert statuses == [0, 0], texts
    plan = load_plan(job_dir / "deployed_plan.json")
    traces = read_traces(trace)
    assert sorted(traces) == [0, 1, 2, 3]
    for rank, records in traces.items():
        assert executed(records, STEPS - 1) == [tuple(x) for x in plan.frequencies[rank]]
    assert any(f < 1410 for freqs in plan.stage_frequencies() for f in freqs)
