"""What the sm_90a W4A16 kernels share: inline-PTX helpers, the exact packed decode, the fp32
epilogue of one output element, and the registry contract (C ABI, can_implement, compile).

This module imports cutlass; it is imported only when a kernel is compiled (never at ``import
nvgemm``), through the kernel modules the family registers (``kernels=`` in its ``__init__``).

C ABI of every sm90 W4A16 template, in order (``launch.Sm90Args.abi_values``):

    mX     [M, K] bf16 | fp16 activations, K contiguous, row stride % 8 == 0
    mW     uint8 [n_tiles, n_chunks * 512]  prepared weight (:mod:`.operand`)
    mS     uint8 [n_tiles, n_chunks * 64]   re-encoded block scales
    mAlpha fp32 (1,) | (N,)                 weight_scale_2 (x input_scale for W4A4)
    mBias  fp32 (N,)                        (any fp32 tensor when the spec has no bias)
    mRes   [M, N_out] output dtype          (any such tensor when the spec has no residual)
    mOut   [M, N_out]
    mWork  fp32 (numel,)                    split-K partials (any fp32 tensor when split_k == 1)
    mCount int32 (numel,)                   split-K tile counters, zero-initialised once and left
                                            at zero by every call (any int32 tensor when split_k == 1)
    stream

Absent bias / residual / workspace are compile-time epilogue variants: the kernel never touches
those arguments, so the host passes tensors it already has instead of allocating dummies.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from nvgemm.epilogues.cute_apply import Activation
from nvgemm.core.epilogue import EpilogueSpec

from nvgemm.aot.abi import CompileSpec, StreamArg, SymDim, TensorArg, compile_for_target, fake_args
from nvgemm.core.status import Status
from nvgemm.templates.sm90_w4a16.config import (
    ARCH_CAPS, DECODE_UNSCALE, SM90_ARCHS, Sm90W4A16Config, arch_problem, validate_config,
)
from nvgemm.templates.sm90_w4a16.operand import SCHEMES

_TORCH_TO_ABI = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}
X_FORMATS = {"bf16": "BFloat16", "fp16": "Float16"}
_M32 = 0xFFFFFFFF


def i32(v: int) -> int:
    """A 32-bit pattern as a signed Python int (DSL Int32 constants)."""
    v &= _M32
    return v - (1 << 32) if v & 0x80000000 else v


# ---------------------------------------------------------------------------------------------
# inline PTX (one instruction each, so width, cache policy and ordering are explicit)
# ---------------------------------------------------------------------------------------------


def _asm(ret_type, operands, text, constraints, loc, ip, side_effects=False):
    return llvm.inline_asm(
        ret_type,
        operands,
        text,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


def _v(x, ty, loc, ip):
    return ty(x).ir_value(loc=loc, ip=ip)


def _words(r, n, loc, ip):
    return [Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(n)]


@dsl_user_op
def evict_first_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache policy that marks lines evict-first (the weight stream is read once)."""
    return Int64(_asm(T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l", loc, ip))


@dsl_user_op
def cp_async_stream(dst: Int32, src: Int64, policy: Int64, *, loc=None, ip=None):
    """16-byte ``cp.async.cg`` (L2 only) global -> shared with an L2 cache-policy hint."""
    _asm(None, [_v(dst, Int32, loc, ip), _v(src, Int64, loc, ip), _v(policy, Int64, loc, ip)],
         "cp.async.cg.shared.global.L2::cache_hint [$0], [$1], 16, $2;", "r,l,l", loc, ip, True)


@dsl_user_op
def cp_async_small(dst: Int32, src: Int64, policy: Int64, nbytes: int, *, loc=None, ip=None):
    """4- or 8-byte ``cp.async.ca`` global -> shared with an L2 cache-policy hint (the scales)."""
    _asm(None, [_v(dst, Int32, loc, ip), _v(src, Int64, loc, ip), _v(policy, Int64, loc, ip)],
         f"cp.async.ca.shared.global.L2::cache_hint [$0], [$1], {nbytes}, $2;", "r,l,l", loc, ip, True)


@dsl_user_op
def cp_async_zfill(dst: Int32, src: Int64, src_bytes: Int32, *, loc=None, ip=None):
    """16-byte ``cp.async.ca`` (through L1: activations are re-read by every CTA) reading
    ``src_bytes`` (16 or 0) and zero-filling the rest."""
    _asm(None, [_v(dst, Int32, loc, ip), _v(src, Int64, loc, ip), _v(src_bytes, Int32, loc, ip)],
         "cp.async.ca.shared.global [$0], [$1], 16, $2;", "r,l,r", loc, ip, True)


@dsl_user_op
def cp_async_small4(dst: Int32, src: Int64, src_bytes: Int32, *, loc=None, ip=None):
    """4-byte ``cp.async.ca`` global -> shared reading ``src_bytes`` (4 or 0) and zero-filling the
    rest (the wgmma family's activation pairs)."""
    _asm(None, [_v(dst, Int32, loc, ip), _v(src, Int64, loc, ip), _v(src_bytes, Int32, loc, ip)],
         "cp.async.ca.shared.global [$0], [$1], 4, $2;", "r,l,r", loc, ip, True)


@dsl_user_op
def cp_async_commit(*, loc=None, ip=None):
    _asm(None, [], "cp.async.commit_group;", "~{memory}", loc, ip, True)


@dsl_user_op
def cp_async_wait(n: int, *, loc=None, ip=None):
    _asm(None, [], f"cp.async.wait_group {n};", "~{memory}", loc, ip, True)


@dsl_user_op
def cta_barrier(*, loc=None, ip=None):
    _asm(None, [], "bar.sync 0;", "~{memory}", loc, ip, True)


@dsl_user_op
def pinned_i32(v: Int32, *, loc=None, ip=None) -> Int32:
    """``v`` through a volatile ``mov``: a loop invariant the compiler can neither sink into the
    loop nor recompute there (MLIR / ptxas otherwise rebuild thread-index arithmetic per iteration
    inside the conditional producer block)."""
    return Int32(_asm(T.i32(), [_v(v, Int32, loc, ip)], "mov.b32 $0, $1;", "=r,r", loc, ip, side_effects=True))


@dsl_user_op
def pinned_i64(v: Int64, *, loc=None, ip=None) -> Int64:
    """64-bit :func:`pinned_i32`."""
    return Int64(_asm(T.i64(), [_v(v, Int64, loc, ip)], "mov.b64 $0, $1;", "=l,l", loc, ip, side_effects=True))


@dsl_user_op
def lds_v4(addr: Int32, *, loc=None, ip=None):
    """16-byte shared-memory load (ordered after barriers and cp.async waits)."""
    st = llvm.StructType.get_literal([T.i32()] * 4)
    r = _asm(st, [_v(addr, Int32, loc, ip)], "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,~{memory}",
             loc, ip, True)
    return _words(r, 4, loc, ip)


@dsl_user_op
def lds_v2(addr: Int32, *, loc=None, ip=None):
    st = llvm.StructType.get_literal([T.i32()] * 2)
    r = _asm(st, [_v(addr, Int32, loc, ip)], "ld.shared.v2.b32 {$0, $1}, [$2];", "=r,=r,r,~{memory}", loc, ip, True)
    return _words(r, 2, loc, ip)


@dsl_user_op
def lds_u32(addr: Int32, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int32, loc, ip)], "ld.shared.b32 $0, [$1];", "=r,r,~{memory}", loc, ip, True))


