"""Results without per-instruction breakdowns (Zeus's default `ProfilingResult`): accepted by
every scheduler that does not need them, a 422 naming the scheduler and why for the others.
Real coordinator on loopback."""

from __future__ import annotations

import asyncio

import httpx
from server_fixtures import job_info, rank_infos, running_server

from perseus.domain.schedule import make_schedule
from perseus.protocol import ProfilingResult
from perseus.schedulers.base import has_breakdowns
from perseus.schedulers.registry import SCHEDULERS
from perseus.settings import PerseusSettings

PP, M = 2, 2
ZEUS_DEFAULT = {"iter_time": [0.5, 0.5], "iter_energy": [100.0, 101.0]}
"""What Zeus's `ProfilingResult(rank, iter_time, iter_energy)` sends: empty breakdowns."""
NO_BREAKDOWNS = {"time_breakdown": {}, "energy_breakdown": {}}


def _round(scheduler: str, args: dict) -> list[httpx.Response]:
    """Register a 2-rank job, take one round's schedules, post Zeus's default results."""

    async def main(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=20.0) as c:
            r = await c.post("/register_job", json=job_info(PP).model_dump())
            assert r.status_code == 200, r.text
            job_id = r.json()
            for info in rank_infos(PP):
                r = await c.post(f"/register_rank/{job_id}", json=info.model_dump())
                assert r.status_code == 200, r.text
            got = await asyncio.gather(
                *(c.get(f"/schedule/{job_id}", params={"rank": r}) for r in range(PP))
            )
            assert all(r.status_code == 200 for r in got), [r.text for r in got]
            posted = [
                await c.post(f"/result/{job_id}", json={"rank": r, **ZEUS_DEFAULT, **NO_BREAKDOWNS})
                for r in range(PP)
            ]
            return posted

    with running_server(
        PerseusSettings(scheduler=scheduler, scheduler_args=args), round_timeout_s=5.0
    ) as url:
        return asyncio.run(main(url))


def test_the_schedulers_that_need_breakdowns_say_why() -> None:
    declared = {name: cls.needs_breakdowns for name, cls in SCHEDULERS.items()}
    assert declared["AllMaxFrequency"] is None and declared["PointSolution"] is None
    needing = {name for name, why in declared.items() if why is not None}
    assert needing == {"EnvPipe", "InstructionProfiler", "Perseus", "ZeusGlobal", "ZeusPerStage"}


def test_all_max_and_point_solution_take_results_without_breakdowns(tmp_path) -> None:
    assert not has_breakdowns(ProfilingResult(rank=0, **ZEUS_DEFAULT))
    posted = _round("AllMaxFrequency", {"num_microbatches": M})
    assert [r.status_code for r in posted] == [200, 200], [r.text for r in posted]

    plan = tmp_path / "plan.py"
    kinds = make_schedule("1f1b", PP, M).kinds()
    plan.write_text(repr([[(k, 1200) for k in ks] for ks in kinds]))
    posted = _round("PointSolution", {"solution_path": str(plan), "num_microbatches": M})
    assert [r.status_code for r in posted] == [200, 200], [r.text for r in posted]


def test_a_scheduler_that_needs_breakdowns_answers_422_saying_which_and_why() -> None:
    posted = _round("InstructionProfiler", {"num_microbatches": M})
    assert [r.status_code for r in posted] == [422, 422]
    detail = posted[0].json()["detail"]
    assert "scheduler InstructionProfiler needs them" in detail
    assert "time and energy" in detail and "AllMaxFrequency" in detail
