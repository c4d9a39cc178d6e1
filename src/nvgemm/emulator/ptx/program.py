"""Compile a parsed ``.entry`` into per-instruction executors (operand access resolved once).

:class:`CompileContext` is what opcode modules use to turn operands into fast accessors:

* ``ctx.src(op, dtype)`` -> ``get(warp) -> ndarray[32]`` (a view of the register's raw bits as
  ``dtype``, an immediate broadcast, a special register such as ``%tid.x``, the shared address of a
  ``.shared`` variable);
* ``ctx.dst(op, dtype)`` -> ``set(warp, mask, values)`` (masked store of ``values``' bits; ``_`` sinks);
* ``ctx.addr(op)`` -> ``(space_hint, get(warp) -> uint64[32])`` of an address operand ``[base+imm]``
  (``space_hint`` is ``"param"`` for a parameter symbol, else None);
* ``ctx.label(op)`` -> pc of a branch target; ``ctx.unsupported(msg)`` raises UnknownOpcodeError.

Executors must not modify arrays returned by getters in place (they may be register views).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, Callable

import numpy as np

from nvgemm.emulator.ptx import ops as ops_registry
from nvgemm.emulator.ptx.errors import EmulationError, UnknownOpcodeError
from nvgemm.emulator.ptx.machine import FULL, LANE_IDS, LANES
from nvgemm.emulator.ptx.parser import Entry, Instruction, Module, Operand, parse_module

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SIGNED = {2: np.int16, 4: np.int32, 8: np.int64}
BANK_DTYPE = {"pred": np.bool_, "b16": np.uint16, "b32": np.uint32, "b64": np.uint64}

#: PTX type suffix -> numpy dtype of the value (bf16 values are handled as uint16 bits by the fp module)
TYPE_DTYPE = {
    "b8": np.uint8, "u8": np.uint8, "s8": np.int8,
    "b16": np.uint16, "u16": np.uint16, "s16": np.int16, "f16": np.float16, "bf16": np.uint16,
    "b32": np.uint32, "u32": np.uint32, "s32": np.int32, "f32": np.float32, "f16x2": np.uint32, "bf16x2": np.uint32,
    "b64": np.uint64, "u64": np.uint64, "s64": np.int64, "f64": np.float64,
    "pred": np.bool_,
}


def _special_getter(name: str) -> Callable | None:
    comp = {"x": 0, "y": 1, "z": 2}

    def tid_comp(c):
        def g(w):
            bx, by, _ = w.cta.launch.block
            t = w.tid
            return (t % bx if c == 0 else (t // bx) % by if c == 1 else t // (bx * by)).astype(np.uint32)
        return g

    if name.startswith("%tid."):
        return tid_comp(comp[name[-1]])
    if name.startswith("%ntid."):
        return lambda w, c=comp[name[-1]]: np.full(LANES, w.cta.launch.block[c], np.uint32)
    if name.startswith("%ctaid."):
        return lambda w, c=comp[name[-1]]: np.full(LANES, w.cta.ctaid[c], np.uint32)
    if name.startswith("%nctaid."):
        return lambda w, c=comp[name[-1]]: np.full(LANES, w.cta.launch.grid[c], np.uint32)
    if name.startswith("%cluster_ctaid."):
        return lambda w, c=comp[name[-1]]: np.full(LANES, w.cta.ctaid[c] % w.cta.cluster.dims[c], np.uint32)
    if name.startswith("%cluster_nctaid."):
        return lambda w, c=comp[name[-1]]: np.full(LANES, w.cta.cluster.dims[c], np.uint32)
    if name.startswith("%clusterid."):
        return lambda w, c=comp[name[-1]]: np.full(LANES, w.cta.ctaid[c] // w.cta.cluster.dims[c], np.uint32)
    if name.startswith("%nclusterid."):
        return lambda w, c=comp[name[-1]]: np.full(LANES, w.cta.launch.grid[c] // w.cta.cluster.dims[c], np.uint32)
    simple = {
        "%laneid": lambda w: LANE_IDS,
        "%warpid": lambda w: np.full(LANES, w.wid, np.uint32),
        "%nwarpid": lambda w: np.full(LANES, len(w.cta.warps), np.uint32),
        "%cluster_ctarank": lambda w: np.full(LANES, w.cta.rank, np.uint32),
        "%cluster_nctarank": lambda w: np.full(LANES, len(w.cta.cluster.ctas), np.uint32),
        "%dynamic_smem_size": lambda w: np.full(LANES, w.cta.launch.dyn_smem, np.uint32),
        "%total_smem_size": lambda w: np.full(LANES, w.cta.shared.size, np.uint32),
        "%lanemask_eq": lambda w: (np.uint32(1) << LANE_IDS).astype(np.uint32),
        "%lanemask_lt": lambda w: ((np.uint64(1) << LANE_IDS.astype(np.uint64)) - np.uint64(1)).astype(np.uint32),
        "%lanemask_le": lambda w: ((np.uint64(2) << LANE_IDS.astype(np.uint64)) - np.uint64(1)).astype(np.uint32),
        "%lanemask_gt": lambda w: (~((np.uint64(2) << LANE_IDS.astype(np.uint64)) - np.uint64(1))).astype(np.uint32),
        "%lanemask_ge": lambda w: (~((np.uint64(1) << LANE_IDS.astype(np.uint64)) - np.uint64(1))).astype(np.uint32),
    }
    return simple.get(name)


def convert_bits(v: np.ndarray, dtype) -> np.ndarray:
    """Reinterpret ``v``'s raw bits as ``dtype`` (truncating / zero-extending when the widths differ)."""
    dtype = np.dtype(dtype)
    if v.dtype == dtype:
        return v
    if v.dtype == np.bool_ or dtype == np.bool_:
        return v.astype(dtype)
    if v.dtype.itemsize == dtype.itemsize:
        return v.view(dtype)
    raw = v.view(_UNSIGNED[v.dtype.itemsize]).astype(_UNSIGNED[dtype.itemsize])
    return raw.view(dtype)


