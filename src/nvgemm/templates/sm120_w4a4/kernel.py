"""sm_120a / sm_121a NVFP4 W4A4 decode GEMM on the warp-level block-scaled tensor cores, in CuTeDSL.

    out[m, f] = epilogue( alpha * sum_k E2M1[x[m, k]] * sx[m, k // 16] * E2M1[w[f, k]] * sw[f, k // 16] )

Consumer Blackwell has no tcgen05 / tensor memory; its FP4 tensor core instruction is the
warp-synchronous ``mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X
.f32.e2m1.e2m1.f32.ue4m3``: D(16x8, fp32) += (A(16x64) x sA) (B(64x8) x sB), one ue4m3 scale per
16 K elements of each row of A and column of B. Swap-AB: the **weight rows are A** (16 rows per
MMA), **the tokens are B** (8 per MMA), so for decode batches the weights -- the bytes that
matter -- are read once per M tile.

Operands are read as the checkpoint stores them (no prepared layout): packed E2M1 ``[rows, K/2]``
(even K index in the low nibble) and the 128x4-swizzled e4m3 block scales
(:func:`nvgemm.core.formats.to_blocked`), where the 4 scales of one 64-deep slab of one row are one
aligned 32-bit word -- exactly the MMA's scale operand for that row (byte j = K block j).

Fragments (PTX ISA, ``mma.m16n8k64`` .e2m1 fragments; lane = 4 g + q):
    A  4 x b32: rows g, g + 8 (regs 0 / 1) at K 8q..8q+7, the same rows at K 32+8q.. (regs 2 / 3);
       with the 16-byte rows of a slab in shared memory these are the four 8x8 b16 matrices of one
       ``ldmatrix.x4`` (rows 0-7 / 8-15 x bytes 0-15 / 16-31 of the slab);
    B  2 x b32: token g at K 8q.. and 32+8q..: one ``ldmatrix.x2`` of the token group's slab;
    sA lane q = 0 gives row g's scale word, q = 1 row g + 8's (selector {byte 0, thread 0}); lanes
       q = 2, 3 load the same words (q % 2);
    sB every lane of the quad gives token g's word (selector {0, 0} reads lane q = 0's);
    C  the m16n8 fp32 layout: rows g, g + 8 x tokens 2q, 2q + 1 (shared with the sm90 decode
       kernel, whose epilogue and split-K reduce this kernel reuses).

Work decomposition: a CTA owns ``tile_n`` weight rows (``num_warps`` warps x ``row_tiles`` 16-row
tiles; for ``silu_mul`` a warp's first half of row tiles are gate rows and the second half the
matching up rows, N/2 further on) and ``tile_m`` tokens, over its share of K: ``split_k`` CTAs split
the K range in whole stages. grid = (row blocks, split_k, M tiles).

Pipeline: a CTA-wide ring of ``stages`` shared-memory stages of ``tile_k`` = 64 x 2 or 4 slabs:
weight rows (16-byte ``cp.async.cg``, L2 evict-first; each warp copies its own rows), weight scale
words (4-byte ``cp.async``), the ``tile_m`` activation rows (16-byte ``cp.async.ca``) and their scale
words. Rows are ``tile_k / 2 + 16`` bytes (conflict-free ``ldmatrix``). Predicates: weight rows past
N and every piece past K copy 0 source bytes (zero-filled); the scale word of a slab copies only its
valid K blocks (1 byte each: a K % 64 == 32 tail gets two zero scales, so a garbage padding byte can
never meet a zero code as NaN); token rows past M re-read row M - 1 (never stored). The prologue
issues ``stages - 1`` stages (with PDL the weight copies first, then ``griddepcontrol.wait``, then
the activations); each iteration waits for the oldest (``cp.async.wait_group stages - 2`` + one CTA
barrier), refills the slot just freed, and computes.

Split-K (``split_k > 1``): every CTA stores its fp32 partial tile, fences and bumps its tile's
counter; the CTA that brings it to ``split_k`` sums the partials in split order (deterministic) and
runs the epilogue, leaving the counter at zero (no per-call fill; CUDA-graph safe).

Epilogue (fp32, nvgemm's order): alpha (scalar or per feature) -> bias -> activation (``silu``,
``gelu_tanh``, gated ``silu_mul``) -> residual -> one rounding at the store.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from nvgemm.aot.abi import CompileSpec, StreamArg, SymDim, TensorArg, compile_for_target, fake_args, register_template
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.core.status import Status
from nvgemm.epilogues.cute_apply import Activation
from nvgemm.templates.sm120_w4a4.config import (
    ROW_PAD, ROW_TILE, SM120_ARCHS, TEMPLATE_ID, Sm120W4A4Config, stage_bytes, validate_config,
)
from nvgemm.templates.sm100_w4a4.requant import div_rn, e4m3_to_f32, to_e2m1x2, to_e4m3
from nvgemm.templates.sm90_w4a16.common import (
    Sm90KernelBase,
    _asm,
    _v,
    cp_async_commit,
    cp_async_wait,
    cta_barrier,
    evict_first_policy,
    lds_u32,
    out_dtype_of,
    pinned_i32,
    pinned_i64,
)

_TORCH_TO_ABI = {torch.bfloat16: "BFloat16", torch.float16: "Float16", torch.float32: "Float32"}


# ---------------------------------------------------------------------------------------------
# inline PTX (one instruction each)
# ---------------------------------------------------------------------------------------------


@dsl_user_op
def cp_async_16(dst: Int32, src: Int64, src_bytes: Int32, policy: Int64, *, loc=None, ip=None):
    """16-byte ``cp.async.cg`` (L2 only) reading ``src_bytes`` (16 or 0, the rest zero-filled), with
    an L2 cache-policy hint (the weight stream: evict-first)."""
    _asm(None, [_v(dst, Int32, loc, ip), _v(src, Int64, loc, ip), _v(src_bytes, Int32, loc, ip),
                _v(policy, Int64, loc, ip)],
         "cp.async.cg.shared.global.L2::cache_hint [$0], [$1], 16, $2, $3;", "r,l,r,l", loc, ip, True)


@dsl_user_op
def cp_async_16_ca(dst: Int32, src: Int64, src_bytes: Int32, *, loc=None, ip=None):
    """16-byte ``cp.async.ca`` (through L1: every CTA re-reads the activations) reading
    ``src_bytes`` (16 or 0)."""
    _asm(None, [_v(dst, Int32, loc, ip), _v(src, Int64, loc, ip), _v(src_bytes, Int32, loc, ip)],
         "cp.async.ca.shared.global [$0], [$1], 16, $2;", "r,l,r", loc, ip, True)


@dsl_user_op
def cp_async_4(dst: Int32, src: Int64, src_bytes: Int32, *, loc=None, ip=None):
    """4-byte ``cp.async.ca`` reading ``src_bytes`` (0..4; a scale word's valid K blocks) and
    zero-filling the rest."""
    _asm(None, [_v(dst, Int32, loc, ip), _v(src, Int64, loc, ip), _v(src_bytes, Int32, loc, ip)],
         "cp.async.ca.shared.global [$0], [$1], 4, $2;", "r,l,r", loc, ip, True)


@dsl_user_op
def opaque_f32(x: Float32, *, loc=None, ip=None) -> Float32:
    """``x`` through a ``mov``: the optimiser cannot see that it came from a bf16 / fp16 value, so the
    comparisons on it stay fp32 (LLVM otherwise narrows them to ``setp.*.bf16``)."""
    return Float32(_asm(T.f32(), [_v(x, Float32, loc, ip)], "mov.b32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def ldmatrix_x4(addr: Int32, *, loc=None, ip=None):
    """``ldmatrix.sync.aligned.m8n8.x4.shared.b16``: four 8x8 b16 matrices, lane 8 j + r giving row
    r of matrix j; register j of lane 4 g + q is row g, bytes 4q..4q+3 of matrix j."""
    st = llvm.StructType.get_literal([T.i32()] * 4)
    r = _asm(st, [_v(addr, Int32, loc, ip)], "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
             "=r,=r,=r,=r,r,~{memory}", loc, ip, True)
    return [Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ldmatrix_x2(addr: Int32, *, loc=None, ip=None):
    """``ldmatrix .x2``: two 8x8 b16 matrices (lanes 0-7 / 8-15 give their row addresses)."""
    st = llvm.StructType.get_literal([T.i32()] * 2)
    r = _asm(st, [_v(addr, Int32, loc, ip)], "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {$0, $1}, [$2];",
             "=r,=r,r,~{memory}", loc, ip, True)
    return [Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(2)]


@dsl_user_op
def mma_nvf4(a, b, c, sfa: Int32, sfb: Int32, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3``:
    D = (A x sfa) (B x sfb) + C with the scale selectors {byte 0, thread 0} for both operands."""
    st = llvm.StructType.get_literal([T.f32()] * 4)
    ops = ([_v(x, Int32, loc, ip) for x in (*a, *b)] + [_v(x, Float32, loc, ip) for x in c]
           + [_v(sfa, Int32, loc, ip), _v(sfb, Int32, loc, ip)])
    r = _asm(st, ops,
             "mma.sync.aligned.kind::mxf4nvf4.block_scale.scale_vec::4X.m16n8k64.row.col.f32.e2m1.e2m1.f32.ue4m3 "
             "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13}, $14, {0, 0}, $15, {0, 0};",
             "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f,r,r", loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


# ---------------------------------------------------------------------------------------------
# the kernel
# ---------------------------------------------------------------------------------------------


class Sm120Nvfp4GemmKernel(Sm90KernelBase):
    """The decode kernel (see the module docstring). The epilogue, split-K reduce and gated row
    pairing are the sm90 decode kernel's (:class:`~nvgemm.templates.sm90_w4a16.common.Sm90KernelBase`),
    whose accumulator fragment layout (m16n8, swap-AB) this kernel shares; the accumulators hold the
    exact block-scaled sums, so the unscale factor is 1."""

    unscale = 1.0

    def __init__(self, config: Sm120W4A4Config, epilogue: EpilogueSpec):
        validate_config(config).raise_if_failed("sm120 W4A4 config")
        c = config
        self.cfg = c
        self.epi = epilogue
        self.threads = c.threads
        self.tile_m, self.tile_n, self.split_k, self.pdl = c.tile_m, c.tile_n, c.split_k, c.pdl
        self.gated = epilogue.activation == "silu_mul"
        self.feat_per_cta = self.tile_n // 2 if self.gated else self.tile_n
        self.out_dtype = out_dtype_of(epilogue)
        self.W, self.RT, self.U, self.MG, self.D = c.num_warps, c.row_tiles, c.slabs, c.m_groups, c.stages
        # the m16n8 C layout helpers of the base read these
        self.x_is_bf16 = True
        if self.gated and self.RT % 2:
            raise ValueError("silu_mul needs an even number of row tiles per warp")
        sb = stage_bytes(c)
        self.row_b = c.tile_k // 2 + ROW_PAD  # bytes per staged row (weights and activations)
        self.off_ws = sb["weights"]
        self.off_x = self.off_ws + sb["weight_scales"]
        self.off_xs = self.off_x + sb["x"]
        self.stage_bytes = sum(sb.values())
        self.ring_bytes = self.D * self.stage_bytes
        self.pieces = c.tile_k // 32  # 16-byte pieces per row and stage
        self.rows_per_copy = 32 // self.pieces  # warp rows covered by one copy step of the 32 lanes
        self.w_copies = self.RT * ROW_TILE // self.rows_per_copy
        self.x_total = c.tile_m * self.pieces
        self.x_per_thread = max(1, self.x_total // self.threads)
        self.xs_per_thread = -(-(c.tile_m * self.U) // self.threads)

    # ----------------------------------------------------------------------------- host
    @cute.jit
    def __call__(self, mX: cute.Tensor, mXS: cute.Tensor, mW: cute.Tensor, mWS: cute.Tensor, mAlpha: cute.Tensor,
                 mBias: cute.Tensor, mRes: cute.Tensor, mOut: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor,
                 stream: cuda.CUstream):
        m = mX.shape[0]
        n_out = mOut.shape[1]
        if cutlass.const_expr(self.epi.out_quant):
            n_out = n_out * 2  # codes: two features per byte
        grid_n = (n_out + self.feat_per_cta - 1) // self.feat_per_cta
        grid_m = (m + self.tile_m - 1) // self.tile_m
        self.kernel(mX, mXS, mW, mWS, mAlpha, mBias, mRes, mOut, mWork, mCount).launch(
            grid=(grid_n, self.split_k, grid_m), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl)

    # ----------------------------------------------------------------------------- device helpers
    @cute.jit
    def tile_of(self, bx: Int32, warp: Int32, rt: int, n_tiles: Int32):
        """Global 16-row tile index of this warp's row tile ``rt`` (gated: the first half of a warp's
        row tiles are gate rows, the second half the up rows N/2 further on)."""
        if cutlass.const_expr(self.gated):
            h = self.RT // 2
            t = bx * (self.W * h) + warp * h + (rt % h)
            if cutlass.const_expr(rt >= h):
                t = t + n_tiles // 2
            return t
        else:
            return bx * (self.W * self.RT) + warp * self.RT + rt

    @cute.jit
    def split_range(self, k: Int32, bs: Int32):
        """(first stage, stages) of split ``bs``: the K range in whole stages, the last one partial."""
        n_stage = (k + self.cfg.tile_k - 1) // self.cfg.tile_k
        per = (n_stage + self.split_k - 1) // self.split_k
        st_lo = bs * per
        return st_lo, cutlass.max(cutlass.min(n_stage, st_lo + per) - st_lo, 0)

    @cute.jit
    def produce_weights(self, sbase: Int32, st: Int32, k: Int32, n: Int32, w_rows: list, w_row_of: list,
                        w_dst: Int32, w_piece: Int32, s_rows: list, s_dst: Int32, s_slab: Int32, kb_tiles: Int32,
                        policy: Int64):
        """cp.async this lane's weight pieces and scale words of global stage ``st`` into the slot at
        ``sbase``: per copy step ``i`` the 16-byte piece ``w_piece`` of warp row ``w_row_of[i]``
        (``w_rows[i]``: its global row address), zero-filled past N and K; per row tile the scale
        word of row ``g + 8 (q % 2)`` for slabs ``q // 2`` and ``q // 2 + 2`` (their valid bytes)."""
        k0 = st * self.cfg.tile_k
        kpiece = k0 + w_piece * 32
        kbytes = Int64(k0 // 2 + w_piece * 16)
        for i in cutlass.range_constexpr(self.w_copies):
            ok = (w_row_of[i] < n) & (kpiece < k)
            cp_async_16(sbase + w_dst + i * self.rows_per_copy * self.row_b, w_rows[i] + kbytes,
                        cutlass.select_(ok, Int32(16), Int32(0)), policy)
        kb = k // 16
        for rt in cutlass.range_constexpr(self.RT):
            for j in cutlass.range_constexpr(self.U // 2):
                slab = st * self.U + s_slab + 2 * j
                nb = cutlass.max(cutlass.min(kb - slab * 4, 4), 0)
                ok = s_rows[rt][1]
                cp_async_4(sbase + s_dst + (rt * self.U + 2 * j) * 64, s_rows[rt][0] + Int64(slab) * 512,
                           cutlass.select_(ok, nb, Int32(0)))

    @cute.jit
    def produce_x(self, sbase: Int32, st: Int32, k: Int32, x_rows: list, x_dst: Int32, x_piece: Int32, x_on: Int32,
                  xs: list):
        """cp.async this thread's activation pieces (piece ``x_piece`` of token rows ``x_rows``,
        zero-filled past K) and its activation scale words (``xs``: (source row address, shared
        offset, slab in the stage, on) each; the valid K blocks of the slab)."""
        k0 = st * self.cfg.tile_k
        kpiece = k0 + x_piece * 32
        kbytes = Int64(k0 // 2 + x_piece * 16)
        for i in cutlass.range_constexpr(self.x_per_thread):
            if x_on != 0:
                ok = kpiece < k
                cp_async_16_ca(sbase + x_dst + i * (self.threads // self.pieces) * self.row_b, x_rows[i] + kbytes,
                               cutlass.select_(ok, Int32(16), Int32(0)))
        for i in cutlass.range_constexpr(self.xs_per_thread):
            src, dst, slab_l, on = xs[i]
            if on != 0:
                slab = st * self.U + slab_l
                nb = cutlass.max(cutlass.min(k // 16 - slab * 4, 4), 0)
                cp_async_4(sbase + dst, src + Int64(slab) * 512, nb)

    @cute.jit
    def compute_stage(self, base: Int32, a_lds: Int32, sa_lds: Int32, b_lds: Int32, sb_lds: Int32, acc: cute.Tensor):
        """The MMAs of the ring stage at ``base``: per slab, the B fragments and scale word of each
        token group, then per row tile its A fragments (one ``ldmatrix.x4``), its scale word and one
        ``mma.sync`` per token group into ``acc``."""
        RT, U, MG = self.RT, self.U, self.MG
        for u in cutlass.range_constexpr(U):
            xb = []
            xsw = []
            for mg in cutlass.range_constexpr(MG):
                xb.append(ldmatrix_x2(base + b_lds + mg * 8 * self.row_b + u * 32))
                xsw.append(lds_u32(base + sb_lds + (u * self.tile_m + mg * 8) * 4))
            for rt in cutlass.range_constexpr(RT):
                a = ldmatrix_x4(base + a_lds + rt * ROW_TILE * self.row_b + u * 32)
                wsw = lds_u32(base + sa_lds + (rt * U + u) * 64)
                for mg in cutlass.range_constexpr(MG):
                    i0 = (rt * MG + mg) * 4
                    d = mma_nvf4(a, xb[mg], [acc[i0], acc[i0 + 1], acc[i0 + 2], acc[i0 + 3]], wsw, xsw[mg])
                    for i in cutlass.range_constexpr(4):
                        acc[i0 + i] = d[i]

    @cute.jit
    def store_fragments(self, acc: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor,
                        mOut: cute.Tensor, bx: Int32, warp: Int32, g: Int32, q: Int32, m: Int32, m0: Int32,
                        n_tiles: Int32, n_out: Int32, from_work: bool, mWork: cute.Tensor, m_all: Int32,
                        n_pad: Int32):
        """The epilogue of this lane's fragments: the dense one (the base's), or for ``out_quant`` the
        fused SwiGLU + NVFP4 requant (:meth:`store_requant`)."""
        if cutlass.const_expr(self.epi.out_quant):
            self.store_requant(acc, mAlpha, mBias, mRes, mOut, bx, warp, g, q, m, m0, n_tiles, from_work, mWork,
                               m_all, n_pad)
        else:
            Sm90KernelBase.store_fragments(self, acc, mAlpha, mBias, mRes, mOut, bx, warp, g, q, m, m0, n_tiles,
                                           n_out, from_work, mWork, m_all, n_pad)

    @cute.jit
    def store_requant(self, acc: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor, mS: cute.Tensor,
                      mQ: cute.Tensor, bx: Int32, warp: Int32, g: Int32, q: Int32, m: Int32, m0: Int32,
                      n_tiles: Int32, from_work: bool, mWork: cute.Tensor, m_all: Int32, n_pad: Int32):
        """Fused SwiGLU + NVFP4 requant (the convention of :mod:`nvgemm.epilogues.requant` on this kernel's
        fragments): gate row tile ``t`` of a warp holds gated features ``16 t .. 16 t + 15`` = one NVFP4
        block of the next layer's input, per token spread over the 8 lanes of one ``q`` (rows g and
        g + 8). Per token: h = round_out(silu(gate) * up) after alpha / bias; the block amax by butterfly
        shuffles over lane bits 2-4; ``sf = e4m3(min(amax / (6 gs), 448))``; codes ``e2m1(h / (sf gs))``
        (true division, +0 for zeros); lane g (even) packs features g, g + 1 (its neighbour's by one
        shuffle) and g + 8, g + 9 into two bytes; lane g = 0 stores the scale byte at the token's 128x4
        swizzled offset. ``mQ`` = codes [M, I/2], ``mS`` = the swizzled scale bytes (padding zeroed by
        the host); ``gs`` = the next layer's input_scale, stored after the alpha values. Shuffles run on
        every lane; only the stores are predicated (tokens >= M, tiles past I / 16)."""
        h_rt = self.RT // 2
        MG = self.MG
        gs_at = 1 if cutlass.const_expr(self.epi.alpha == "scalar") else n_pad
        gs = mAlpha[gs_at]
        den = Float32(6.0) * gs
        kb = n_tiles // 2  # NVFP4 blocks of the next layer's input (I / 16)
        kb4 = (kb + 3) // 4
        for rt in cutlass.range_constexpr(h_rt):
            t = self.tile_of(bx, warp, rt, n_tiles)
            tu = self.tile_of(bx, warp, rt + h_rt, n_tiles)
            for mg in cutlass.range_constexpr(MG):
                for p in cutlass.range_constexpr(2):
                    tok = m0 + mg * 8 + 2 * q + p
                    ok = (tok < m) & (t < kb)
                    tok_c = cutlass.min(tok, m - 1)
                    hs = []
                    for half in cutlass.range_constexpr(2):
                        i = 2 * half + p
                        row = t * 16 + g + 8 * half
                        row_u = tu * 16 + g + 8 * half
                        vg = acc[(rt * MG + mg) * 4 + i]
                        vu = acc[((rt + h_rt) * MG + mg) * 4 + i]
                        if cutlass.const_expr(from_work):
                            vg, vu = self.splitk_sum(mWork, m_all, n_pad, tok_c, cutlass.min(row, n_pad - 1),
                                                     cutlass.min(row_u, n_pad - 1))
                        y = vg
                        yu = vu
                        if cutlass.const_expr(self.epi.alpha == "scalar"):
                            y = y * mAlpha[0]
                            yu = yu * mAlpha[0]
                        else:
                            y = y * mAlpha[cutlass.min(row, n_pad - 1)]
                            yu = yu * mAlpha[cutlass.min(row_u, n_pad - 1)]
                        if cutlass.const_expr(self.epi.bias):
                            y = y + mBias[cutlass.min(row, n_pad - 1)]
                            yu = yu + mBias[cutlass.min(row_u, n_pad - 1)]
                        hs.append(opaque_f32(Activation("silu_mul").apply_gated(y, yu).to(self.out_dtype)
                                             .to(Float32)))
                    amax = cute.arch.fmax(cute.arch.fmax(hs[0], -hs[0]), cute.arch.fmax(hs[1], -hs[1]))
                    for off in cutlass.range_constexpr(3):
                        amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=4 << off))
                    sf = to_e4m3(cute.arch.fmin(div_rn(amax, den), Float32(448.0)))
                    step = e4m3_to_f32(sf) * gs
                    for half in cutlass.range_constexpr(2):
                        h = hs[half]
                        qv = Float32(0.0)
                        # +0 for an all-zero block and for h == +-0 (cvt keeps a zero's sign; nvgemm's
                        # quantizer encodes every zero as code 0)
                        if (step != Float32(0.0)) & (h != Float32(0.0)):
                            qv = div_rn(h, step)
                        q_hi = cute.arch.shuffle_sync_bfly(qv, offset=4)  # feature g + 1 (lane g ^ 1)
                        byte = to_e2m1x2(q_hi, qv)
                        if ok & (g % 2 == 0):
                            mQ[tok, t * 8 + half * 4 + g // 2] = byte.to(cutlass.Uint8)
                    if ok & (g == 0):
                        mS[self.requant_scale_offset(tok, t, kb4)] = sf.to(cutlass.Uint8)

    @cute.jit
    def requant_scale_offset(self, tok: Int32, t: Int32, kb4: Int32) -> Int32:
        """Byte of (token ``tok``, K block ``t``) in the fused requant's 128x4-swizzled output scales
        (``kb4`` 4-block columns; grouped kernels override the row -> atom map)."""
        return ((tok // 128) * kb4 + t // 4) * 512 + (tok % 32) * 16 + ((tok // 32) % 4) * 4 + t % 4

    # ----------------------------------------------------------------------------- building blocks
    #: the main loop issues ``griddepcontrol.wait`` itself (after the prologue's weight copies);
    #: kernels that must wait before they know their weight rows (a work list) wait earlier
    wait_in_main_loop = True

    @cute.jit
    def x_scale_offset(self, xr: Int32, kb_tiles: Int32) -> Int32:
        """Byte offset of token row ``xr``'s first scale word in the activation scales: the
        128x4 swizzle of ``[M, K/16]`` (grouped kernels override the row -> atom map)."""
        return (xr // 128) * kb_tiles * 512 + (xr % 32) * 16 + ((xr // 32) % 4) * 4

    @cute.jit
    def main_loop(self, mX: cute.Tensor, mXS: cute.Tensor, mW: cute.Tensor, mWS: cute.Tensor, acc: cute.Tensor,
                  ring: Int32, tidx: Int32, bx: Int32, warp: Int32, lane: Int32, m: Int32, m0: Int32, n: Int32,
                  k: Int32, st_lo: Int32, n_it: Int32, w_row0: Int32):
        """The block-scaled MMA loop of one CTA into ``acc``: the ``n_it`` stages from ``st_lo`` of
        token rows ``m0 ..`` (clamped to ``m - 1``) against the CTA's weight rows (``n`` valid rows,
        starting at row ``w_row0`` of ``mW`` / ``mWS``: an expert's block in a stacked operand),
        through the cp.async ring at shared address ``ring``."""
        g = lane // 4
        q = lane % 4
        n_tiles = (n + ROW_TILE - 1) // ROW_TILE
        kb_tiles = (k // 16 + 3) // 4  # 4-block columns of the 128x4 scale layout

        # ---- loop invariants of this lane's weight copies: copy step i covers warp rows
        # i * rows_per_copy + lane // pieces (of row tile (that row) // 16), piece lane % pieces
        w_piece = pinned_i32(lane % self.pieces)
        w_rows = []
        w_row_of = []
        for i in cutlass.range_constexpr(self.w_copies):
            r0 = i * self.rows_per_copy  # rows_per_copy <= 8 divides 16: one row tile per step
            row = self.tile_of(bx, warp, r0 // ROW_TILE, n_tiles) * ROW_TILE + r0 % ROW_TILE + lane // self.pieces
            w_row_of.append(pinned_i32(row))
            w_rows.append(pinned_i64(mW.iterator.toint()
                                     + Int64(cutlass.min(row, n - 1) + w_row0) * Int64(mW.stride[0])))
        w_dst = pinned_i32(warp * self.RT * ROW_TILE * self.row_b + (lane // self.pieces) * self.row_b + w_piece * 16)
        # scale words: lane (g, q) copies row g + 8 (q % 2) of each row tile, slabs q // 2 (+ 2)
        s_rows = []
        srow_l = g + 8 * (q % 2)
        for rt in cutlass.range_constexpr(self.RT):
            row = self.tile_of(bx, warp, rt, n_tiles) * ROW_TILE + srow_l
            rc = cutlass.min(row, n - 1) + w_row0
            off = (rc // 128) * kb_tiles * 512 + (rc % 32) * 16 + ((rc // 32) % 4) * 4
            s_rows.append((pinned_i64(mWS.iterator.toint() + Int64(off)), row < n))
        s_slab = q // 2
        s_dst = pinned_i32(self.off_ws + warp * self.RT * self.U * 64 + s_slab * 64 + srow_l * 4)

        # ---- activation copies: thread t covers pieces t + i * threads (token (that) // pieces)
        x_piece = tidx % self.pieces
        x_on = Int32(1)
        if cutlass.const_expr(self.x_total < self.threads):
            x_on = cutlass.select_(tidx < self.x_total, Int32(1), Int32(0))
        x_rows = []
        for i in cutlass.range_constexpr(self.x_per_thread):
            tok = cutlass.min(m0 + tidx // self.pieces + i * (self.threads // self.pieces), m - 1)
            x_rows.append(pinned_i64(mX.iterator.toint() + Int64(tok) * Int64(mX.stride[0])))
        x_dst = pinned_i32(self.off_x + (tidx // self.pieces) * self.row_b + x_piece * 16)
        # activation scale words: word t + i * threads of the stage's tile_m x slabs (token-fastest)
        xs = []
        for i in cutlass.range_constexpr(self.xs_per_thread):
            w = tidx + i * self.threads
            xs_tok = w % self.tile_m
            xr = cutlass.min(m0 + xs_tok, m - 1)
            src = pinned_i64(mXS.iterator.toint() + Int64(self.x_scale_offset(xr, kb_tiles)))
            xs.append((src, pinned_i32(self.off_xs + w * 4), (w // self.tile_m) % self.U,
                       cutlass.select_(w < self.tile_m * self.U, Int32(1), Int32(0))))

        # ---- fragment addresses (ldmatrix row of this lane; scale words)
        mat = lane // 8
        a_lds = pinned_i32(warp * self.RT * ROW_TILE * self.row_b + (lane % 8 + 8 * (mat % 2)) * self.row_b
                           + 16 * (mat // 2))
        sa_lds = pinned_i32(self.off_ws + warp * self.RT * self.U * 64 + srow_l * 4)
        b_lds = pinned_i32(self.off_x + (lane % 8) * self.row_b + 16 * (mat % 2))
        sb_lds = pinned_i32(self.off_xs + g * 4)
        policy = evict_first_policy()

        # ---- the ring
        D = self.D
        for j in cutlass.range_constexpr(D - 1):
            if j < n_it:
                self.produce_weights(ring + j * self.stage_bytes, st_lo + j, k, n, w_rows, w_row_of, w_dst, w_piece,
                                     s_rows, s_dst, s_slab, kb_tiles, policy)
        if cutlass.const_expr(self.pdl and self.wait_in_main_loop):
            cute.arch.griddepcontrol_wait()
        for j in cutlass.range_constexpr(D - 1):
            if j < n_it:
                self.produce_x(ring + j * self.stage_bytes, st_lo + j, k, x_rows, x_dst, x_piece, x_on, xs)
            cp_async_commit()
        for it in cutlass.range(n_it, unroll=1):
            cp_async_wait(D - 2)
            cta_barrier()
            nxt = it + (D - 1)
            if nxt < n_it:
                sbase_n = ring + (nxt % D) * self.stage_bytes
                self.produce_weights(sbase_n, st_lo + nxt, k, n, w_rows, w_row_of, w_dst, w_piece, s_rows, s_dst,
                                     s_slab, kb_tiles, policy)
                self.produce_x(sbase_n, st_lo + nxt, k, x_rows, x_dst, x_piece, x_on, xs)
            cp_async_commit()
            self.compute_stage(ring + (it % D) * self.stage_bytes, a_lds, sa_lds, b_lds, sb_lds, acc)

    def shared_buffers(self):
        """(the ring's shared address, the split-K flag word's): one allocation per kernel."""
        smem = cutlass.memory.SmemAllocator()
        ring_t = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(self.ring_bytes), 128)
        flag_t = smem.allocate_tensor(cutlass.Int32, cute.make_layout(4), 16)
        return ring_t.iterator.toint(), flag_t.iterator.toint()

    # ----------------------------------------------------------------------------- kernel
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mXS: cute.Tensor, mW: cute.Tensor, mWS: cute.Tensor, mAlpha: cute.Tensor,
               mBias: cute.Tensor, mRes: cute.Tensor, mOut: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        # opaque to the optimiser: with the thread index's range known, LLVM fuses the small address
        # products into dp2a / dp4a (no faster here)
        tidx = pinned_i32(tidx)
        bx, bs, bm = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        q = lane % 4

        m = mX.shape[0]
        k = mX.shape[1] * 2
        n = mW.shape[0]
        n_tiles = (n + ROW_TILE - 1) // ROW_TILE
        n_out = mOut.shape[1]
        n_pad = n_tiles * ROW_TILE
        m0 = bm * self.tile_m
        st_lo, n_it = self.split_range(k, bs)

        ring, flag = self.shared_buffers()
        acc = cute.make_rmem_tensor((self.RT * self.MG * 4,), Float32)
        acc.fill(0.0)
        self.main_loop(mX, mXS, mW, mWS, acc, ring, tidx, bx, warp, lane, m, m0, n, k, st_lo, n_it, Int32(0))

        # ---- epilogue (split-K: partials, and the last CTA of the tile sums them)
        self.finish(acc, mAlpha, mBias, mRes, mOut, mWork, mCount, bx, bs, bm, warp, g, q, m, m0, n_tiles, n_out,
                    n_pad, flag, tidx, bm * cute.arch.grid_dim()[0] + bx)


# ---------------------------------------------------------------------------------------------
# registry contract
# ---------------------------------------------------------------------------------------------


def abi_args(spec: CompileSpec) -> tuple:
    """C ABI, in order: activations ``mX`` (uint8 [M, K/2] packed E2M1) and their scales ``mXS``
    (uint8, flat 128x4-swizzled), weights ``mW`` (uint8 [N, K/2]) and ``mWS`` (flat swizzled),
    ``mAlpha`` fp32 (1,) | (N,), ``mBias`` fp32 (N,), ``mRes`` / ``mOut`` [M, N_out] in the output
    dtype, split-K ``mWork`` fp32 and ``mCount`` int32 (tensors the call already has stand in for
    absent bias / residual / workspace: compile-time variants never read them), stream."""
    odt = _TORCH_TO_ABI[spec.epilogue.out_dtype]
    oal = torch.finfo(spec.epilogue.out_dtype).bits // 8
    vec = {"shape": (SymDim(),), "stride": (1,), "assumed_align": 4}
    mat = {"shape": (SymDim(), SymDim()), "stride": (SymDim(1, 64), 1), "assumed_align": oal}
    res = TensorArg("mRes", odt, **mat)
    out = TensorArg("mOut", odt, **mat)
    if spec.epilogue.out_quant:  # codes [M, I/2] and the flat 128x4-swizzled scale bytes of the next input
        res = TensorArg("mRes", "Uint8", shape=(SymDim(),), stride=(1,), assumed_align=1)
        out = TensorArg("mOut", "Uint8", shape=(SymDim(), SymDim()), stride=(SymDim(1, 64), 1), assumed_align=1)
    packed = {"shape": (SymDim(), SymDim(16)), "stride": (SymDim(16, 64), 1), "assumed_align": 16}
    return (
        TensorArg("mX", "Uint8", **packed),
        TensorArg("mXS", "Uint8", shape=(SymDim(512),), stride=(1,), assumed_align=16),
        TensorArg("mW", "Uint8", **packed),
        TensorArg("mWS", "Uint8", shape=(SymDim(512),), stride=(1,), assumed_align=16),
        TensorArg("mAlpha", "Float32", **vec),
        TensorArg("mBias", "Float32", **vec),
        res,
        out,
        TensorArg("mWork", "Float32", **vec),
        TensorArg("mCount", "Int32", **vec),
        StreamArg("stream"),
    )


class Sm120Nvfp4GemmTemplate:
    """Registry entry of the sm120 W4A4 decode kernel (``template_id = "sm120_nvfp4_gemm"``)."""

    template_id = TEMPLATE_ID
    config_type = Sm120W4A4Config
    archs = SM120_ARCHS

    def can_implement(self, spec: CompileSpec) -> Status:
        c = spec.config
        if not isinstance(c, Sm120W4A4Config):
            return Status.fail(f"expects Sm120W4A4Config, got {type(c).__name__}")
        st = validate_config(c)
        if not st:
            return st
        if spec.arch not in SM120_ARCHS:
            return Status.fail(f"arch {spec.arch} is not one of {SM120_ARCHS} (the warp-level mxf4nvf4 MMA)")
        if spec.a_format != "nvfp4" or spec.b_format != "nvfp4" or spec.a_major != "k" or spec.b_major != "k":
            return Status.fail("activations and weights must be nvfp4, both K-major")
        if spec.epilogue.gated and c.row_tiles % 2:
            return Status.fail(f"silu_mul needs an even number of row tiles per warp (gate + up), got {c.row_tiles}")
        if spec.epilogue.alpha == "none":
            return Status.fail("W4A4 always has a global scale (weight_scale_2 x input_scale): alpha must be "
                               "scalar or vector")
        return Status.success()

    def abi(self, spec: CompileSpec):
        return abi_args(spec)

    def compile(self, spec: CompileSpec, *, keep_ptx: bool = False):
        """``cute.compile`` for ``spec.arch`` (no GPU)."""
        self.can_implement(spec).raise_if_failed(spec.name())
        kernel = Sm120Nvfp4GemmKernel(spec.config, spec.epilogue)
        return compile_for_target(kernel, fake_args(self.abi(spec)), spec, "--keep-ptx" if keep_ptx else "")


TEMPLATE = register_template(Sm120Nvfp4GemmTemplate(), replace=True)

__all__ = ["Sm120Nvfp4GemmKernel", "Sm120Nvfp4GemmTemplate", "TEMPLATE", "abi_args", "mma_nvf4"]
