"""sm_90a NVFP4 weight-only (W4A16) GEMV family: the small-M (1..32) bandwidth kernel, in CuTeDSL.

    out[m, f] = epilogue( alpha * sum_k x[m, k] * E2M1[q[n, k]] * s[n, k // 16] )

Decode at small M is a stream over the weight (0.5625 bytes per element); this kernel keeps that
stream as wide and as deep as it can and does everything else in registers.

Operands (what :mod:`nvgemm.runtime.sm90_launch` prepares once, at weight-load time)
--------------------------------------------------------------------------------
* ``mW``  uint8 ``[N, K/2]``: the packed E2M1 codes, K-contiguous rows, **bit-permuted inside each
  32-bit word** (8 elements) so that each pair of elements decodes to an fp16x2 register with one
  or two shift/mask operations (see :data:`nvgemm.templates.sm90_config.WORD_LAYOUT`; :func:`nvgemm.runtime.sm90_launch.relayout_weight`
  writes it and ``restore_weight`` is its exact inverse). Rows are not reordered, so each warp's
  16-byte loads of one row are contiguous: 512 bytes per warp per load, fully coalesced.
* ``mS``  uint8 ``[N, K/16]``: the e4m3 block scales in the **linear** row-major layout (the op's
  128x4 swizzled layout unswizzled once); the two scales of one 16-byte weight vector are one
  aligned 2-byte load, contiguous across the warp.
* ``mX``  bf16/fp16 ``[M, K]`` activations (row stride dynamic, K contiguous).
* ``mAlpha`` fp32 ``(1,)`` or ``(N,)``: ``weight_scale_2`` (times ``input_scale`` for W4A4 layers,
  whose activations the runtime quantize-dequantizes first).
* ``mBias`` fp32 ``(N,)``, ``mRes`` ``[M, N_out]`` in the output dtype, ``mOut`` ``[M, N_out]``;
  ``mWork`` fp32 ``(split_k * M * N,)`` when ``split_k > 1``.

Decode (exact)
--------------
An E2M1 nibble ``s e1 e0 m`` placed at fp16 bits 15 and 11..9 is the fp16 number
``E2M1 * 2**-14`` (``e1e0 = 0`` lands on fp16 subnormals, which the conversion keeps), so each
element costs a share of one shift/and plus one ``cvt.f32.f16``; both are exact. A 16-element
block is summed in fp32 (``sum code*x``) and folded into the accumulator with its scale:
``acc += bsum * (float(e4m3) )``; the 2**14 is restored, exactly, in the epilogue. Everything
after the loads is fp32, so the only difference to the emulated op is the summation order.

Work decomposition
------------------
* CTA = ``num_warps`` warps that split K. The CTA's ``tile_n`` weight rows x ``tile_m`` activation
  rows are walked in register passes of ``RP = max(1, 8 // tile_m)`` weight rows x ``MP =
  min(tile_m, 4)`` activation rows (:func:`~nvgemm.templates.sm90_config.gemv_passes`); each pass
  streams its rows' K range. Per main-loop step a thread handles ``U = tile_k / (32 * threads)``
  16-byte vectors (32 elements each) of each of the pass's rows: all ``U * RP`` weight loads
  (``ld.global.nc.L1::no_allocate.v4``), their scale loads and the activation loads of the step
  are issued before the first use, and each activation vector is converted once and reused for
  the RP rows.
* grid = (ceil(N_out / features per CTA), split_k, ceil(M / tile_m)); ``split_k > 1`` splits K
  across CTAs: partial sums go to ``mWork`` (no atomics), and a second kernel sums the splits in a
  fixed order and runs the epilogue (deterministic).
* End of each pass: warp butterfly reduction, then a fixed-order sum across warps through shared
  memory into the CTA's ``tile_n x tile_m`` totals; then the epilogue
  (:class:`Sm90EpilogueMixin`, with the :mod:`nvgemm.epilogues.cute_apply` activations: alpha ->
  bias -> activation -> residual, fp32, one rounding at the store).
* ``silu_mul`` (gated): a CTA takes ``tile_n/2`` gate rows and the matching ``tile_n/2`` up rows
  (``n`` and ``n + N/2``), so the gate and the up of one output feature meet in one CTA.

Cost model (from the SASS, M = 1): ~3.9 issued instructions per weight element (fp16->fp32
conversion, shift/mask decode, FFMA), i.e. an issue floor of the same size as the HBM floor on an
H200; for tile_m >= 8 the scalar FMAs dominate and the WGMMA family should take over (to be
measured: ``bench/gpu_check.py``).

Constraints (:func:`~nvgemm.templates.sm90_config.validate_config` and ``can_implement``): K % 32
== 0 at run time (16-byte rows), ``tile_k = 32 * threads * U`` with U in 1..4 within a register
budget, ``tile_n`` a multiple of 8 (even halves when gated), bf16/fp16 activations.

This module imports cutlass; it is imported only when a kernel is compiled (never at
``import nvgemm``), through :data:`nvgemm.templates.registry.BUILTIN_TEMPLATE_MODULES`.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import arith, llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from nvgemm.epilogues.cute_apply import Activation
from nvgemm.epilogues.spec import EpilogueSpec

from .registry import (
    CompileSpec,
    ScalarArg,
    StreamArg,
    SymDim,
    TensorArg,
    compile_for_target,
    fake_args,
    register_template,
)
from .sm90_config import DECODE_UNSCALE, SM90_ARCHS, WORD_LAYOUT, Sm90W4A16Config, gemv_passes, validate_config
from .status import Status

_TORCH_TO_ABI = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}
_X_FORMATS = {"bf16": "BFloat16", "fp16": "Float16"}

_M32 = 0xFFFFFFFF


def _i32(v: int) -> int:
    """A 32-bit mask as a signed Python int (DSL Int32 constants)."""
    v &= _M32
    return v - (1 << 32) if v & 0x80000000 else v


# ---------------------------------------------------------------------------------------------
# PTX helpers (one instruction each; inline PTX so the width and cache policy are explicit)
# ---------------------------------------------------------------------------------------------


def _asm(ret_type, operands, text, constraints, loc, ip):
    return llvm.inline_asm(
        ret_type,
        operands,
        text,
        constraints,
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


def _ld_v4(addr: Int64, ins: str, loc, ip):
    """One 16-byte load ``ins {4 x b32}, [addr]`` -> four 32-bit words."""
    st = llvm.StructType.get_literal([T.i32()] * 4)
    r = _asm(st, [Int64(addr).ir_value(loc=loc, ip=ip)], f"{ins} {{$0, $1, $2, $3}}, [$4];", "=r,=r,=r,=r,l", loc, ip)
    return [Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_stream_v4(addr: Int64, *, loc=None, ip=None):
    """16-byte read-only load that bypasses L1 (the weight stream is read exactly once)."""
    return _ld_v4(addr, "ld.global.nc.L1::no_allocate.v4.b32", loc, ip)


@dsl_user_op
def ld_cached_v4(addr: Int64, *, loc=None, ip=None):
    """16-byte read-only load through L1 (activations: re-read by every CTA)."""
    return _ld_v4(addr, "ld.global.nc.v4.b32", loc, ip)


def ld_cached_x64(addr: Int64):
    """64 bytes (32 bf16/fp16 activations) as four 16-byte loads through L1 -> 16 words, in order."""
    return ld_cached_v4(addr) + ld_cached_v4(addr + 16) + ld_cached_v4(addr + 32) + ld_cached_v4(addr + 48)


@dsl_user_op
def ld_stream_u16(addr: Int64, *, loc=None, ip=None) -> Int32:
    """2-byte read-only load (the two e4m3 scales of one 16-byte weight vector), zero-extended."""
    r = _asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
             "{ .reg .b16 t; ld.global.nc.L1::no_allocate.b16 t, [$1]; cvt.u32.u16 $0, t; }", "=r,l", loc, ip)
    return Int32(r)


@dsl_user_op
def e4m3x2_to_f32x2(v: Int32, *, loc=None, ip=None):
    """Two e4m3 bytes (low 16 bits of v) -> two fp32 (exact; ``cvt.rn.f16x2.e4m3x2`` is sm_89+)."""
    st = llvm.StructType.get_literal([T.f32()] * 2)
    r = _asm(st, [Int32(v).ir_value(loc=loc, ip=ip)],
             "{ .reg .b16 b, lo, hi; .reg .b32 h; cvt.u16.u32 b, $2; cvt.rn.f16x2.e4m3x2 h, b; "
             "mov.b32 {lo, hi}, h; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }", "=f,=f,r", loc, ip)
    return Float32(llvm.extractvalue(T.f32(), r, [0], loc=loc, ip=ip)), Float32(
        llvm.extractvalue(T.f32(), r, [1], loc=loc, ip=ip))


@dsl_user_op
def f16x2_to_f32x2(v: Int32, *, loc=None, ip=None):
    """fp16x2 register -> (low, high) fp32 (exact, subnormals kept)."""
    st = llvm.StructType.get_literal([T.f32()] * 2)
    r = _asm(st, [Int32(v).ir_value(loc=loc, ip=ip)],
             "{ .reg .f16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }",
             "=f,=f,r", loc, ip)
    return Float32(llvm.extractvalue(T.f32(), r, [0], loc=loc, ip=ip)), Float32(
        llvm.extractvalue(T.f32(), r, [1], loc=loc, ip=ip))


@dsl_user_op
def bits_to_f32(v: Int32, *, loc=None, ip=None) -> Float32:
    return Float32(arith.bitcast(T.f32(), Int32(v).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@cute.jit
def bf16x2_to_f32x2(v: Int32):
    """bf16x2 register -> (low, high) fp32: a bf16 is the top half of its fp32."""
    return bits_to_f32(v << 16), bits_to_f32(v & Int32(_i32(0xFFFF0000)))


@cute.jit
def decode_word(w: Int32):
    """One re-laid-out weight word (8 E2M1 codes) -> four fp16x2 registers E2M1 * 2**-14, in K order."""
    mask_full = Int32(_i32(0x8E008E00))
    mask_mag = Int32(_i32(0x0E000E00))
    mask_sgn = Int32(_i32(0x80008000))
    h0 = w & mask_full
    h1 = (w << 3) & mask_full
    h2 = ((w << 9) & mask_mag) | ((w << 2) & mask_sgn)
    h3 = ((w << 6) & mask_mag) | ((w << 1) & mask_sgn)
    return h0, h1, h2, h3


def decode_word_f32(w: Int32):
    """One re-laid-out weight word -> its 8 elements as fp32 ``E2M1 * 2**-14``, in K order."""
    vals = []
    for h in decode_word(w):
        lo, hi = f16x2_to_f32x2(h)
        vals.append(lo)
        vals.append(hi)
    return vals


def x_to_f32x2(v: Int32, is_bf16: bool):
    """An activation register (bf16x2 or f16x2) -> (low, high) fp32, exact."""
    return bf16x2_to_f32x2(v) if is_bf16 else f16x2_to_f32x2(v)


# ---------------------------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------------------------


def out_dtype_of(epilogue: EpilogueSpec):
    """The cutlass dtype of the output (and residual) tensors of an epilogue spec."""
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16,
            torch.float32: cutlass.Float32}[epilogue.out_dtype]


class Sm90EpilogueMixin:
    """What the sm90 W4A16 kernels share: the common fields (:meth:`init_common`), the host launch
    with the fixed-order split-K reduce (:meth:`__call__`, :meth:`launch_reduce`), the CTA's weight
    row -> (GEMM row, feature) map (:meth:`gemm_row`) and the fp32 epilogue of the CTA's tile
    (:meth:`store_tile`, :meth:`store_epilogue`; needs ``self.epi``, ``self.gated``,
    ``self.out_dtype``). Accumulators arrive as ``sum E2M1 * 2**-14 * s * x`` (gemv) or already
    scaled (``unscale=1``)."""

    unscale = DECODE_UNSCALE

    def init_common(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str, family: str):
        """Validate ``config`` and set the fields every family uses."""
        validate_config(config).raise_if_failed(f"sm90 {family} config")
        self.cfg = config
        self.epi = epilogue
        self.x_is_bf16 = x_format == "bf16"
        self.threads = 32 * config.num_warps
        self.tile_m = config.tile_m
        self.tile_n = config.tile_n
        self.split_k = config.split_k
        self.gated = epilogue.activation == "silu_mul"
        self.feat_per_cta = self.tile_n // 2 if self.gated else self.tile_n
        self.out_dtype = out_dtype_of(epilogue)

    def use_gemv_reduce(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str):
        """Take the gemv family's fixed-order split-K reduce kernel, told that these partials carry
        no 2**-14 decode factor (the tensor-core families)."""
        reducer = Sm90W4A16GemvKernel(Sm90W4A16Config(split_k=max(2, config.split_k)), epilogue, x_format)
        reducer.unscale = 1.0
        self.reduce_kernel = reducer.reduce_kernel

    # ----------------------------------------------------------------------------- host
    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mS: cute.Tensor,
        mAlpha: cute.Tensor,
        mBias: cute.Tensor,
        mRes: cute.Tensor,
        mOut: cute.Tensor,
        mWork: cute.Tensor,
        stream: cuda.CUstream,
    ):
        m = mX.shape[0]
        n_out = mOut.shape[1]
        grid_n = (n_out + self.feat_per_cta - 1) // self.feat_per_cta
        grid_m = (m + self.tile_m - 1) // self.tile_m
        self.kernel(mX, mW, mS, mAlpha, mBias, mRes, mOut, mWork).launch(
            grid=(grid_n, self.split_k, grid_m), block=(self.threads, 1, 1), stream=stream
        )
        self.launch_reduce(mX, mW, mAlpha, mBias, mRes, mOut, mWork, stream)

    @cute.jit
    def launch_reduce(self, mX: cute.Tensor, mW: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor,
                      mRes: cute.Tensor, mOut: cute.Tensor, mWork: cute.Tensor, stream: cuda.CUstream):
        """With ``split_k > 1``: the fixed-order reduce + epilogue over the workspace, after the main kernel."""
        if cutlass.const_expr(self.split_k > 1):
            m = mX.shape[0]
            n = mW.shape[0]
            n_out = mOut.shape[1]
            total = m * n_out
            self.reduce_kernel(mAlpha, mBias, mRes, mOut, mWork, n).launch(
                grid=((total + 127) // 128, 1, 1), block=(128, 1, 1), stream=stream
            )

    # ----------------------------------------------------------------------------- device helpers
    @cute.jit
    def gemm_row(self, n_out: Int32, bx: Int32, r: Int32):
        """(GEMM row, output feature) of the CTA's r-th weight row (gate rows then up rows when gated)."""
        if cutlass.const_expr(self.gated):
            h = self.tile_n // 2
            feat = bx * h + r % h
            row = feat + (r // h) * n_out
        else:
            feat = bx * self.tile_n + r
            row = feat
        return row, feat

    def operand_bases(self, mX: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor):
        """Base addresses and row strides in bytes of the activations, packed weights and scales:
        ``(x_base, w_base, s_base, x_rs, w_rs, s_rs)``."""
        return (mX.iterator.toint(), mW.iterator.toint(), mS.iterator.toint(),
                Int64(mX.stride[0]) * 2, Int64(mW.stride[0]), Int64(mS.stride[0]))

    @cute.jit
    def split_range(self, total: Int32, bs: Int32, step: int):
        """Split ``bs``'s share ``[lo, hi)`` of ``total`` K units (vectors, chunks, tiles) and the
        number of main-loop steps of ``step`` units that cover it (0 for an empty share)."""
        per_split = (total + self.split_k - 1) // self.split_k
        lo = bs * per_split
        hi = cutlass.min(total, lo + per_split)
        n_iter = (hi - lo + step - 1) // step
        if hi <= lo:
            n_iter = 0
        return lo, hi, n_iter

    def tile_coord(self, i: Int32, rows: int):
        """Element i of a CTA tile of ``rows`` weight rows x ``tile_m`` activation rows -> (r, mi),
        activation rows fastest."""
        return i // self.tile_m, i % self.tile_m

    @cute.jit
    def store_tile(self, sTot: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor,
                   mOut: cute.Tensor, mWork: cute.Tensor, m: Int32, n: Int32, n_out: Int32,
                   tidx: Int32, bx: Int32, bs: Int32, bm: Int32):
        """The CTA's fp32 totals ``sTot[r, mi]`` (r: its ``tile_n`` weight rows, gate then up when
        gated; mi: its ``tile_m`` activation rows) -> the epilogue, or with ``split_k > 1`` raw
        partials to the workspace. Threads walk the tile in :meth:`tile_coord` order."""
        TM = self.tile_m
        if cutlass.const_expr(self.split_k == 1):
            n_feat = self.feat_per_cta
            for i in cutlass.range(tidx, n_feat * TM, self.threads):
                r, mi = self.tile_coord(i, n_feat)
                m_glob = bm * TM + mi
                feat = bx * n_feat + r
                if m_glob < m and feat < n_out:
                    if cutlass.const_expr(self.gated):
                        self.store_epilogue(mAlpha, mBias, mRes, mOut, m_glob, feat, feat, sTot[r, mi],
                                            feat + n_out, sTot[r + n_feat, mi])
                    else:
                        self.store_epilogue(mAlpha, mBias, mRes, mOut, m_glob, feat, feat, sTot[r, mi],
                                            feat, Float32(0.0))
        else:
            for i in cutlass.range(tidx, self.tile_n * TM, self.threads):
                r, mi = self.tile_coord(i, self.tile_n)
                m_glob = bm * TM + mi
                row, feat = self.gemm_row(n_out, bx, r)
                if m_glob < m and feat < n_out:
                    mWork[(bs * m + m_glob) * n + row] = sTot[r, mi]

    @cute.jit
    def store_epilogue(self, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor, mOut: cute.Tensor,
                       mi: Int32, feat: Int32, row_g: Int32, acc_g: Float32, row_u: Int32, acc_u: Float32):
        """fp32 epilogue of one output element, in the spec's order; one rounding at the store."""
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


class Sm90W4A16GemvKernel(Sm90EpilogueMixin):
    """Small-M NVFP4 weight-only GEMV for sm_90a (see the module docstring)."""

    def __init__(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str = "bf16"):
        self.init_common(config, epilogue, x_format, "gemv")
        self.vec_per_thread = config.tile_k // (32 * self.threads)  # U
        # register budget: a pass holds RP weight rows x MP activation rows of fp32 operands
        self.rows_per_pass, self.m_per_pass = gemv_passes(config)

    # ----------------------------------------------------------------------------- main kernel
    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mW: cute.Tensor,
        mS: cute.Tensor,
        mAlpha: cute.Tensor,
        mBias: cute.Tensor,
        mRes: cute.Tensor,
        mOut: cute.Tensor,
        mWork: cute.Tensor,
    ):
        TM = self.tile_m
        TN = self.tile_n
        RP = self.rows_per_pass
        MP = self.m_per_pass
        U = self.vec_per_thread
        NT = self.threads
        NWARP = self.cfg.num_warps

        tidx, _, _ = cute.arch.thread_idx()
        bx, bs, bm = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32

        m = mX.shape[0]
        k = mX.shape[1]
        n = mW.shape[0]
        n_out = mOut.shape[1]
        kv = k // 32  # 16-byte weight vectors per row

        x_base, w_base, s_base, x_rs, w_rs, s_rs = self.operand_bases(mX, mW, mS)
        v_lo, v_hi, n_iter = self.split_range(kv, bs, NT * U)  # K range of this split (in vectors)

        smem = cutlass.memory.SmemAllocator()
        sRed = smem.allocate_tensor(Float32, cute.make_layout((RP * MP, NWARP), stride=(NWARP, 1)), 16)
        sTot = smem.allocate_tensor(Float32, cute.make_layout((TN, TM), stride=(TM, 1)), 16)

        for pw in cutlass.range(TN // RP, unroll=1):
          for mp in cutlass.range(TM // MP, unroll=1):
            # weight rows of this pass (clamped rows: loads stay in bounds, results are dropped)
            w_row = []
            s_row = []
            for rr in cutlass.range_constexpr(RP):
                row, feat = self.gemm_row(n_out, bx, pw * RP + rr)
                rc = cutlass.min(row, n - 1)
                w_row.append(w_base + Int64(rc) * w_rs)
                s_row.append(s_base + Int64(rc) * s_rs)
            x_row = []
            for mi in cutlass.range_constexpr(MP):
                mc = cutlass.min(bm * TM + mp * MP + mi, m - 1)
                x_row.append(x_base + Int64(mc) * x_rs)

            acc = cute.make_rmem_tensor((RP * MP,), Float32)
            acc.fill(0.0)
            for it in cutlass.range(n_iter, unroll=1):
                base = v_lo + it * (NT * U)
                # ---- issue every load of the step before the first use
                wv = []
                sv = []
                xv = []
                ok = []
                for u in cutlass.range_constexpr(U):
                    v = base + u * NT + tidx
                    ok.append(v < v_hi)
                    vc = Int64(cutlass.min(v, kv - 1))
                    for rr in cutlass.range_constexpr(RP):
                        wv.append(ld_stream_v4(w_row[rr] + vc * 16))
                        sv.append(ld_stream_u16(s_row[rr] + vc * 2))
                    for mi in cutlass.range_constexpr(MP):
                        xv.append(ld_cached_x64(x_row[mi] + vc * 64))
                # ---- decode + fp32 FMAs
                for u in cutlass.range_constexpr(U):
                    for blk in cutlass.range_constexpr(2):
                        # activations of this 16-element block, fp32 (shared by all RP rows)
                        xf = []
                        for mi in cutlass.range_constexpr(MP):
                            words = xv[u * MP + mi]
                            vals = []
                            for j in cutlass.range_constexpr(8):
                                lo, hi = x_to_f32x2(words[blk * 8 + j], self.x_is_bf16)
                                vals.append(lo)
                                vals.append(hi)
                            xf.append(vals)
                        for rr in cutlass.range_constexpr(RP):
                            sc0, sc1 = e4m3x2_to_f32x2(sv[u * RP + rr])
                            sc = sc0
                            if cutlass.const_expr(blk == 1):
                                sc = sc1
                            wf = []
                            for wi in cutlass.range_constexpr(2):
                                wf += decode_word_f32(wv[u * RP + rr][blk * 2 + wi])
                            for mi in cutlass.range_constexpr(MP):
                                bsum = wf[0] * xf[mi][0]
                                for e in cutlass.range_constexpr(1, 16):
                                    bsum = bsum + wf[e] * xf[mi][e]
                                part = Float32(cutlass.select_(ok[u], bsum * sc, Float32(0.0)))
                                acc[rr * MP + mi] = acc[rr * MP + mi] + part

            # ---- CTA reduction of this pass: warp butterfly, then across warps (fixed order)
            for i in cutlass.range_constexpr(RP * MP):
                v = cute.arch.warp_reduction(acc[i], lambda a, b: a + b)
                if lane == 0:
                    sRed[i, warp] = v
            cute.arch.sync_threads()
            if tidx < RP * MP:
                t = sRed[tidx, 0]
                for w in cutlass.range_constexpr(1, NWARP):
                    t = t + sRed[tidx, w]
                sTot[pw * RP + tidx // MP, mp * MP + tidx % MP] = t
            cute.arch.sync_threads()

        # ---- epilogue (or raw partials to the split-K workspace)
        self.store_tile(sTot, mAlpha, mBias, mRes, mOut, mWork, m, n, n_out, tidx, bx, bs, bm)

    # ----------------------------------------------------------------------------- split-K reduce
    @cute.kernel
    def reduce_kernel(self, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor, mOut: cute.Tensor,
                      mWork: cute.Tensor, n: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        m = mOut.shape[0]
        n_out = mOut.shape[1]
        i = bx * 128 + tidx
        if i < m * n_out:
            mi = i // n_out
            feat = i % n_out
            g = Float32(0.0)
            u = Float32(0.0)
            for s in cutlass.range(self.split_k, unroll_full=True):
                g = g + mWork[(s * m + mi) * n + feat]
                if cutlass.const_expr(self.gated):
                    u = u + mWork[(s * m + mi) * n + feat + n_out]
            self.store_epilogue(mAlpha, mBias, mRes, mOut, mi, feat, feat, g, feat + n_out, u)


# ---------------------------------------------------------------------------------------------
# Template (registry contract)
# ---------------------------------------------------------------------------------------------


def epilogue_abi_dtype(spec: EpilogueSpec) -> str:
    return _TORCH_TO_ABI[spec.out_dtype]


class Sm90W4A16GemvTemplate:
    """Registry entry of the gemv family (``template_id = "sm90_w4a16_gemv"``).

    C ABI, in order: ``mX [M, K] (bf16|fp16)``, ``mW uint8 [N, K/2]``, ``mS uint8 [N, K/16]``,
    ``mAlpha fp32 (1|N,)``, ``mBias fp32 (N,)``, ``mRes [M, N_out]``, ``mOut [M, N_out]``,
    ``mWork fp32 (S*M*N,)``, ``stream``. Bias / residual / workspace are always present in the ABI
    (a 1-element dummy when the spec does not use them) so every variant has one calling convention.
    """

    template_id = "sm90_w4a16_gemv"
    config_type = Sm90W4A16Config
    archs = SM90_ARCHS
    family = "gemv"
    kernel_class = Sm90W4A16GemvKernel

    def gated_tile_n_problem(self, tile_n: int) -> str | None:
        """Why ``tile_n`` cannot hold whole gate and up halves for ``silu_mul`` (None: it can)."""
        return f"silu_mul needs an even tile_n, got {tile_n}" if tile_n % 2 else None

    def can_implement(self, spec: CompileSpec) -> Status:
        c = spec.config
        if not isinstance(c, Sm90W4A16Config):
            return Status.fail(f"expects Sm90W4A16Config, got {type(c).__name__}")
        st = validate_config(c)
        if not st:
            return st
        if c.family != self.family:
            return Status.fail(f"family={c.family!r}: this template is the {self.family} family")
        if spec.arch not in SM90_ARCHS:
            return Status.fail(f"arch {spec.arch} is not one of {SM90_ARCHS}")
        if spec.a_format not in _X_FORMATS:
            return Status.fail(f"a_format (activations) must be bf16 or fp16, got {spec.a_format}")
        if spec.b_format != "nvfp4" or spec.a_major != "k" or spec.b_major != "k":
            return Status.fail("weights must be nvfp4, both operands K-major")
        if spec.epilogue.gated and (why := self.gated_tile_n_problem(c.tile_n)):
            return Status.fail(why)
        if spec.epilogue.alpha == "none":
            return Status.fail("weight-only NVFP4 always has a global scale: alpha must be scalar or vector")
        return Status.success()

    def abi(self, spec: CompileSpec):
        xdt = _X_FORMATS[spec.a_format]
        odt = epilogue_abi_dtype(spec.epilogue)
        return (
            TensorArg("mX", xdt, shape=(SymDim(), SymDim(32)), stride=(SymDim(8, 64), 1), assumed_align=16),
            TensorArg("mW", "Uint8", shape=(SymDim(), SymDim(16)), stride=(SymDim(16, 64), 1), assumed_align=16),
            TensorArg("mS", "Uint8", shape=(SymDim(), SymDim(2)), stride=(SymDim(2, 64), 1), assumed_align=2),
            TensorArg("mAlpha", "Float32", shape=(SymDim(),), stride=(1,), assumed_align=4),
            TensorArg("mBias", "Float32", shape=(SymDim(),), stride=(1,), assumed_align=4),
            TensorArg("mRes", odt, shape=(SymDim(), SymDim()), stride=(SymDim(1, 64), 1),
                      assumed_align=torch.finfo(spec.epilogue.out_dtype).bits // 8),
            TensorArg("mOut", odt, shape=(SymDim(), SymDim()), stride=(SymDim(1, 64), 1),
                      assumed_align=torch.finfo(spec.epilogue.out_dtype).bits // 8),
            TensorArg("mWork", "Float32", shape=(SymDim(),), stride=(1,), assumed_align=4),
            StreamArg("stream"),
        )

    def compile(self, spec: CompileSpec, *, keep_ptx: bool = False):
        """``cute.compile`` for ``spec.arch`` (no GPU). With ``keep_ptx`` (and ``CUTE_DSL_DUMP_DIR``
        set) the result's ``__ptx__`` holds the PTX text."""
        self.can_implement(spec).raise_if_failed(spec.name())
        kernel = self.kernel_class(spec.config, spec.epilogue, spec.a_format)
        return compile_for_target(kernel, fake_args(self.abi(spec)), spec, "--keep-ptx" if keep_ptx else "")


def embedded_cubin(compiled) -> bytes:
    """The device binary (fatbin container with the sm_90a cubin) embedded in a compiled function,
    for SASS inspection with ``cuobjdump --dump-sass`` (no GPU needed)."""
    for op in compiled.ir_module.body.operations:
        if op.operation.name == "llvm.mlir.global" and str(op.attributes["sym_name"]) == '"kernels_binary"':
            return bytes(op.attributes["value"].value_bytes)
    raise LookupError("no embedded kernels_binary in the compiled module")


def workspace_numel(config: Sm90W4A16Config, m: int, n: int) -> int:
    """fp32 elements of ``mWork`` for one call (1 when split_k == 1: a dummy)."""
    return config.split_k * m * n if config.split_k > 1 else 1


TEMPLATE = register_template(Sm90W4A16GemvTemplate(), replace=True)

__all__ = [
    "DECODE_UNSCALE",
    "Sm90W4A16GemvKernel",
    "Sm90W4A16GemvTemplate",
    "TEMPLATE",
    "WORD_LAYOUT",
    "decode_word",
    "decode_word_f32",
    "embedded_cubin",
    "workspace_numel",
]
