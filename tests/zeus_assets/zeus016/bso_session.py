"""One training session driven by Zeus 0.16's own `BatchSizeOptimizer` (runs in the Zeus venv).

Usage: ``python bso_session.py SERVER_URL JOB_SPEC_JSON EPOCHS_TO_CONVERGE_JSON [--crash-after N]``

Zeus's documented sequence, unmodified: construct (registers the job), `get_batch_size`,
`on_train_begin`, then `on_evaluate(metric)` after every epoch until Zeus's client says the
trial is over (it sets `training_finished`, or raises `ZeusBSOTrainFailError`). An "epoch"
sleeps 50 ms on an emulated GPU (`zeus016_gpu`); its validation metric is 0.95 from the
epoch that ``EPOCHS_TO_CONVERGE_JSON[batch size]`` names on (null: never), 0.1 per epoch
before. ``--crash-after N`` leaves after N epochs without evaluating the N-th, as a crashed
script would: Zeus's client then ends the trial at exit (``PATCH /trials``).

Prints one JSON line: the job id, trial number, batch size, epochs run and the outcome
(``converged``, ``failed`` with Zeus's message, or ``crashed``).
"""

from __future__ import annotations

import argparse
import json
import time

from zeus016_gpu import install

install(num_gpus=1)

from zeus.monitor import ZeusMonitor  # noqa: E402
from zeus.optimizer.batch_size.client import BatchSizeOptimizer  # noqa: E402
from zeus.optimizer.batch_size.common import JobSpec  # noqa: E402
from zeus.optimizer.batch_size.exceptions import ZeusBSOTrainFailError  # noqa: E402

EPOCH_S = 0.05


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("server_url")
    parser.add_argument("job_spec")
    parser.add_argument("epochs_to_converge")
    parser.add_argument("--crash-after", type=int, default=None)
    args = parser.parse_args()
    need = {int(k): v for k, v in json.loads(args.epochs_to_converge).items()}

    monitor = ZeusMonitor(gpu_indices=[0], cpu_indices=[])
    bso = BatchSizeOptimizer(monitor, args.server_url, JobSpec.parse_obj(json.loads(args.job_spec)))
    batch_size = bso.get_batch_size()
    bso.on_train_begin()
    outcome, message, epoch = "running", "", 0
    while outcome == "running":
        epoch += 1
        time.sleep(EPOCH_S)
        if args.crash_after is not None and epoch >= args.crash_after:
            outcome = "crashed"
            break
        metric = 0.95 if need[batch_size] is not None and epoch >= need[batch_size] else 0.1 * epoch
        try:
            bso.on_evaluate(metric)
        except ZeusBSOTrainFailError as exc:
            outcome, message = "failed", str(exc)
            break
        if bso.training_finished:
            outcome = "converged"
    print(
        json.dumps(
            {
                "job_id": bso.job.job_id,
                "trial_number": bso.trial_number,
                "batch_size": batch_size,
                "epochs": epoch,
                "outcome": outcome,
                "message": message,
                "energy_j": bso.consumed_energy,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
