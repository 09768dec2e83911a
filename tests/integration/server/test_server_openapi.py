"""The OpenAPI schemas tell the truth: schemathesis against both real servers on loopback.

For every operation of the coordinator's and the batch-size optimizer's schema,
schemathesis generates valid and invalid requests (a bounded number, so the test stays
quick) and checks that no answer is a 5xx, that every status is declared, and that every
body has the declared content type and shape (issue #30, items 6 and 7).

Credentials: `auth_headers` sets the servers' token in their environment (`PERSEUS_TOKEN`,
`ZEUS_BSO_TOKEN`) and every request carries it, so the test runs the same whether or not the
servers require one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup
from server_fixtures import running_server as running_coordinator
from zeus_assets.bso_server import running_server as running_bso

from perseus.settings import PerseusSettings

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
MAX_EXAMPLES = 20
"""Examples per operation and generation mode (2 modes)."""


TOKEN = "schemathesis-test-token"


@pytest.fixture
def auth_headers(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The servers' token, set in their environment before they start (both fixtures
    depend on this one), and the headers every request carries."""
    monkeypatch.setenv("PERSEUS_TOKEN", TOKEN)
    monkeypatch.setenv("ZEUS_BSO_TOKEN", TOKEN)
    return {"Authorization": f"Bearer {TOKEN}"}


def _fuzz(base_url: str, headers: dict[str, str]) -> list[str]:
    """Run every operation of the server's schema; the failures, one line each."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", headers=headers)
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: schemathesis.Case) -> None:
                case.call_and_validate(
                    base_url=base_url, headers=headers, checks=CHECKS, timeout=10
                )

            try:
                run()
            except Unsatisfiable:  # no input to spoil (GET /info): nothing negative to send
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, FailureGroup) as exc:  # one per operation and mode, all reported
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    return failures


@pytest.fixture
def coordinator(tmp_path: Path, auth_headers: dict[str, str]) -> Iterator[str]:
    settings_ = PerseusSettings(
        scheduler="AllMaxFrequency",
        scheduler_args={"num_microbatches": 2},
        dump_data=True,
        dump_dir=str(tmp_path / "dump"),
    )
    # A short round timeout: a long-poll on a job that really exists answers within 1 s.
    with running_coordinator(settings_, round_timeout_s=1.0) as url:
        yield url


@pytest.fixture
def bso(tmp_path: Path, auth_headers: dict[str, str]) -> Iterator[str]:
    with running_bso(f"sqlite:///{tmp_path / 'bso.db'}") as url:
        yield url


def test_the_coordinators_openapi_schema_is_the_truth(
    coordinator: str, auth_headers: dict[str, str]
) -> None:
    failures = _fuzz(coordinator, auth_headers)
    assert not failures, "\n\n".join(failures)


def test_the_batch_size_optimizers_openapi_schema_is_the_truth(
    bso: str, auth_headers: dict[str, str]
) -> None:
    failures = _fuzz(bso, auth_headers)
    assert not failures, "\n\n".join(failures)