@dsl_user_op
def sts_u32(addr: Int32, v: Int32, *, loc=None, ip=None):
    _asm(None, [_v(addr, Int32, loc, ip), _v(v, Int32, loc, ip)], "st.shared.b32 [$0], $1;", "r,r,~{memory}",
         loc, ip, True)


@dsl_user_op
def ld_global_cg_f32(addr: Int64, *, loc=None, ip=None) -> Float32:
    """fp32 load through L2 only (split-K partials written by other CTAs of this launch)."""
    return Float32(_asm(T.f32(), [_v(addr, Int64, loc, ip)], "ld.global.cg.f32 $0, [$1];", "=f,l,~{memory}",
                        loc, ip, True))


@dsl_user_op
def fmul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``mul.rn.f32``: an fp32 product that is never contracted into a following add."""
    return Float32(_asm(T.f32(), [_v(a, Float32, loc, ip), _v(b, Float32, loc, ip)], "mul.rn.f32 $0, $1, $2;",
                        "=f,f,f", loc, ip))


@dsl_user_op
def fadd_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``add.rn.f32``: an fp32 sum that is never contracted with a preceding product."""
    return Float32(_asm(T.f32(), [_v(a, Float32, loc, ip), _v(b, Float32, loc, ip)], "add.rn.f32 $0, $1, $2;",
                        "=f,f,f", loc, ip))


@dsl_user_op
def st_global_f32(addr: Int64, v: Float32, *, loc=None, ip=None):
    _asm(None, [_v(addr, Int64, loc, ip), _v(v, Float32, loc, ip)], "st.global.f32 [$0], $1;", "l,f,~{memory}",
         loc, ip, True)


@dsl_user_op
def fence_gpu(*, loc=None, ip=None):
    _asm(None, [], "fence.acq_rel.gpu;", "~{memory}", loc, ip, True)


@dsl_user_op
def atomic_add_gpu(addr: Int64, v: Int32, *, loc=None, ip=None) -> Int32:
    """``atom.acq_rel.gpu.global.add.u32``: returns the old value."""
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip), _v(v, Int32, loc, ip)],
                      "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r,~{memory}", loc, ip, True))


@dsl_user_op
def st_global_relaxed_u32(addr: Int64, v: Int32, *, loc=None, ip=None):
    _asm(None, [_v(addr, Int64, loc, ip), _v(v, Int32, loc, ip)], "st.relaxed.gpu.global.u32 [$0], $1;",
         "l,r,~{memory}", loc, ip, True)


