"""``wgmma`` (sm_90a) semantics: the register fragments of ``m64nNk16``, ``wgmma.mma_async`` with bf16/f16
inputs and fp32 accumulators (A from registers or from a shared-memory descriptor, B from a descriptor) or with
e4m3/e5m2 inputs (``m64nNk32``, both operands K-major from descriptors), and
the warpgroup's async groups (``wgmma.fence`` / ``commit_group`` / ``wait_group``) as a pure object.

Written from the PTX ISA 9.7.15 "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (9.7.15.5.1
register fragments, 9.7.15.5.2 wgmma.mma_async, 9.7.15.6 wgmma.fence/commit_group/wait_group).

Syntax modelled (the forms nvgemm's wgmma family and CuTe's ``MmaF16BF16Op`` emit)::

    wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}.{bf16,f16}  d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b;
    wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}.{bf16,f16}  d, {a0..a3}, b-desc, scale-d, imm-scale-a, imm-scale-b, imm-trans-b;
    wgmma.mma_async.sync.aligned.m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2}  d, a-desc, b-desc, scale-d, imm-scale-a, imm-scale-b;

``D = (imm-scale-a A) (imm-scale-b B) + (scale-d ? D : 0)``, A is 64 x 16, B is 16 x N (stored N x K when
K-major, ``imm-trans-b = 0``), N a multiple of 8 in 8..256. Thread ``t`` of the warpgroup is warp
``w = t // 32``, lane ``l``, ``g = l // 4``, ``q = l % 4``:

* A in registers: 4 x 32-bit registers of two 16-bit elements each (element ``j`` = half ``j % 2`` of
  register ``j // 2``, the low half first): row ``16 w + g + 8 ((j // 2) % 2)``, column
  ``2 q + j % 2 + 8 (j // 4)``.
* D: N / 2 fp32 registers; register ``i`` holds row ``16 w + g + 8 ((i // 2) % 2)``, column
  ``8 (i // 4) + 2 q + i % 2``.

Asynchrony (strict, to expose missing waits and fences): an issued ``mma_async`` is only recorded; it runs
when a ``wait_group`` retires its group, reading the A registers, shared memory and D **at that moment**. So
a kernel that rewrites shared memory or the A registers before waiting computes wrong values here (as it may
on hardware), a read of a pending accumulator is reported by :meth:`WgmmaGroups.pending_registers`, and a
``mma_async`` whose accumulator or A registers were written after the last ``wgmma.fence`` is an error. The
float model is :func:`~.numerics.dot_f32` (exact products, K-order float64 sum, ``D`` last, one fp32
rounding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from nvgemm.emulator.isa import numerics
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.smem_desc import decode_wgmma_desc, read_operand

WARPGROUP = 128


def _thread_coords():
    t = np.arange(WARPGROUP)
    w, lane = t // 32, t % 32
    return w[:, None], (lane // 4)[:, None], (lane % 4)[:, None]


def a_fragment_coords() -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of the 8 A elements of each of the 128 threads, arrays of shape (128, 8) (element j)."""
    w, g, q = _thread_coords()
    j = np.arange(8)[None, :]
    return 16 * w + g + 8 * ((j // 2) % 2), 2 * q + j % 2 + 8 * (j // 4)


def d_fragment_coords(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of the n/2 fp32 accumulator registers of each thread, arrays of shape (128, n / 2)."""
    _check_n(n)
    w, g, q = _thread_coords()
    i = np.arange(n // 2)[None, :]
    return 16 * w + g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * q + i % 2


def _check_n(n: int) -> None:
    if n % 8 or not 8 <= n <= 256:
        raise IsaError(f"wgmma shape m64n{n}k16: N must be a multiple of 8 in 8..256")


def a_to_registers(a: np.ndarray) -> np.ndarray:
    """(128, 4) b32 registers holding a 64 x 16 uint16 A tile (the register-A fragment)."""
    rows, cols = a_fragment_coords()
    h = np.asarray(a, dtype=np.uint16)[rows, cols].astype(np.uint32).reshape(WARPGROUP, 4, 2)
    return h[..., 0] | (h[..., 1] << 16)


def d_from_registers(regs: np.ndarray, n: int) -> np.ndarray:
    """The 64 x n fp32 accumulator tile held in (128, n / 2) b32 registers."""
    r = np.asarray(regs, dtype=np.uint32)
    if r.shape != (WARPGROUP, n // 2):
        raise IsaError(f"wgmma m64n{n}: expected (128, {n // 2}) accumulator registers, got {r.shape}")
    rows, cols = d_fragment_coords(n)
    out = np.zeros((64, n), dtype=np.float32)
    out[rows, cols] = numerics.bits_f32(r)
    return out


def d_to_registers(d: np.ndarray) -> np.ndarray:
    """(128, n / 2) b32 registers of a 64 x n fp32 tile."""
    d = np.asarray(d, dtype=np.float32)
    rows, cols = d_fragment_coords(d.shape[1])
    return numerics.f32_bits(d[rows, cols])


FP8_TYPES = ("e4m3", "e5m2")


@dataclass(frozen=True)
class WgmmaShape:
    """The parsed modifiers of one ``wgmma.mma_async`` (dense, f32 accumulator): ``m64nNk16`` with 16-bit inputs,
    or ``m64nNk32`` with 8-bit floating-point inputs (``.e4m3`` / ``.e5m2``, which may differ between A and B;
    the ISA allows them only K-major, so that form has no imm-trans operands)."""

    n: int
    atype: str
    btype: str
    k: int = 16

    @property
    def elem_bits(self) -> int:
        return 8 if self.k == 32 else 16

    @classmethod
    def parse(cls, opcode: str) -> "WgmmaShape":
        parts = opcode.split(".")
        if parts[:4] != ["wgmma", "mma_async", "sync", "aligned"] or len(parts) != 8:
            raise IsaError(f"{opcode}: not a dense wgmma.mma_async.sync.aligned.<shape>.<d>.<a>.<b> opcode")
        shape, dtype, atype, btype = parts[4:]
        fp8 = atype in FP8_TYPES and btype in FP8_TYPES
        k = 32 if fp8 else 16
        if not (shape.startswith("m64n") and shape.endswith(f"k{k}")):
            raise IsaError(f"{opcode}: shape {shape} not modelled (m64nNk16 with 16-bit inputs, m64nNk32 with "
                           ".e4m3 / .e5m2)")
        n = int(shape[4:-3])
        _check_n(n)
        if dtype != "f32" or not (fp8 or (atype in ("bf16", "f16") and atype == btype)):
            raise IsaError(f"{opcode}: types .{dtype}.{atype}.{btype} not modelled (.f32 with .bf16 or .f16 inputs, "
                           "or .e4m3 / .e5m2)")
        return cls(n, atype, btype, k)


def _imm_scale(v: int, what: str) -> float:
    if v not in (1, -1):
        raise IsaError(f"wgmma {what} = {v}: the ISA allows 1 or -1")
    return float(v)


def _trans(v: int, what: str) -> str:
    if v not in (0, 1):
        raise IsaError(f"wgmma {what} = {v}: the ISA allows 0 or 1")
    return "mn" if v else "k"


def mma_async_warp(shape: WgmmaShape, warp: int, d_regs: np.ndarray, a: np.ndarray | int, b_desc: int, smem, *,
                   scale_d: bool, imm_scale_a: int = 1, imm_scale_b: int = 1, imm_trans_a: int = 0,
                   imm_trans_b: int = 0, window_base: int = 0) -> np.ndarray:
    """One warp's share of a ``wgmma.mma_async``: rows ``16 warp .. 16 warp + 15`` of D (the operation
    decomposes by rows, so the emulator runs each warp of the warpgroup on its own).

    ``warp`` is the warp's index in its warpgroup (0..3), ``d_regs`` its (32, N / 2) b32 accumulator
    registers, ``a`` its (32, 4) A registers or the A descriptor (int; ``imm_trans_a`` applies), ``smem``
    shared memory (see :func:`~.smem_desc.read_operand`). Returns the warp's new accumulator registers.
    """
    n = shape.n
    sa, sb = _imm_scale(imm_scale_a, "imm-scale-a"), _imm_scale(imm_scale_b, "imm-scale-b")
    if not 0 <= warp < 4:
        raise IsaError(f"wgmma: warp {warp} of a warpgroup (0..3)")
    lanes = slice(32 * warp, 32 * warp + 32)
    rows0 = 16 * warp
    k, bits = shape.k, shape.elem_bits
    if bits == 8 and (imm_trans_a or imm_trans_b):
        raise IsaError("wgmma with 8-bit inputs: the ISA allows only K-major operands (no imm-trans)")
    if isinstance(a, (int, np.integer)):
        a_tile = read_operand(smem, decode_wgmma_desc(a), 64, k, bits, _trans(imm_trans_a, "imm-trans-a"),
                              window_base=window_base)[rows0:rows0 + 16]
    elif bits == 8:
        raise IsaError("wgmma with 8-bit inputs and A in registers is not modelled (A from a descriptor is)")
    else:
        r = np.asarray(a, dtype=np.uint32)
        if r.shape != (32, 4):
            raise IsaError(f"wgmma register A: expected (32, 4) b32 registers per warp, got {r.shape}")
        halves = np.stack([r & 0xFFFF, r >> 16], axis=-1).reshape(32, 8).astype(np.uint16)
        ar, ac = a_fragment_coords()
        a_tile = np.zeros((16, 16), dtype=np.uint16)
        a_tile[ar[lanes] - rows0, ac[lanes]] = halves
    b_codes = read_operand(smem, decode_wgmma_desc(b_desc), n, k, bits, _trans(imm_trans_b, "imm-trans-b"),
                           window_base=window_base)
    dr, dc = d_fragment_coords(n)
    dr, dc = dr[lanes] - rows0, dc[lanes]
    d = None
    if scale_d:
        regs = np.asarray(d_regs, dtype=np.uint32)
        if regs.shape != (32, n // 2):
            raise IsaError(f"wgmma m64n{n}: expected (32, {n // 2}) accumulator registers per warp, got {regs.shape}")
        d = np.zeros((16, n), dtype=np.float32)
        d[dr, dc] = numerics.bits_f32(regs)
    av = numerics.values(a_tile, shape.atype) * sa
    bv = numerics.values(b_codes, shape.btype) * sb
    return numerics.f32_bits(numerics.dot_f32(av, bv, d)[dr, dc])


def mma_async(shape: WgmmaShape, d_regs: np.ndarray, a: np.ndarray | int, b_desc: int, smem, *,
              scale_d: bool, imm_scale_a: int = 1, imm_scale_b: int = 1, imm_trans_a: int = 0,
              imm_trans_b: int = 0, window_base: int = 0) -> np.ndarray:
    """The whole warpgroup's accumulator registers after one ``wgmma.mma_async`` (computed now; see
    :class:`WgmmaGroups` for the asynchrony): ``a`` is the (128, 4) A registers or an A descriptor (int),
    ``d_regs`` the (128, N / 2) b32 accumulators. The four warps' shares of :func:`mma_async_warp`."""
    d_regs = np.asarray(d_regs, dtype=np.uint32)
    if d_regs.shape != (WARPGROUP, shape.n // 2):
        raise IsaError(f"wgmma m64n{shape.n}: expected (128, {shape.n // 2}) accumulator registers, got {d_regs.shape}")
    if not isinstance(a, (int, np.integer)):
        a = np.asarray(a, dtype=np.uint32)
        if a.shape != (WARPGROUP, 4):
            raise IsaError(f"wgmma register A: expected (128, 4) b32 registers, got {a.shape}")
    kw = dict(scale_d=scale_d, imm_scale_a=imm_scale_a, imm_scale_b=imm_scale_b, imm_trans_a=imm_trans_a,
              imm_trans_b=imm_trans_b, window_base=window_base)
    return np.concatenate([
        mma_async_warp(shape, w, d_regs[32 * w:32 * w + 32],
                       a if isinstance(a, (int, np.integer)) else a[32 * w:32 * w + 32], b_desc, smem, **kw)
        for w in range(4)])


@dataclass
class _Pending:
    dst: tuple
    srcs: tuple
    run: Callable[[Callable[[Hashable], np.ndarray]], np.ndarray]


@dataclass
class WgmmaGroups:
    """The wgmma async state of one warpgroup (PTX ISA 9.7.15.6), independent of any register file.

    Register keys are opaque hashables chosen by the caller (e.g. ``(warp, "%r1094")``). The caller:

    * calls :meth:`fence` for ``wgmma.fence``, and :meth:`registers_written` whenever ordinary
      instructions write registers (a later ``mma_async`` reading or accumulating into them without an
      intervening fence is an error, as the ISA requires the fence there);
    * calls :meth:`issue` for ``mma_async`` with the accumulator and A register keys and a ``run(read)``
      closure that computes the new accumulator from ``read(key)`` (and shared memory, read when run);
    * calls :meth:`commit_group` and :meth:`wait_group`; the latter returns ``{key: value}`` to write back;
    * consults :meth:`pending_registers` before any ordinary access (the ISA makes accessing them undefined).
    """

    fenced: set = field(default_factory=set)
    uncommitted: list = field(default_factory=list)
    groups: list = field(default_factory=list)
    fence_seen: bool = False

    def fence(self) -> None:
        self.fence_seen = True
        self.fenced.clear()

    def registers_written(self, keys: Sequence[Hashable]) -> None:
        self.fenced.update(keys)

    def pending_registers(self) -> set:
        out = set()
        for op in self.uncommitted + [op for g in self.groups for op in g]:
            out.update(op.dst)
            out.update(op.srcs)
        return out

    def issue(self, dst: Sequence[Hashable], srcs: Sequence[Hashable], run) -> None:
        if not self.fence_seen:
            raise IsaError("wgmma.mma_async issued before any wgmma.fence (ISA 9.7.15.6.1 requires one)")
        stale = self.fenced.intersection(dst).union(self.fenced.intersection(srcs))
        if stale:
            raise IsaError(f"wgmma.mma_async uses registers written since the last wgmma.fence: "
                           f"{sorted(map(str, stale))[:4]}")
        self.uncommitted.append(_Pending(tuple(dst), tuple(srcs), run))

    def commit_group(self) -> None:
        """``wgmma.commit_group``: batch the uncommitted operations (an empty group if none)."""
        self.groups.append(self.uncommitted)
        self.uncommitted = []

    def wait_group(self, n: int, read: Callable[[Hashable], np.ndarray]) -> dict:
        """``wgmma.wait_group N``: run the oldest groups until at most ``n`` are pending; returns the register
        values to write back (``{key: value}``), in issue order (later writes override earlier ones)."""
        if n < 0:
            raise IsaError(f"wgmma.wait_group {n}: N must be non-negative")
        out: dict = {}

        def view(key):
            return out[key] if key in out else read(key)

        while len(self.groups) > n:
            for op in self.groups.pop(0):
                vals = op.run(view)
                for k, v in zip(op.dst, vals):
                    out[k] = v
        return out