class CompileContext:
    """Operand resolution for one entry (see the module docstring)."""

    def __init__(self, program: "Program"):
        self.program = program
        self.entry = program.entry

    def unsupported(self, ins: Instruction, msg: str = "") -> UnknownOpcodeError:
        return UnknownOpcodeError(f"PTX emulator: unsupported instruction {ins.opcode!r}"
                                  f"{': ' + msg if msg else ''} at {ins.where()}")

    def reg(self, op: Operand) -> tuple[str, int]:
        return self.program.reg_index[op.name]

    def src(self, op: Operand, dtype) -> Callable[[Any], np.ndarray]:
        dtype = np.dtype(dtype)
        if op.kind == "reg":
            bank, i = self.reg(op)
            bdt = np.dtype(BANK_DTYPE[bank])
            if op.neg:  # !%p
                return lambda w: ~w.bank[bank][i]
            if bdt == dtype:
                return lambda w: w.bank[bank][i]
            if bdt.itemsize == dtype.itemsize and bank != "pred":
                return lambda w: w.bank[bank][i].view(dtype)
            return lambda w: convert_bits(w.bank[bank][i], dtype)
        if op.kind == "imm":
            const = self.imm_array(op, dtype)
            return lambda w: const
        if op.kind == "sym":
            g = _special_getter(op.name)
            if g is not None:
                return lambda w: convert_bits(g(w), dtype)
            if op.name in self.program.shared_offsets:
                off = self.program.shared_offsets[op.name]  # the CTA's window carries its rank (bits 24+)
                base = np.full(LANES, off, dtype=np.uint64)
                return lambda w: (base | np.uint64(w.cta.shared_base)).astype(dtype)
            if op.name in self.program.param_offsets:
                off = self.program.param_offsets[op.name]
                const = np.full(LANES, off, dtype=np.uint64).astype(dtype)
                return lambda w: const
        raise EmulationError(f"PTX emulator: operand {op.text!r} cannot be read as {dtype}")

    def imm_array(self, op: Operand, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if op.name == "f32bits":
            v = np.uint32(op.value).view(np.float32)
            return np.full(LANES, v).astype(dtype) if dtype.kind == "f" else np.full(LANES, op.value, np.uint32).view(
                np.uint32).astype(dtype)
        if op.name == "f64bits":
            v = np.uint64(op.value).view(np.float64)
            return np.full(LANES, v).astype(dtype) if dtype.kind == "f" else np.full(LANES, op.value, np.uint64).astype(
                dtype)
        if op.fvalue is not None:
            return np.full(LANES, op.fvalue, dtype=np.float64).astype(dtype)
        if dtype.kind == "f":
            return np.full(LANES, op.value, dtype=np.float64).astype(dtype)
        if dtype == np.bool_:
            return np.full(LANES, bool(op.value))
        bits = op.value & ((1 << (8 * dtype.itemsize)) - 1)
        return np.full(LANES, bits, dtype=_UNSIGNED[dtype.itemsize]).view(dtype)

    def dst(self, op: Operand, dtype) -> Callable[[Any, np.ndarray, np.ndarray], None]:
        if op.kind == "sink":
            return lambda w, m, v: None
        if op.kind != "reg":
            raise EmulationError(f"PTX emulator: destination {op.text!r} is not a register")
        bank, i = self.reg(op)
        bdt = np.dtype(BANK_DTYPE[bank])

        def setter(w, m, v):
            if v.dtype != bdt:
                if v.dtype.kind == "i" and v.dtype.itemsize < bdt.itemsize:
                    v = v.astype(_SIGNED[bdt.itemsize])  # PTX: a signed result sign-extends to a wider register
                v = convert_bits(v, bdt)
            if m is FULL:
                w.bank[bank][i] = v
            else:
                np.copyto(w.bank[bank][i], v, where=m)

        return setter

    def addr(self, op: Operand) -> tuple[str | None, Callable[[Any], np.ndarray]]:
        if op.kind != "addr":
            raise EmulationError(f"PTX emulator: {op.text!r} is not an address operand")
        base, off = op.base, np.uint64(op.offset & 0xFFFFFFFFFFFFFFFF)
        if base.kind == "sym" and base.name in self.program.param_offsets:
            c = np.full(LANES, self.program.param_offsets[base.name] + op.offset, np.uint64)
            return "param", lambda w: c
        if base.kind == "imm":
            c = np.full(LANES, (base.value + op.offset) & 0xFFFFFFFFFFFFFFFF, np.uint64)
            return None, lambda w: c
        g = self.src(base, np.uint64) if base.kind != "reg" or self.reg(base)[0] == "b64" else None
        if g is None:  # a 32-bit register address (shared window offsets)
            bank, i = self.reg(base)
            return None, lambda w: w.bank[bank][i].astype(np.uint64) + off
        if op.offset == 0:
            return None, g
        return None, lambda w: g(w) + off

    def label(self, op: Operand) -> int:
        if op.kind != "sym" or op.name not in self.entry.labels:
            raise EmulationError(f"PTX emulator: unknown branch target {op.text!r}")
        return self.entry.labels[op.name]


class Program:
    """A compiled ``.entry``: executors per instruction, register banks, shared / param layout."""

    def __init__(self, module: Module, entry: Entry):
        self.module = module
        self.entry = entry
        self.instructions = entry.instructions
        self.reg_index: dict[str, tuple[str, int]] = {}
        self.bank_sizes: dict[str, int] = {}
        for name, bank in sorted(entry.regs.items()):
            n = self.bank_sizes.get(bank, 0)
            self.reg_index[name] = (bank, n)
            self.bank_sizes[bank] = n + 1
        self.param_offsets = {p.name: p.offset for p in entry.params}
        self.shared_offsets: dict[str, int] = {}
        off = 0
        for v in module.shared:
            if not v.extern:
                off = (off + v.align - 1) // v.align * v.align
                self.shared_offsets[v.name] = off
                off += v.size
        dyn_align = max([v.align for v in module.shared if v.extern] + [16])
        self.dyn_base = (off + dyn_align - 1) // dyn_align * dyn_align if off else 0
        self.static_size = off
        for v in module.shared:
            if v.extern:
                self.shared_offsets[v.name] = self.dyn_base
        ctx = CompileContext(self)
        self.executors: list[Callable] = []
        self.guards: list[tuple[str, int, bool] | None] = []
        self.is_branch: list[bool] = []
        unknown = []
        for ins in self.instructions:
            fn = ops_registry.lookup(ins.opcode)
            if fn is None:
                unknown.append(ins)
                self.executors.append(None)
                self.guards.append(None)
                self.is_branch.append(False)
                continue
            ex = fn(ins, ctx)
            self.executors.append(ex)
            self.is_branch.append(getattr(ex, "handles_guard", False))
            self.guards.append((*self.reg_index[ins.pred], ins.pred_neg) if ins.pred else None)
        if unknown:
            names = sorted({i.opcode for i in unknown})
            raise UnknownOpcodeError(f"PTX emulator: {len(names)} opcode(s) not implemented in {entry.name[:80]}: "
                                     f"{names} (first at {unknown[0].where()})")

    def shared_size(self, dyn_smem: int) -> int:
        return max(self.dyn_base + dyn_smem, self.static_size)


_CACHE: dict[tuple[str, str], Program] = {}
_MODULES: dict[str, Module] = {}
_CACHE_LOCK = threading.Lock()


def parse_cached(ptx: str) -> Module:
    """The parsed module of ``ptx`` (cached by the text's sha256)."""
    key = hashlib.sha256(ptx.encode()).hexdigest()
    with _CACHE_LOCK:
        mod = _MODULES.get(key)
    if mod is None:
        mod = parse_module(ptx)
        with _CACHE_LOCK:
            _MODULES[key] = mod
    return mod


def compile_entry(ptx: str, entry: str | None = None) -> Program:
    """Parse (cached by the PTX text's sha256) and compile one entry (the only one if ``entry`` is None)."""
    key = (hashlib.sha256(ptx.encode()).hexdigest(), entry or "")
    with _CACHE_LOCK:
        p = _CACHE.get(key)
    if p is not None:
        return p
    mod = parse_cached(ptx)
    if entry is None:
        if len(mod.entries) != 1:
            raise EmulationError(f"PTX module has {len(mod.entries)} entries; name one: {list(mod.entries)}")
        entry = next(iter(mod.entries))
    if entry not in mod.entries:
        raise EmulationError(f"PTX module has no entry {entry!r}; it has {list(mod.entries)}")
    p = Program(mod, mod.entries[entry])
    with _CACHE_LOCK:
        _CACHE[key] = p
    return p


__all__ = ["BANK_DTYPE", "CompileContext", "Program", "TYPE_DTYPE", "compile_entry", "convert_bits", "parse_cached"]
