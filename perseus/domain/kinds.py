"""Instruction kinds: what one pipeline instruction of one microbatch does."""

from __future__ import annotations

__all__ = ["INSTRUCTIONS"]

INSTRUCTIONS = ("forward", "backward")
"""The instruction kinds a profile holds and a schedule orders, in profile order."""
