"""The one error type the ISA semantics raise: an operand the ISA forbids or the emulator does not model."""

from __future__ import annotations


class IsaError(ValueError):
    """An instruction operand (descriptor field, shape, count, address) that is invalid per the PTX ISA or
    outside what the emulator models. The message names the instruction and the offending field."""
