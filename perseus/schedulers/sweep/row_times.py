"""Profile rows whose time is not their clock's, left out of the plan below the max clock.

A row's time is what the ranks measured for (stage, kind) at its clock: the mean over the
instructions that ran clear of a clock change (`perseus.schedulers.measurement`). Two kinds
of row cannot be trusted, and a plan built on them promises what no GPU does (a plan
predicted at +3.8 % ran +12.6 % slow: it chose a clock whose row said 15.4 ms where the GPU
takes 22.8 ms):

- **landing only**: no instruction of the row ran clear of a change, in any round that
  measured it. Where a rank alternates kinds that run at different clocks and each lasts
  less than the switch (the sweep's refine rounds on a zero-bubble schedule), every
  instruction starts a change that has not landed when it ends: the GPU may never have run
  the row's clock at all, and the row's time is another clock's.
- **a lower clock that runs faster**: only a power cap makes a lower clock faster, and by
  little (2 % on the published Bloom A40 profile). Of one (stage, kind)'s rows, the fewest
  are left out so that the rest run no more than `MAX_SPEEDUP_BELOW` faster than any
  higher clock kept (the max-clock row is always kept: every plan needs it).

The plan then does without those clocks, as it does without a row whose power no GPU can
draw (`perseus.schedulers.sweep.option_estimates`); the rows are said in the profile's
``left_out`` and the scheduler's ``profile_left_out`` event.
"""

from __future__ import annotations

from collections.abc import Iterable

from perseus.domain.rows import ProfileRow

__all__ = ["LANDING_ONLY", "MAX_SPEEDUP_BELOW", "note_landing", "untrusted_times"]

MAX_SPEEDUP_BELOW = 0.05
"""How much faster a row may run than a higher clock's row of its (stage, kind): the 2 % a
power cap can give, and the measurement's noise (1–3 % per instruction, averaged)."""

LANDING_ONLY = (
    "its time could not be measured: every instruction at this clock started while a clock "
    "change was landing, so it ran at least partly at another clock"
)

Key = tuple[int, str, int]


def note_landing(landing_only: set[Key], key: Key, own: bool) -> None:
    """Keep `landing_only` true for a row whose time was just set from a round: in it when
    the time is not its clock's own (`measured_unit_time`), out of it when it is."""
    if own:
        landing_only.discard(key)
    else:
        landing_only.add(key)


def untrusted_times(rows: Iterable[ProfileRow], landing_only: set[Key]) -> dict[Key, str]:
    """(stage, kind, MHz) → why the row's time is not its clock's, for the rows below their
    (stage, kind)'s max clock that are landing only (`landing_only`) or run faster than a
    higher clock (module docstring)."""
    by_unit: dict[tuple[int, str], list[ProfileRow]] = {}
    for r in rows:
        by_unit.setdefault((r.stage, r.instruction), []).append(r)
    out: dict[Key, str] = {}
    for unit_rows in by_unit.values():
        ordered = sorted(unit_rows, key=lambda r: r.frequency, reverse=True)
        top, rest = ordered[0], ordered[1:]
        trusted = [top]
        for r in rest:
            key = (r.stage, r.instruction, r.frequency)
            if key in landing_only:
                out[key] = LANDING_ONLY
            else:
                trusted.append(r)
        kept = _longest_slowing_chain([r.time for r in trusted])
        for i, r in enumerate(trusted):
            if i in kept:
                continue
            above = max((j for j in kept if j < i), key=lambda j: trusted[j].time, default=0)
            faster = 1.0 - r.time / trusted[above].time
            why = (
                f"{faster:.0%} faster than at {trusted[above].frequency} MHz"
                if faster > MAX_SPEEDUP_BELOW
                else "slower than the lower clocks measured after it"
            )
            out[r.stage, r.instruction, r.frequency] = (
                f"its time ({r.time * 1e3:.2f} ms) does not fit the clocks around it: {why} "
                "(no GPU runs a lower clock faster, beyond the little a power cap allows)"
            )
    return out


def _longest_slowing_chain(times: list[float]) -> set[int]:
    """Indices of the largest subset of `times` (ordered by clock, descending) that holds
    index 0 and in which each time is at least ``1 − MAX_SPEEDUP_BELOW`` of every kept
    time before it (a lower clock runs no faster than a higher one beyond the tolerance).
    O(n²) over one kind's clocks (a hundred at most)."""
    n = len(times)
    length = [0] * n  # 0: no chain from index 0 reaches it
    prev = [-1] * n
    length[0] = 1
    # Each kept time is checked against the slowest kept before it (the chain's bound).
    bound = [times[0]] + [0.0] * (n - 1)
    for i in range(1, n):
        for j in range(i):
            fits = length[j] and times[i] >= (1 - MAX_SPEEDUP_BELOW) * bound[j]
            if fits and length[j] + 1 > length[i]:
                length[i], prev[i] = length[j] + 1, j
                bound[i] = max(bound[j], times[i])
    end = max(range(n), key=lambda i: (length[i], -i))
    chain = set()
    while end >= 0:
        chain.add(end)
        end = prev[end]
    return chain
