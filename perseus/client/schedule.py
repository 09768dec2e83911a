"""Schedule validation: a rank's `FrequencySchedule` on arrival, and the order it executes.

`ScheduleValidator.accept` rejects, as soon as it arrives, a schedule meant for another
rank, an empty one, one that names an unknown instruction or a clock the GPU lacks, and
(when the rank said what it executes) one whose instruction order differs from the
stage's. During each step, `begin`/`end`/`finish_step` check that the instructions the
training loop executes are the schedule's, in its order, all of them. Every mismatch is a
`ScheduleError` that says which rank, stage and step or round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from perseus.errors import ScheduleError
from perseus.protocol import INSTRUCTIONS, FrequencySchedule

__all__ = ["ScheduleValidator"]


class ScheduleValidator:
    """One rank's schedule: checked when it arrives, then followed instruction by instruction.

    Args:
        rank, pp_rank: The rank and its pipeline stage (for messages).
        available_frequencies: The SM clocks the rank's GPU supports.
        expected_instructions: The stage's instruction names for one iteration, in
            execution order (None: not checked on arrival).
    """

    def __init__(
        self,
        *,
        rank: int,
        pp_rank: int,
        available_frequencies: Iterable[int],
        expected_instructions: Sequence[str] | None = None,
    ) -> None:
        self.rank = rank
        self.pp_rank = pp_rank
        self.available_frequencies = frozenset(available_frequencies)
        self.expected_instructions = (
            list(expected_instructions) if expected_instructions is not None else None
        )
        self.frequencies: list[tuple[str, int]] = []
        """The accepted schedule: (instruction name, MHz) in execution order."""
        self.index = 0
        """The next instruction of the current step (0-based)."""

    def accept(self, schedule: FrequencySchedule, round_: int) -> list[tuple[str, int]]:
        """Check the schedule of round `round_` and make it the one followed; returns it."""
        where = f"Rank {self.rank} (stage {self.pp_rank}), round {round_}"
        if schedule.rank != self.rank:
            raise ScheduleError(f"{where}: received the schedule of rank {schedule.rank}")
        if not schedule.frequencies:
            raise ScheduleError(f"{where}: received an empty schedule")
        allowed = self.available_frequencies
        for k, (name, freq) in enumerate(schedule.frequencies):
            if name not in INSTRUCTIONS:
                raise ScheduleError(
                    f"{where}: schedule entry #{k} names instruction {name!r}; "
                    f"expected one of {', '.join(INSTRUCTIONS)}"
                )
            if freq not in allowed:
                raise ScheduleError(
                    f"{where}: schedule entry #{k} asks for {freq} MHz, which this GPU does not "
                    f"support ({min(allowed)}..{max(allowed)} MHz)"
                )
        expected = self.expected_instructions
        if expected is not None:
            names = [name for name, _ in schedule.frequencies]
            if len(names) != len(expected):
                raise ScheduleError(
                    f"{where}: the schedule has {len(names)} instruction(s) per iteration but "
                    f"this stage executes {len(expected)}; the scheduler's pipeline schedule "
                    "(num_microbatches, stages) does not match the training job"
                )
            for k, (got, want) in enumerate(zip(names, expected, strict=True)):
                if got != want:
                    raise ScheduleError(
                        f"{where}: schedule entry #{k} is {got!r} but this stage executes "
                        f"{want!r} there"
                    )
        self.frequencies = [(name, int(freq)) for name, freq in schedule.frequencies]
        self.index = 0
        return self.frequencies

    def start_step(self) -> None:
        """A step begins: the next instruction is the schedule's first."""
        self.index = 0

    def begin(self, name: str, step: int) -> int:
        """Instruction `name` begins; returns its clock unless it is not the one due."""
        k = self.index
        if k >= len(self.frequencies):
            raise ScheduleError(
                f"Rank {self.rank} (stage {self.pp_rank}), step {step}: instruction #{k} "
                f"({name!r}) exceeds the schedule, which has {len(self.frequencies)} "
                "instruction(s) per iteration"
            )
        scheduled, freq = self.frequencies[k]
        if name != scheduled:
            raise ScheduleError(
                f"Rank {self.rank} (stage {self.pp_rank}), step {step}: executed {name!r} as "
                f"instruction #{k} but the schedule says {scheduled!r}"
            )
        return freq

    def end(self, name: str, step: int) -> int:
        """Instruction `name` ends; returns its scheduled clock unless it is not the one begun.

        Does not move on: call `advance` once the instruction is accounted for.
        """
        scheduled, freq = self.frequencies[self.index]
        if name != scheduled:
            raise ScheduleError(
                f"Rank {self.rank}, step {step}: on_instruction_end({name!r}) does not match "
                f"on_instruction_begin({scheduled!r})"
            )
        return freq

    def advance(self) -> None:
        """The current instruction is done; the next one is due."""
        self.index += 1

    def finish_step(self, step: int) -> None:
        """A step ends: every instruction of the schedule must have run."""
        if self.index != len(self.frequencies):
            raise ScheduleError(
                f"Rank {self.rank} (stage {self.pp_rank}), step {step}: executed "
                f"{self.index} instruction(s) but the schedule has {len(self.frequencies)} "
                "per iteration"
            )