@dsl_user_op
def rotr(w: Int32, r: int, *, loc=None, ip=None) -> Int32:
    """Rotate right by a constant (one ``SHF.R.W``)."""
    return Int32(_asm(T.i32(), [_v(w, Int32, loc, ip)], f"shf.r.wrap.b32 $0, $1, $1, {r};", "=r,r", loc, ip))


@dsl_user_op
def and_imm(w: Int32, mask: int, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(w, Int32, loc, ip)], f"and.b32 $0, $1, {mask & _M32:#x};", "=r,r", loc, ip))


@dsl_user_op
def xor_and_imm(a: Int32, b: Int32, mask: int, *, loc=None, ip=None) -> Int32:
    """``(a ^ b) & mask`` in one ``lop3`` (LUT 0x28 = (a ^ b) & c with c = mask)."""
    return Int32(_asm(T.i32(), [_v(a, Int32, loc, ip), _v(b, Int32, loc, ip)],
                      f"lop3.b32 $0, $1, $2, {mask & _M32:#x}, 0x28;", "=r,r,r", loc, ip))


@dsl_user_op
def prmt(a: Int32, sel: int, *, loc=None, ip=None) -> Int32:
    """Byte permute of one register (``prmt.b32 d, a, a, sel``)."""
    return Int32(_asm(T.i32(), [_v(a, Int32, loc, ip)], f"prmt.b32 $0, $1, $1, {sel:#x};", "=r,r", loc, ip))


