"""Opcode registry of the PTX interpreter: one module per opcode family registers compile functions.

A compile function ``f(ins, ctx) -> executor`` is registered for a dotted opcode prefix with
:func:`opcode`; an instruction resolves to the registration with the longest prefix of whole dotted
components (``cp.async.bulk.tensor`` wins over ``cp.async`` for ``cp.async.bulk.tensor.2d...``). The
compile function checks the modifiers it gets and raises :class:`~..errors.UnknownOpcodeError` for
any combination it does not implement (never a silent approximation). The executor
``fn(warp, mask) -> None | Wait | JUMPED`` runs the instruction for the lanes in ``mask`` (bool[32]);
see :mod:`..machine` for the state it may touch and :class:`..program.CompileContext` for operand
access.

Families register on import of :data:`BUILTIN_FAMILIES`; an external module (``nvgemm.emulator.isa``
wiring) calls :func:`opcode` the same way, or is listed with :func:`add_family`.
"""

from __future__ import annotations

import importlib
from typing import Callable

_REGISTRY: dict[str, Callable] = {}
BUILTIN_FAMILIES = [
    "nvgemm.emulator.ptx.ops.alu",
    "nvgemm.emulator.ptx.ops.bits",
    "nvgemm.emulator.ptx.ops.fp",
    "nvgemm.emulator.ptx.ops.memory",
    "nvgemm.emulator.ptx.ops.control",
    "nvgemm.emulator.ptx.ops.mma",
    "nvgemm.emulator.ptx.ops.matrix",
    "nvgemm.emulator.isa.ops_wgmma",
    "nvgemm.emulator.isa.ops_sm100",
    "nvgemm.emulator.isa.ops_clc",
]
_LOADED = False


def opcode(*prefixes: str):
    """Decorator: register a compile function for each dotted opcode prefix."""

    def deco(fn):
        for p in prefixes:
            _REGISTRY[p] = fn
        return fn

    return deco


def add_family(module: str) -> None:
    global _LOADED
    if module not in BUILTIN_FAMILIES:
        BUILTIN_FAMILIES.append(module)
        _LOADED = False


def load_families() -> None:
    global _LOADED
    if not _LOADED:
        for m in list(BUILTIN_FAMILIES):
            importlib.import_module(m)
        _LOADED = True


def lookup(opcode_name: str) -> Callable | None:
    load_families()
    parts = opcode_name.split(".")
    for n in range(len(parts), 0, -1):
        fn = _REGISTRY.get(".".join(parts[:n]))
        if fn is not None:
            return fn
    return None


def registered() -> list[str]:
    load_families()
    return sorted(_REGISTRY)


__all__ = ["BUILTIN_FAMILIES", "add_family", "load_families", "lookup", "opcode", "registered"]
