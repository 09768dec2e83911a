"""One error tree: every exception class of `perseus` (its schedulers included) is a PerseusError;
the tree knows nothing of HTTP, and the coordinator maps it to statuses in one place."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

from perseus import errors
from perseus.errors import PerseusError


def _modules(package_name: str) -> list[ModuleType]:
    package = importlib.import_module(package_name)
    modules = [package]
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # running them is their import
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError as exc:
            if exc.name in ("torch", "torch.distributed"):
                continue  # the training side needs torch; nothing else may fail to import
            raise
    return modules


@pytest.mark.parametrize("package", ["perseus", "perseus.schedulers"])
def test_every_exception_class_derives_from_perseus_error(package: str) -> None:
    found = []
    strays = []
    for module in _modules(package):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not issubclass(cls, BaseException):
                continue
            found.append(cls)
            if not issubclass(cls, PerseusError):
                strays.append(f"{cls.__module__}.{cls.__qualname__}")
    assert not strays, f"exception classes outside the PerseusError tree: {strays}"
    if package == "perseus":
        assert errors.RoundTimeoutError in found


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.ConfigurationError("x"), 400),
        (errors.UnknownJobError("x"), 404),
        (errors.InvalidJobError("x"), 422),
        (errors.InvalidRankError("x"), 422),
        (errors.InvalidResultError("x"), 422),
        (errors.RankConflictError("x"), 409),
        (errors.RankError("x"), 400),
        (errors.CoordinatorBusyError("x"), 503),
        (errors.JobStateError("x"), 409),
        (errors.JobStateError("x", cause=errors.RoundTimeoutError("x")), 409),
        (errors.JobStateError("x", cause=errors.SchedulerFailedError("x", cause=OSError())), 500),
        (errors.RoundTimeoutError("x"), 504),
        (errors.SchedulerFailedError("x"), 500),
        (errors.SchedulerFailedError("x", cause=errors.PlanError("x")), 400),
        (errors.SchedulerFailedError("x", cause=ZeroDivisionError()), 422),
    ],
)
def test_the_server_maps_each_error_to_its_status(error: PerseusError, status: int) -> None:
    from perseus.server.errors import status_of

    assert status_of(error) == status


def test_the_error_tree_knows_nothing_of_http() -> None:
    source = inspect.getsource(errors)
    for word in ("http_status", "fastapi", "starlette", "status_of"):
        assert word not in source
    assert not hasattr(errors.SolverError("x"), "status")


def test_retryability_is_a_property_of_the_class() -> None:
    retryable = {
        cls.__name__
        for cls in vars(errors).values()
        if inspect.isclass(cls) and issubclass(cls, PerseusError) and cls.retryable
    }
    assert retryable == {"CoordinatorUnreachableError", "CoordinatorBusyError"}
    assert not errors.JobNotFoundError("x", status_code=404).retryable


def test_errors_carry_their_context() -> None:
    assert errors.UnknownJobError("x", job_id="j1").job_id == "j1"
    assert errors.RankConflictError("x", rank=3).rank == 3
    cause = errors.RoundTimeoutError("late", job_id="j1")
    assert errors.JobStateError("late", job_id="j1", cause=cause).cause is cause
    failed = errors.CoordinatorRequestError("x", url="http://h/r", status_code=400)
    assert (failed.url, failed.status_code) == ("http://h/r", 400)


def test_client_and_server_coordinator_failures_are_distinct() -> None:
    assert not issubclass(errors.JobError, errors.CoordinatorError)
    assert not issubclass(errors.CoordinatorError, errors.JobError)


def test_non_perseus_errors_are_bad_input_or_a_crash() -> None:
    from perseus.server.errors import status_of

    assert status_of(ValueError("x")) == 400
    assert status_of(RuntimeError("x")) == 500