@dsl_user_op
def hmul2(a: Int32, b: Int32, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Packed bf16x2 / f16x2 multiply, round to nearest (exact for the decode's products)."""
    ins = "mul.rn.bf16x2" if is_bf16 else "mul.rn.f16x2"
    return Int32(_asm(T.i32(), [_v(a, Int32, loc, ip), _v(b, Int32, loc, ip)], f"{ins} $0, $1, $2;", "=r,r,r",
                      loc, ip))


@dsl_user_op
def hmul2_bcast(a: Int32, b: Int32, half: int, is_bf16: bool, bf16_mul: bool = True, *, loc=None,
                ip=None) -> Int32:
    """``a * (b.half, b.half)``: packed multiply by one half of ``b`` broadcast to both lanes (ptxas
    folds the broadcast into the HMUL2 operand selector ``.H0_H0`` / ``.H1_H1``). ``bf16_mul=False``
    (archs before sm_90 have no ``mul.bf16x2``): ``fma.rn.bf16x2 d, a, b, -0.0``, the same bits
    (:class:`~.config.ArchCaps`)."""
    pick = "{t, u}" if half == 0 else "{u, t}"
    if is_bf16 and not bf16_mul:  # (-0, -0) from a register: fma takes no immediate operand
        regs, mul = "d, z", "mov.b32 z, 0x80008000; fma.rn.bf16x2 $0, $1, d, z;"
    else:
        regs, mul = "d", f"{'mul.rn.bf16x2' if is_bf16 else 'mul.rn.f16x2'} $0, $1, d;"
    text = f"{{ .reg .b16 t, u; .reg .b32 {regs}; mov.b32 {pick}, $2; mov.b32 d, {{t, t}}; {mul} }}"
    return Int32(_asm(T.i32(), [_v(a, Int32, loc, ip), _v(b, Int32, loc, ip)], text, "=r,r,r", loc, ip))


@dsl_user_op
def scale_pair(word: Int32, which: int, shift: int, add: int, *, loc=None, ip=None) -> Int32:
    """Encoded scale bytes ``which`` (0: bytes 0 and 2, 1: bytes 1 and 3) of ``word`` -> the packed
    bf16x2 / f16x2 scale pair (rows g, g + 8): one mask and one shift-add (:mod:`.operand`)."""
    # bytes (1, 3) -> halves with one byte permute (zero bytes from the immediate 0)
    pre = "prmt.b32 t, $1, 0, 0x7371;" if which else "and.b32 t, $1, 0x00FF00FF;"
    return Int32(_asm(T.i32(), [_v(word, Int32, loc, ip)],
                      f"{{ .reg .b32 t; {pre} shl.b32 t, t, {shift}; add.u32 $0, t, {add & _M32:#x}; }}",
                      "=r,r", loc, ip))


@dsl_user_op
def mma_16816(a, b, c, is_bf16: bool, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}``: D = A(16x16) B(16x8) + C, fp32 C/D."""
    kind = "bf16" if is_bf16 else "f16"
    st = llvm.StructType.get_literal([T.f32()] * 4)
    ops = [_v(x, Int32, loc, ip) for x in (*a, *b)] + [_v(x, Float32, loc, ip) for x in c]
    r = _asm(st, ops,
             f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
             "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
             "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


#: Upper bits of a WGMMA shared-memory matrix descriptor for a K-major operand with the 128-byte
#: swizzle: layout type 1 (SWIZZLE_128B) in bits 62-63, stride byte offset 1024 (8 rows of 128
#: bytes, ``>> 4``) in bits 32-45, leading byte offset field 1 (16 bytes; unused by swizzled
#: K-major layouts -- the value CuTe's own descriptors carry) in bits 16-29. The low 14 bits are the
#: operand's shared-memory address ``>> 4``; one 16-deep k-step further along K is ``+ 2`` (32 bytes).
WGMMA_DESC_SW128_KMAJOR = (1 << 62) | ((1024 >> 4) << 32) | (1 << 16)


@dsl_user_op
def smem_desc_sw128(addr: Int32, *, loc=None, ip=None) -> Int64:
    """The WGMMA descriptor of a K-major, 128-byte-swizzled operand starting at shared address
    ``addr`` (1024-byte aligned atoms of 8 rows x 128 bytes)."""
    text = ("{ .reg .b32 t; .reg .b64 u; shr.b32 t, $1, 4; and.b32 t, t, 0x3FFF; cvt.u64.u32 u, t; "
            f"or.b64 $0, u, {WGMMA_DESC_SW128_KMAJOR:#x}; }}")
    return Int64(_asm(T.i64(), [_v(addr, Int32, loc, ip)], text, "=l,r", loc, ip))


@dsl_user_op
def wgmma_rs(acc: list, a, desc: Int64, n: int, is_bf16: bool, *, loc=None, ip=None) -> list:
    """``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{bf16,f16}`` with A (64 x 16) from registers --
    this thread's four packed A registers, the ``mma.m16n8k16`` A-fragment layout for its warp's 16
    rows -- and B (16 x n) from shared memory (``desc``), accumulating into the ``n / 2`` fp32
    registers ``acc`` (the ``m16n8`` C-fragment layout per 8 columns). Asynchronous: the caller
    fences (``warpgroup.fence``) before, commits and waits after; the returned values must not be
    read before a wait that covers this instruction (:func:`fence_regs` after the wait)."""
    kind = "bf16" if is_bf16 else "f16"
    na = n // 2
    st = llvm.StructType.get_literal([T.f32()] * na)
    d = ", ".join(f"${i}" for i in range(na))
    text = (f"{{ .reg .pred p; setp.ne.b32 p, ${na + 5}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} "
            f"{{{d}}}, {{${na}, ${na + 1}, ${na + 2}, ${na + 3}}}, ${na + 4}, p, 1, 1, 0; }}")
    cons = ",".join(["=f"] * na + ["r"] * 4 + ["l", "r"] + [str(i) for i in range(na)])
    ops = ([_v(x, Int32, loc, ip) for x in a] + [_v(desc, Int64, loc, ip), _v(1, Int32, loc, ip)]
           + [_v(x, Float32, loc, ip) for x in acc])
    r = _asm(st, ops, text, cons, loc, ip, True)
    return [Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(na)]


@dsl_user_op
def fence_regs(vals: list, *, loc=None, ip=None) -> list:
    """An empty side-effecting asm that takes and returns ``vals`` (fp32): after a
    ``wgmma.wait_group`` it keeps every read of the accumulators below the wait (the compiler may
    not move a read of a value across the asm that defines it)."""
    n = len(vals)
    st = llvm.StructType.get_literal([T.f32()] * n)
    cons = ",".join(["=f"] * n + [str(i) for i in range(n)])
    r = _asm(st, [_v(x, Float32, loc, ip) for x in vals], "", cons, loc, ip, True)
    return [Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(n)]


@dsl_user_op
def fence_proxy_async_smem(*, loc=None, ip=None):
    """``fence.proxy.async.shared::cta``: this thread's completed generic-proxy shared-memory writes
    (cp.async included) become visible to the async proxy (the WGMMA's B-operand reads)."""
    _asm(None, [], "fence.proxy.async.shared::cta;", "~{memory}", loc, ip, True)


@dsl_user_op
def pair_to_f32(v: Int32, is_bf16: bool, *, loc=None, ip=None):
    """A packed bf16x2 / f16x2 register -> (low, high) fp32, exact (subnormals kept)."""
    st = llvm.StructType.get_literal([T.f32()] * 2)
    if is_bf16:
        text = "{ .reg .b32 l, h; shl.b32 l, $2, 16; and.b32 h, $2, 0xFFFF0000; mov.b32 $0, l; mov.b32 $1, h; }"
    else:
        text = "{ .reg .f16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }"
    r = _asm(st, [_v(v, Int32, loc, ip)], text, "=f,=f,r", loc, ip)
    return (Float32(llvm.extractvalue(T.f32(), r, [0], loc=loc, ip=ip)),
            Float32(llvm.extractvalue(T.f32(), r, [1], loc=loc, ip=ip)))


@dsl_user_op
def ld_stream_v4(addr: Int64, *, loc=None, ip=None):
    """16-byte read-only global load that bypasses L1 (streamed once)."""
    st = llvm.StructType.get_literal([T.i32()] * 4)
    r = _asm(st, [_v(addr, Int64, loc, ip)], "ld.global.nc.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];",
             "=r,=r,=r,=r,l", loc, ip)
    return _words(r, 4, loc, ip)


@dsl_user_op
def ld_stream_u32(addr: Int64, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip)], "ld.global.nc.L1::no_allocate.b32 $0, [$1];", "=r,l",
                      loc, ip))


