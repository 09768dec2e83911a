"""A tiny but real training script driven by `ZeusMaster` (test asset).

Logistic regression with minibatch SGD on a fixed synthetic dataset, in numpy. Every step
also runs on an emulated A40 (virtual clock) so that energy and time follow the batch size
and the power limit, which `GlobalPowerLimitOptimizer` profiles and sets. The script
reads its knobs from the ZEUS_* environment and writes a `TrainingResult` JSON.
"""

from __future__ import annotations

import sys

import numpy as np

from zeus_power.device.emulated import EmulatedGPU, VirtualClock, Workload
from zeus_power.errors import ZeusCostThresholdExceededError
from zeus_power.metric import zeus_cost
from zeus_power.monitor import ZeusMonitor
from zeus_power.power_limit import GlobalPowerLimitOptimizer, ZeusCost
from zeus_power.training import TrainingEnv, TrainingResult

# Anisotropic classes: the first gradient points along the noisy features, so reaching the
# target takes many SGD steps, and larger batches (fewer steps per epoch) take more epochs.
SCALE = np.array([5.0, 5.0, 5.0, 5.0, 0.5, 0.5, 0.5, 0.5])
MEAN = np.array([1.0, 1.0, 1.0, 1.0, 0.3, 0.3, 0.3, 0.3])


def make_data(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, 8)) * SCALE + np.outer(2 * y - 1, MEAN)
    return x, y


def main() -> int:
    env = TrainingEnv.from_environ()
    data_rng = np.random.default_rng(0)  # The dataset is fixed; the seed varies training.
    x_train, y_train = make_data(2048, data_rng)
    x_val, y_val = make_data(1024, data_rng)
    rng = np.random.default_rng(env.seed)

    clock = VirtualClock()
    gpu = EmulatedGPU(0, gpu_type="A40", clock=clock)
    monitor = ZeusMonitor(gpus=[gpu], time_fn=clock)
    plo = GlobalPowerLimitOptimizer(
        monitor,
        ZeusCost(env.eta_knob),
        warmup_steps=env.profile_warmup_iters,
        profile_steps=env.profile_measure_iters,
        pl_step=50,
        profile_path=env.log_dir / f"power_profile_bs{env.batch_size}.json",
    )
    step_work = Workload(compute_s_at_max=2e-4 * env.batch_size + 5e-3, memory_s=1e-3)

    w = np.zeros(8)
    b = 0.0
    time_s = energy_j = 0.0
    monitor.begin_window("train")
    for epoch in range(1, env.max_epochs + 1):
        order = rng.permutation(len(x_train))
        for start in range(0, len(order), env.batch_size):
            plo.on_step_begin()
            idx = order[start : start + env.batch_size]
            p = 1.0 / (1.0 + np.exp(-np.clip(x_train[idx] @ w + b, -30, 30)))
            grad = p - y_train[idx]
            w -= env.learning_rate * x_train[idx].T @ grad / len(idx)
            b -= env.learning_rate * float(grad.mean())
            gpu.execute(step_work)
        plo.on_epoch_end()
        accuracy = float((((x_val @ w + b) > 0).astype(int) == y_val).mean())
        m = monitor.end_window("train")
        monitor.begin_window("train")
        time_s += m.time_s
        energy_j += m.total_energy_j
        print(f"epoch {epoch} accuracy {accuracy:.4f} bs {env.batch_size}", flush=True)
        if env.converged(accuracy):
            TrainingResult(
                energy_j=energy_j,
                time_s=time_s,
                reached=True,
                epochs=epoch,
                emulated=monitor.emulated,
            ).write(env.result_path)
            return 0
        cost = zeus_cost(energy_j, time_s, env.eta_knob, env.max_power_w)
        next_cost = cost * (epoch + 1) / epoch
        if next_cost > env.cost_thresh:
            TrainingResult(
                energy_j=energy_j,
                time_s=time_s,
                reached=False,
                epochs=epoch,
                emulated=monitor.emulated,
            ).write(env.result_path)
            raise ZeusCostThresholdExceededError(time_s, energy_j, cost, next_cost, env.cost_thresh)
    TrainingResult(
        energy_j=energy_j,
        time_s=time_s,
        reached=False,
        epochs=env.max_epochs,
        emulated=monitor.emulated,
    ).write(env.result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
