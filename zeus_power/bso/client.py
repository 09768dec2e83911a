"""`BatchSizeOptimizer`: the training script's side of the batch-size optimizer service.

Call, in order, inside the training script:

1. `get_batch_size()` at the beginning of the script (rank 0; broadcast it yourself);
2. `on_train_begin()` before the first epoch;
3. `on_evaluate(metric)` after each epoch's validation. It returns True when the target
   metric is reached (stop training, the result is reported), False to go on, and raises
   `ZeusBSOTrainFailError` when the trial failed (early stop or max epochs; reported too).

One optimizer per training session of the job. The GPUs (taken from the monitor) should be
of one model; their count and max power limit enter the cost.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from zeus_power.bso.models import JobConfig, JobSpec, JobState, TrialAssignment, TrialResult
from zeus_power.bso.policy import epoch_verdict
from zeus_power.errors import (
    ZeusBSOConfigError,
    ZeusBSOConflictError,
    ZeusBSOJobNotFoundError,
    ZeusBSOOperationOrderError,
    ZeusBSORuntimeError,
    ZeusBSOTrainFailError,
    ZeusBSOTrialNotFoundError,
    ZeusConfigError,
)
from zeus_power.monitor import ZeusMonitor

__all__ = ["BSOClientSettings", "BatchSizeOptimizer"]

logger = logging.getLogger(__name__)

_WINDOW = "__BatchSizeOptimizer_train"


class BSOClientSettings(BaseSettings):
    """What a `BatchSizeOptimizer` reads from the environment (``ZEUS_BSO_*``)."""

    model_config = SettingsConfigDict(
        env_prefix="ZEUS_BSO_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    token: SecretStr | None = None
    """``ZEUS_BSO_TOKEN``: the server's token (the server reads the same variable)."""