@dsl_user_op
def ld_cached_v4(addr: Int64, *, loc=None, ip=None):
    """16-byte read-only global load through L1 (activations)."""
    st = llvm.StructType.get_literal([T.i32()] * 4)
    r = _asm(st, [_v(addr, Int64, loc, ip)], "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", loc, ip)
    return _words(r, 4, loc, ip)


@cute.jit
def splitk_arrive(mCount: cute.Tensor, index: Int32, splits: int, flag_addr: Int32, tidx: Int32) -> Int32:
    """After this CTA stored its split-K partials: fence, bump the tile's counter, and return 1 in
    every thread of the CTA that arrived last (which also puts the counter back to zero)."""
    fence_gpu()
    cta_barrier()
    if tidx == 0:
        caddr = mCount.iterator.toint() + Int64(index) * 4
        old = atomic_add_gpu(caddr, Int32(1))
        last = old == splits - 1
        sts_u32(flag_addr, cutlass.select_(last, Int32(1), Int32(0)))
        if last:
            st_global_relaxed_u32(caddr, Int32(0))
    cta_barrier()
    is_last = lds_u32(flag_addr)
    if is_last == 1:
        fence_gpu()
    return is_last


def decode_word(w: Int32, kind: str):
    """One prepared weight word -> the four packed A registers (o0..o3) of its MMA k-step,
    ``E2M1 * 2**-126`` (bf16) / ``E2M1 * 2**-14`` (fp16): each distinct rotation once, then one
    mask or masked XOR (``lop3``) per output -- 8 integer instructions (:mod:`.operand`)."""
    sch = SCHEMES[kind]
    rot = {0: w}
    for r in sch.rotations:
        rot[r] = rotr(w, r)
    outs = []
    for src in sch.sources:
        if len(src) == 1:
            outs.append(and_imm(rot[src[0]], sch.field_mask))
        else:
            outs.append(xor_and_imm(rot[src[0]], rot[src[1]], sch.field_mask))
    return outs


# ---------------------------------------------------------------------------------------------
# epilogue of one output element (fp32, the spec's order, one rounding at the store)
# ---------------------------------------------------------------------------------------------


def out_dtype_of(epilogue: EpilogueSpec):
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16,
            torch.float32: cutlass.Float32}[epilogue.out_dtype]


