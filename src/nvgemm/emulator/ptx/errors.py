"""Errors of the PTX emulator; every one names what went wrong and where (instruction, CTA, warp, lane)."""

from __future__ import annotations


class EmulationError(RuntimeError):
    """The emulated kernel did something the PTX ISA forbids or leaves undefined (out-of-bounds access,
    a read of poisoned / in-flight shared memory, a misaligned address, a divergent collective, ...)."""


class UnknownOpcodeError(EmulationError):
    """The PTX uses an opcode (or modifier combination) no opcode module implements: never skipped."""


class DeadlockError(EmulationError):
    """Every live warp of a CTA waits on something that can no longer happen (a barrier some warps never
    reach, an mbarrier phase nobody completes); the message names each warp, its PC and what it waits on."""