class BatchSizeOptimizer:
    """Batch size optimizer client that talks to the server.

    If the job is already registered, the configuration must be identical to the
    registered one (else `ZeusBSOConfigError`).

    Args:
        monitor: Measures the GPUs the job trains on.
        server_url: URL of the batch size optimizer server, e.g. "http://127.0.0.1:8000".
        job: The job specification.
        rank: Rank of this process; only rank 0 asks for a batch size and reports.
        timeout_s: Timeout of each HTTP request.
        token: The server's token, sent as ``Authorization: Bearer <token>`` (default:
            ``ZEUS_BSO_TOKEN``, if set).
    """

    def __init__(
        self,
        monitor: ZeusMonitor,
        server_url: str,
        job: JobSpec,
        rank: int = 0,
        *,
        timeout_s: float = 10.0,
        token: str | None = None,
    ) -> None:
        if rank < 0:
            raise ZeusConfigError(f"rank must be >= 0, got {rank}.")
        self.monitor = monitor
        self.server_url = server_url.rstrip("/")
        self.rank = rank
        limits = {gpu.power_limit_constraints_mw()[1] for gpu in monitor.gpus}
        if len(limits) != 1:
            raise ZeusConfigError(
                f"The monitor's GPUs have different max power limits {sorted(limits)} mW; "
                "train on GPUs of one model."
            )
        self.job = JobConfig(
            **job.model_dump(),
            max_power_w=limits.pop() / 1000.0,
            number_of_gpus=len(monitor.gpus),
            gpu_model=monitor.gpus[0].name(),
        )
        if token is None:
            secret = BSOClientSettings().token
            token = secret.get_secret_value() if secret is not None else None
        headers = {"authorization": f"Bearer {token.strip()}"} if token else None
        self._client = httpx.Client(base_url=self.server_url, timeout=timeout_s, headers=headers)
        self.trial: TrialAssignment | None = None
        self.epochs = 0
        self._time_s = 0.0
        self._energy_j = 0.0
        self._train_begun = False
        self._finished = False
        try:
            self.job_state = self._request(
                "POST", "/jobs", JobState, json=self.job.model_dump(mode="json")
            )
        except BaseException:
            self._client.close()
            raise

    # ------------------------------------------------------------------ protocol

    def get_batch_size(self) -> int:
        """Ask the server for the batch size of this training session.

        Raises:
            ZeusBSOOperationOrderError: Called on a rank other than 0, or twice.
            ZeusBSORuntimeError: The server could not be reached or answered an error.
        """
        if self.rank != 0:
            raise ZeusBSOOperationOrderError(
                f"Only rank 0 asks for a batch size (this is rank {self.rank}); broadcast "
                "rank 0's batch size to the other ranks."
            )
        if self.trial is not None:
            return self.trial.batch_size
        trial = self._request("POST", f"/jobs/{self.job.job_id}/trials", TrialAssignment)
        if trial.batch_size not in self.job.batch_sizes:
            raise ZeusBSORuntimeError(
                f"The server handed out batch size {trial.batch_size}, which is not one of "
                f"{self.job.batch_sizes}.",
                url=self.server_url,
            )
        self.trial = trial
        logger.info(
            "Trial %d of job %s: batch size %d (%s)",
            trial.trial_number,
            trial.job_id,
            trial.batch_size,
            trial.stage,
        )
        return trial.batch_size

    def on_train_begin(self) -> None:
        """Start measuring the training run."""
        if self.rank != 0:
            return
        if self.trial is None:
            raise ZeusBSOOperationOrderError(
                "on_train_begin() before get_batch_size(): ask for the batch size first."
            )
        if self._train_begun:
            raise ZeusBSOOperationOrderError("on_train_begin() was already called.")
        self._train_begun = True
        self.monitor.begin_window(_WINDOW)

    def on_evaluate(self, metric: float) -> bool:
        """Decide whether to stop training after an epoch's evaluation.

        Training stops when the target metric is reached (returns True), or fails when
        `max_epochs` is reached or the cost passes the early-stop bound (β × best cost).
        Every stop is reported to the server.

        Raises:
            ZeusBSOOperationOrderError: Before `on_train_begin`, or after the trial ended.
            ZeusBSOTrainFailError: The trial failed and should stop; relaunch to get
                another batch size (this one will not be retried).
            ZeusBSORuntimeError: The server answered an error.
        """
        if self.rank != 0:
            return False
        if not self._train_begun or self.trial is None:
            raise ZeusBSOOperationOrderError(
                "on_evaluate() before on_train_begin(): call get_batch_size() and "
                "on_train_begin() first."
            )
        if self._finished:
            raise ZeusBSOOperationOrderError(
                f"Trial {self.trial.trial_number} already ended; start a new training session."
            )
        self.epochs += 1
        time_s, energy_j = self._measure()
        verdict = epoch_verdict(
            self.job,
            epochs=self.epochs,
            metric=metric,
            time_s=time_s,
            energy_j=energy_j,
            cost_ub=self.trial.cost_ub,
        )
        if not verdict.stop:
            return False
        self._report(energy_j, time_s, converged=verdict.converged)
        if verdict.converged:
            logger.info("Reached target metric %s at epoch %d", metric, self.epochs)
            return True
        raise ZeusBSOTrainFailError(
            f"Trial {self.trial.trial_number} (batch size {self.trial.batch_size}) of job "
            f"{self.job.job_id!r} failed: {verdict.reason}. Relaunch training to try another "
            "batch size."
        )

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def __enter__(self) -> BatchSizeOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _measure(self) -> tuple[float, float]:
        """Time and energy since `on_train_begin` (the window is reopened to continue)."""
        m = self.monitor.end_window(_WINDOW)
        self.monitor.begin_window(_WINDOW)
        self._time_s += m.time_s
        self._energy_j += m.total_energy_j
        return self._time_s, self._energy_j

    def _report(self, energy_j: float, time_s: float, *, converged: bool) -> None:
        if self.trial is None:
            raise ZeusBSOOperationOrderError(
                "A trial's result was reported before on_train_begin handed out a trial"
            )
        self._finished = True
        self.monitor.end_window(_WINDOW, cancel=True)
        result = TrialResult(
            energy_j=energy_j, time_s=time_s, converged=converged, epochs=self.epochs
        )
        self._request(
            "PATCH",
            f"/jobs/{self.job.job_id}/trials/{self.trial.trial_number}",
            None,
            json=result.model_dump(mode="json"),
        )

    def _request(self, method: str, path: str, model: type[BaseModel] | None, **kwargs: Any) -> Any:
        url = f"{self.server_url}{path}"
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ZeusBSORuntimeError(
                f"{method} {url} failed: {type(exc).__name__}: {exc}. Is the server running?",
                url=url,
            ) from exc
        self._handle_response(response, url)
        if model is None:
            return None
        try:
            return model.model_validate(response.json())
        except (ValueError, ValidationError) as exc:
            raise ZeusBSORuntimeError(
                f"{method} {url} returned an invalid body: {exc}", url=url
            ) from exc

    def _handle_response(self, response: httpx.Response, url: str) -> None:
        """Raise the matching error unless `response` is a success."""
        if response.is_success:
            return
        try:
            body = response.json()
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        detail = body.get("detail", response.text)
        code = response.status_code
        if code == 404 and body.get("error") == "ZeusBSOTrialNotFoundError":
            raise ZeusBSOTrialNotFoundError(str(detail))
        if code == 404:
            raise ZeusBSOJobNotFoundError(self.job.job_id)
        if code == 409 and response.request.method == "POST" and url.endswith("/jobs"):
            raise ZeusBSOConfigError(str(detail))
        if code == 409:
            raise ZeusBSOConflictError(str(detail))
        raise ZeusBSORuntimeError(
            f"{response.request.method} {url} answered {code}: {detail}",
            url=url,
            status_code=code,
        )