class Sm90KernelBase:
    """Fields and the element epilogue shared by the sm90 kernels."""

    unscale = DECODE_UNSCALE

    def init_common(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str, family: str,
                    arch: str = "sm_90a"):
        validate_config(config).raise_if_failed(f"sm90 {family} config")
        if why := arch_problem(config, arch):
            raise ValueError(f"{config.name()}: {why}")
        self.arch = arch
        self.bf16_mul = ARCH_CAPS[arch].bf16_mul
        if config.family != family:
            raise ValueError(f"config family {config.family!r} is not {family!r}")
        self.cfg = config
        self.epi = epilogue
        self.kind = x_format
        self.x_is_bf16 = x_format == "bf16"
        self.threads = 32 * config.num_warps
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.split_k = config.split_k
        self.gated = epilogue.activation == "silu_mul"
        self.feat_per_cta = self.tile_n // 2 if self.gated else self.tile_n
        self.out_dtype = out_dtype_of(epilogue)

    @cute.jit
    def splitk_sum(self, mWork: cute.Tensor, m: Int32, n_pad: Int32, tok: Int32, row: Int32, row_u: Int32):
        """The split-K partials of one output element (and its up row when gated) summed in split
        order from the fp32 workspace ``[split][M][n_pad]`` (L2 loads: other CTAs wrote them)."""
        vg = Float32(0.0)
        vu = Float32(0.0)
        wbase = mWork.iterator.toint()
        for sp in cutlass.range(self.split_k, unroll_full=True):
            o = Int64(sp * m + tok) * Int64(n_pad)
            vg = vg + ld_global_cg_f32(wbase + (o + Int64(row)) * 4)
            if cutlass.const_expr(self.gated):
                vu = vu + ld_global_cg_f32(wbase + (o + Int64(row_u)) * 4)
        return vg, vu

    def a_fragment(self, word: Int32, sp: Int32) -> tuple:
        """One prepared weight word -> the four A registers of its k-step: the exact decode, then
        rows g (o0, o2) times the scale of row g and rows g + 8 (o1, o3) times that of row g + 8
        (``sp``: the packed scale pair), ``E2M1 * s * 2**-7``."""
        o = decode_word(word, self.kind)
        bm = self.bf16_mul
        return (hmul2_bcast(o[0], sp, 0, self.x_is_bf16, bm), hmul2_bcast(o[1], sp, 1, self.x_is_bf16, bm),
                hmul2_bcast(o[2], sp, 0, self.x_is_bf16, bm), hmul2_bcast(o[3], sp, 1, self.x_is_bf16, bm))

    @cute.jit
    def split_range(self, n_chunks: Int32, bs: Int32):
        """(first stage, stages) of split ``bs``: the K range split in whole pipeline stages."""
        n_stage = n_chunks // self.U
        per = (n_stage + self.split_k - 1) // self.split_k
        st_lo = bs * per
        return st_lo, cutlass.max(cutlass.min(n_stage, st_lo + per) - st_lo, 0)

    @cute.jit
    def weight_lanes(self, mW: cute.Tensor, mS: cute.Tensor, bx: Int32, warp: Int32, lane: Int32, n_tiles: Int32,
                     tile_offset=None):
        """Loop invariants of this lane's weight stream: its weight / scale row pointers per row tile
        (clamped to the last tile: loads stay in bounds; ``tile_offset``: the first row tile of the
        operand's block, e.g. an expert's in a stacked weight) and its shared-memory offsets in a stage."""
        gw = []
        gs = []
        for rt in cutlass.range_constexpr(self.RT):
            t = cutlass.min(self.tile_of(bx, warp, rt, n_tiles), n_tiles - 1)
            if cutlass.const_expr(tile_offset is not None):
                t = t + tile_offset
            gw.append(pinned_i64(mW.iterator.toint() + Int64(t) * Int64(mW.stride[0]) + Int64(lane * 16)))
            gs.append(pinned_i64(mS.iterator.toint() + Int64(t) * Int64(mS.stride[0]) + Int64(lane * 8)))
        sw_off = pinned_i32((warp * self.RT * self.U) * 512 + lane * 16)
        ss_off = pinned_i32(self.off_s + warp * self.RT * (64 * self.U) + lane * (2 * self.U))
        return gw, gs, sw_off, ss_off

    @cute.jit
    def scale_words(self, base: Int32, ss_off: Int32) -> list:
        """This lane's scale words of the stage at ``base``, per row tile (2 chunks per word)."""
        sw = []
        for rt in cutlass.range_constexpr(self.RT):
            sa = base + ss_off + rt * (64 * self.U)
            if cutlass.const_expr(self.U == 2):
                sw.append([lds_u32(sa)])
            else:
                sw.append(lds_v2(sa))
        return sw

    @cute.jit
    def produce_weights(self, sbase: Int32, st: Int32, gw: list, gs: list, sw_off: Int32, ss_off: Int32,
                        policy: Int64):
        """cp.async the weight vectors and scale words of global stage ``st`` into the ring slot at
        ``sbase`` (``gw`` / ``gs``: this lane's weight / scale row pointers; ``sw_off`` / ``ss_off``:
        its loop-invariant shared-memory offsets)."""
        U = self.U
        c0 = st * U  # first chunk of the stage
        koff = Int64(c0) * 512
        # scale words: [chunk // 4][lane][8 bytes]; a stage of 2 chunks is one 4-byte half
        soff = Int64(c0 // 4) * 256 + Int64((c0 % 4) // 2) * 4
        for rt in cutlass.range_constexpr(self.RT):
            for u in cutlass.range_constexpr(U):
                cp_async_stream(sbase + sw_off + (rt * U + u) * 512, gw[rt] + koff + u * 512, policy)
            cp_async_small(sbase + ss_off + rt * (64 * U), gs[rt] + soff, policy, 2 * U)

    @cute.jit
    def store_fragments(self, acc: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor,
                        mOut: cute.Tensor, bx: Int32, warp: Int32, g: Int32, q: Int32, m: Int32, m0: Int32,
                        n_tiles: Int32, n_out: Int32, from_work: bool, mWork: cute.Tensor, m_all: Int32,
                        n_pad: Int32):
        """Epilogue of this lane's accumulator fragments, the ``m16n8`` C layout per 16-row tile and
        8 tokens (both families: ``acc[(rt * m_groups + mg) * 4 + i]`` = row ``g + 8 (i // 2)`` of
        row tile ``rt``, token ``8 mg + 2 q + i % 2``). ``from_work``: the values are the sum of the
        split-K partials in split order. Needs ``self.tile_of(bx, warp, rt, n_tiles)``."""
        RT, MG = self.RT, self.MG
        n_rt = RT // 2 if self.gated else RT
        for rt in cutlass.range_constexpr(n_rt):
            t = self.tile_of(bx, warp, rt, n_tiles)
            tu = self.tile_of(bx, warp, rt + n_rt, n_tiles) if self.gated else t
            for mg in cutlass.range_constexpr(MG):
                for i in cutlass.range_constexpr(4):
                    tok = m0 + mg * 8 + 2 * q + i % 2
                    row = t * 16 + g + 8 * (i // 2)
                    row_u = tu * 16 + g + 8 * (i // 2)
                    feat = row
                    if (tok < m) & (feat < n_out) & (t < n_tiles):
                        vg = acc[(rt * MG + mg) * 4 + i]
                        vu = Float32(0.0)
                        if cutlass.const_expr(self.gated):
                            vu = acc[((rt + n_rt) * MG + mg) * 4 + i]
                        if cutlass.const_expr(from_work):
                            vg, vu = self.splitk_sum(mWork, m_all, n_pad, tok, row, row_u)
                        self.store_epilogue(mAlpha, mBias, mRes, mOut, tok, feat, row, vg, row_u, vu)

    @cute.jit
    def finish(self, acc: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor,
               mOut: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor, bx: Int32, bs: Int32, bm: Int32,
               warp: Int32, g: Int32, q: Int32, m: Int32, m0: Int32, n_tiles: Int32, n_out: Int32, n_pad: Int32,
               flag_addr: Int32, tidx: Int32, tile_index: Int32, reduce=None):
        """After the main loop: drain the copy ring, let PDL dependents launch, then the epilogue --
        or, for a CTA that computed split-K part ``bs`` of its tile (every CTA when ``split_k > 1``
        and ``reduce`` is None; else where the runtime predicate ``reduce`` holds), its fp32 partials
        to the workspace ``[split][M][n_pad]`` and the epilogue by the CTA that arrives last at the
        tile's counter ``tile_index``."""
        cp_async_wait(0)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(self.split_k == 1):
            self.store_fragments(acc, mAlpha, mBias, mRes, mOut, bx, warp, g, q, m, m0, n_tiles, n_out, False,
                                 mWork, Int32(0), n_pad)
        elif cutlass.const_expr(reduce is None):
            self.reduce_partials(acc, mAlpha, mBias, mRes, mOut, mWork, mCount, bx, bs, warp, g, q, m, m0, n_tiles,
                                 n_out, n_pad, flag_addr, tidx, tile_index)
        else:
            if reduce:
                self.reduce_partials(acc, mAlpha, mBias, mRes, mOut, mWork, mCount, bx, bs, warp, g, q, m, m0,
                                     n_tiles, n_out, n_pad, flag_addr, tidx, tile_index)
            else:
                self.store_fragments(acc, mAlpha, mBias, mRes, mOut, bx, warp, g, q, m, m0, n_tiles, n_out, False,
                                     mWork, Int32(0), n_pad)

    @cute.jit
    def reduce_partials(self, acc: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor,
                        mOut: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor, bx: Int32, bs: Int32,
                        warp: Int32, g: Int32, q: Int32, m: Int32, m0: Int32, n_tiles: Int32, n_out: Int32,
                        n_pad: Int32, flag_addr: Int32, tidx: Int32, tile_index: Int32):
        """Split-K part ``bs``: partials to the workspace, fence + counter; the last CTA of the tile
        sums the ``split_k`` partials in split order and runs the epilogue (deterministic)."""
        for rt in cutlass.range_constexpr(self.RT):
            t = self.tile_of(bx, warp, rt, n_tiles)
            for mg in cutlass.range_constexpr(self.MG):
                for i in cutlass.range_constexpr(4):
                    tok = m0 + mg * 8 + 2 * q + i % 2
                    row = t * 16 + g + 8 * (i // 2)
                    if (tok < m) & (t < n_tiles):
                        addr = mWork.iterator.toint() + (Int64(bs * m + tok) * Int64(n_pad) + Int64(row)) * 4
                        st_global_f32(addr, acc[(rt * self.MG + mg) * 4 + i])
        if splitk_arrive(mCount, tile_index, self.split_k, flag_addr, tidx) == 1:
            self.store_fragments(acc, mAlpha, mBias, mRes, mOut, bx, warp, g, q, m, m0, n_tiles, n_out, True,
                                 mWork, m, n_pad)

    @cute.jit
    def store_epilogue(self, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor, mOut: cute.Tensor,
                       mi: Int32, feat: Int32, row_g: Int32, acc_g: Float32, row_u: Int32, acc_u: Float32):
        """fp32 epilogue of one output element: unscale -> alpha -> bias -> activation (gated:
        silu(gate) * up) -> residual -> one rounding at the store."""
        y = acc_g * Float32(self.unscale)
        yu = acc_u * Float32(self.unscale)
        if cutlass.const_expr(self.epi.alpha == "scalar"):
            a = mAlpha[0]
            y = y * a
            yu = yu * a
        if cutlass.const_expr(self.epi.alpha == "vector"):
            y = y * mAlpha[row_g]
            if cutlass.const_expr(self.gated):
                yu = yu * mAlpha[row_u]
        if cutlass.const_expr(self.epi.bias):
            y = y + mBias[row_g]
            if cutlass.const_expr(self.gated):
                yu = yu + mBias[row_u]
        if cutlass.const_expr(self.gated):
            y = Activation("silu_mul").apply_gated(y, yu)
        if cutlass.const_expr(self.epi.activation in ("silu", "gelu_tanh")):
            y = Activation(self.epi.activation).apply(y)
        if cutlass.const_expr(self.epi.residual):
            y = y + mRes[mi, feat].to(Float32)
        mOut[mi, feat] = y.to(self.out_dtype)


# ---------------------------------------------------------------------------------------------
# registry contract
# ---------------------------------------------------------------------------------------------


def embedded_cubin(compiled) -> bytes:
    """The device binary (fatbin with the sm_90a cubin) embedded in a compiled function, for SASS
    inspection with ``cuobjdump --dump-sass`` (no GPU needed)."""
    for op in compiled.ir_module.body.operations:
        if op.operation.name == "llvm.mlir.global" and str(op.attributes["sym_name"]) == '"kernels_binary"':
            return bytes(op.attributes["value"].value_bytes)
    raise LookupError("no embedded kernels_binary in the compiled module")


def operand_args(spec: CompileSpec) -> dict:
    """The kernel arguments the sm90 W4A16 kernels share, by name (the dense templates' ABI and
    the grouped MoE kernel's, ``templates/sm90_moe/kernel.py``, pick theirs from here):
    activations ``mX``, prepared weights ``mW`` and scales ``mS`` (``templates/sm90_w4a16/operand.py``),
    per-column ``mAlpha`` / ``mBias``, residual ``mRes`` and output ``mOut`` in the epilogue's
    dtype, the split-K partials ``mWork`` and tile counters ``mCount``."""
    xdt = X_FORMATS[spec.a_format]
    odt = _TORCH_TO_ABI[spec.epilogue.out_dtype]
    oal = torch.finfo(spec.epilogue.out_dtype).bits // 8
    vec = {"shape": (SymDim(),), "stride": (1,), "assumed_align": 4}
    mat = {"shape": (SymDim(), SymDim()), "stride": (SymDim(1, 64), 1), "assumed_align": oal}
    return {
        "mX": TensorArg("mX", xdt, shape=(SymDim(), SymDim(32)), stride=(SymDim(8, 64), 1), assumed_align=16),
        "mW": TensorArg("mW", "Uint8", shape=(SymDim(), SymDim(2048)), stride=(SymDim(2048, 64), 1), assumed_align=16),
        "mS": TensorArg("mS", "Uint8", shape=(SymDim(), SymDim(256)), stride=(SymDim(256, 64), 1), assumed_align=16),
        "mAlpha": TensorArg("mAlpha", "Float32", **vec),
        "mBias": TensorArg("mBias", "Float32", **vec),
        "mRes": TensorArg("mRes", odt, **mat),
        "mOut": TensorArg("mOut", odt, **mat),
        "mWork": TensorArg("mWork", "Float32", **vec),
        "mCount": TensorArg("mCount", "Int32", **vec),
    }


class Sm90TemplateBase:
    """Registry entry shared by the sm90 W4A16 families (subclasses set the ids and kernel)."""

    template_id = ""
    config_type = Sm90W4A16Config
    archs = SM90_ARCHS
    family = ""
    kernel_class = None

    def gated_problem(self, c: Sm90W4A16Config) -> str | None:
        """Why ``c`` cannot hold whole gate and up halves for ``silu_mul`` (None: it can)."""
        return None

    def kernel_kwargs(self, spec: CompileSpec) -> dict:
        """Extra keyword arguments of the kernel class from the compile spec (its target arch)."""
        return {"arch": spec.arch}

    def can_implement(self, spec: CompileSpec) -> Status:
        c = spec.config
        if not isinstance(c, Sm90W4A16Config):
            return Status.fail(f"expects Sm90W4A16Config, got {type(c).__name__}")
        st = validate_config(c)
        if not st:
            return st
        if c.family != self.family:
            return Status.fail(f"family={c.family!r}: this template is the {self.family} family")
        if why := arch_problem(c, spec.arch):
            return Status.fail(why)
        if spec.a_format not in X_FORMATS:
            return Status.fail(f"a_format (activations) must be bf16 or fp16, got {spec.a_format}")
        if spec.b_format != "nvfp4" or spec.a_major != "k" or spec.b_major != "k":
            return Status.fail("weights must be nvfp4, both operands K-major")
        if spec.epilogue.gated and (why := self.gated_problem(c)):
            return Status.fail(why)
        if spec.epilogue.alpha == "none":
            return Status.fail("weight-only NVFP4 always has a global scale: alpha must be scalar or vector")
        return Status.success()

    def abi(self, spec: CompileSpec):
        a = operand_args(spec)
        return (a["mX"], a["mW"], a["mS"], a["mAlpha"], a["mBias"], a["mRes"], a["mOut"], a["mWork"], a["mCount"],
                StreamArg("stream"))

    def compile(self, spec: CompileSpec, *, keep_ptx: bool = False):
        """``cute.compile`` for ``spec.arch`` (no GPU). With ``keep_ptx`` (and ``CUTE_DSL_DUMP_DIR``
        set) the result's ``__ptx__`` holds the PTX text."""
        self.can_implement(spec).raise_if_failed(spec.name())
        kernel = self.kernel_class(spec.config, spec.epilogue, spec.a_format, **self.kernel_kwargs(spec))
        return compile_for_target(kernel, fake_args(self.abi(spec)), spec, "--keep-ptx" if keep_ptx else "")


__all__ = [
    "X_FORMATS",
    "operand_args",
    "Sm90KernelBase",
    "Sm90TemplateBase",
    "WGMMA_DESC_SW128_KMAJOR",
    "cp_async_small4",
    "decode_word",
    "embedded_cubin",
    "fence_proxy_async_smem",
    "fence_regs",
    "fadd_rn",
    "fmul_rn",
    "pair_to_f32",
    "splitk_arrive",
    "hmul2",
    "i32",
    "mma_16816",
    "scale_pair",
    "smem_desc_sw128",
    "wgmma_rs",
]
