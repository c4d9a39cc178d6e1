"""sm_90a NVFP4 weight-only (W4A16) small-M tensor-core family ("mma"), in CuTeDSL.

    out[m, f] = epilogue( alpha * sum_k x[m, k] * (E2M1[q[n, k]] * s[n, k // 16]) )

For decode batches of M = 4..32 the scalar gemv kernel pays one FFMA per weight element per
activation row; this family hands the products to the tensor cores (``mma.sync.m16n8k16``, fp32
accumulate) with the **weight as the 16-row A operand** (swap-AB: 16 weight rows x 8 activation
rows per instruction), so the per-element cost is the decode alone (~3 instructions, independent
of M up to 8 and shared by every 8-row activation group above that).

Operands: exactly the gemv family's (same re-laid-out weight bytes, linear scales, same C ABI;
``nvgemm.runtime.sm90_launch`` prepares them). No extra layout is needed because the MMA's k
order inside a 16-wide step is free as long as A and B agree: lane (g = lane / 4, q = lane % 4)
loads 32 consecutive elements (one 16-byte vector) of weight rows g and g + 8 at K offset 32q of a
128-element chunk, and in MMA step s (0..7) supplies its elements 4s..4s+3 at the fragment
positions of logical k {2q, 2q+1, 2q+8, 2q+9}; its B fragment is the same four K positions of
activation row g (two raw bf16x2 / f16x2 words, no conversion). Over the 4 lanes of a group and
the 8 steps every k of the chunk is used exactly once. The weight's two scales per vector are the
gemv layout's one 2-byte load.

Decode (exact): fp16x2 ``E2M1 * 2**-14`` (gemv bit trick) -> 2 x fp32 -> times ``s * 2**14``
-> ``cvt.rn.{bf16x2,f16x2}.f32``: E2M1 x e4m3 needs at most 6 significant bits and lies in
[2**-10, 2688], so the operand is exact in bf16 and fp16 and the tensor core's fp32 products are
the emulated op's products.

Work decomposition: a CTA takes ``tile_n`` weight rows (groups of 16; gate then up halves for
``silu_mul``) and ``tile_m`` activation rows (groups of 8); its ``num_warps`` warps split K in
128-element chunks (``U = tile_k / (128 * warps)`` chunks per warp per step, all loads issued
first). Warp partial tiles are summed in a fixed order through shared memory, then the shared
fp32 epilogue (:class:`~nvgemm.templates.sm90_w4a16_gemv.Sm90EpilogueMixin`, unscale 1) or, with
``split_k > 1``, the fp32 workspace and the gemv family's fixed-order reduce kernel.

Constraints: K % 128 == 0 at run time (checked by the runtime), tile_m 8 | 16 | 32, tile_n a
multiple of 16 in [16, 128], tile_k = 128 * warps * U with U in 1..2.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from nvgemm.epilogues.spec import EpilogueSpec

from .registry import register_template
from .sm90_config import MMA_CHUNK, Sm90W4A16Config
from .sm90_w4a16_gemv import (
    Sm90EpilogueMixin,
    Sm90W4A16GemvTemplate,
    _asm,
    decode_word_f32,
    e4m3x2_to_f32x2,
    ld_cached_x64,
    ld_stream_u16,
    ld_stream_v4,
)


@dsl_user_op
def pack2(lo: Float32, hi: Float32, to_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Two fp32 -> one bf16x2 / f16x2 register, ``lo`` in the low half (round to nearest even)."""
    ins = "cvt.rn.bf16x2.f32" if to_bf16 else "cvt.rn.f16x2.f32"
    r = _asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
             f"{ins} $0, $1, $2;", "=r,f,f", loc, ip)
    return Int32(r)


@dsl_user_op
def mma_16816(a, b, c, is_bf16: bool, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`` : D = A(16x16) B(16x8) + C, fp32 C/D."""
    kind = "bf16" if is_bf16 else "f16"
    st = llvm.StructType.get_literal([T.f32()] * 4)
    ops = [Int32(v).ir_value(loc=loc, ip=ip) for v in (*a, *b)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    r = _asm(st, ops,
             f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 "
             "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
             "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(4)]


class Sm90W4A16MmaKernel(Sm90EpilogueMixin):
    """Small-M tensor-core kernel (see the module docstring)."""

    unscale = 1.0  # A holds E2M1 * scale exactly

    def __init__(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str = "bf16"):
        self.init_common(config, epilogue, x_format, "mma")
        self.chunks = config.tile_k // (MMA_CHUNK * config.num_warps)  # U: chunks per warp per step
        self.use_gemv_reduce(config, epilogue, x_format)

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
        TM, TN, U = self.tile_m, self.tile_n, self.chunks
        NW = self.cfg.num_warps
        MG = TM // 8  # activation groups of 8 (MMA n)
        tidx, _, _ = cute.arch.thread_idx()
        bx, bs, bm = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        q = lane % 4

        m = mX.shape[0]
        k = mX.shape[1]
        n = mW.shape[0]
        n_out = mOut.shape[1]
        nchunk = k // MMA_CHUNK

        x_base, w_base, s_base, x_rs, w_rs, s_rs = self.operand_bases(mX, mW, mS)
        c_lo, c_hi, n_iter = self.split_range(nchunk, bs, NW * U)

        smem = cutlass.memory.SmemAllocator()
        # per-warp partial tiles [warp][16 weight rows][TM activation rows], then CTA totals
        sPart = smem.allocate_tensor(Float32, cute.make_layout((NW, 16, TM), stride=(16 * (TM + 1), TM + 1, 1)), 16)
        sTot = smem.allocate_tensor(Float32, cute.make_layout((TN, TM), stride=(TM + 1, 1)), 16)

        # activation rows of this lane's B fragments (clamped: loads stay in bounds, results dropped)
        x_row = []
        for mg in cutlass.range_constexpr(MG):
            mr = cutlass.min(bm * TM + mg * 8 + g, m - 1)
            x_row.append(x_base + Int64(mr) * x_rs)

        for rg in cutlass.range(TN // 16, unroll=1):
            row_lo, _f0 = self.gemm_row(n_out, bx, rg * 16 + g)
            row_hi, _f1 = self.gemm_row(n_out, bx, rg * 16 + g + 8)
            w_lo = w_base + Int64(cutlass.min(row_lo, n - 1)) * w_rs
            w_hi = w_base + Int64(cutlass.min(row_hi, n - 1)) * w_rs
            s_lo = s_base + Int64(cutlass.min(row_lo, n - 1)) * s_rs
            s_hi = s_base + Int64(cutlass.min(row_hi, n - 1)) * s_rs

            acc = cute.make_rmem_tensor((MG * 4,), Float32)
            acc.fill(0.0)
            for it in cutlass.range(n_iter, unroll=1):
                base = c_lo + it * (NW * U)
                wv = []
                sv = []
                xv = []
                ok = []
                for u in cutlass.range_constexpr(U):
                    c = base + u * NW + warp
                    ok.append(c < c_hi)
                    cc = Int64(cutlass.min(c, nchunk - 1))
                    vec = cc * 4 + q  # this lane's 16-byte vector inside the 128-element chunk
                    wv.append((ld_stream_v4(w_lo + vec * 16), ld_stream_v4(w_hi + vec * 16)))
                    sv.append((ld_stream_u16(s_lo + vec * 2), ld_stream_u16(s_hi + vec * 2)))
                    for mg in cutlass.range_constexpr(MG):
                        xv.append(ld_cached_x64(x_row[mg] + vec * 64))
                for u in cutlass.range_constexpr(U):
                    # A operands of the 8 MMA steps, for rows g (lo) and g + 8 (hi): E2M1 * s, exact
                    a_words = []
                    for h in cutlass.range_constexpr(2):
                        sc0, sc1 = e4m3x2_to_f32x2(sv[u][h])
                        f0 = sc0 * Float32(16384.0)
                        f1 = sc1 * Float32(16384.0)
                        words = []
                        for wi in cutlass.range_constexpr(4):
                            f = f0 if wi < 2 else f1
                            e = decode_word_f32(wv[u][h][wi])
                            for j in cutlass.range_constexpr(4):
                                words.append(pack2(e[2 * j] * f, e[2 * j + 1] * f, self.x_is_bf16))
                        a_words.append(words)  # 16 words = elements (0,1), (2,3), ... (30,31)
                    for mg in cutlass.range_constexpr(MG):
                        xw = xv[u * MG + mg]  # 16 words: elements (0,1) ... (30,31) of row g
                        d = [acc[mg * 4 + i] for i in range(4)]
                        for s in cutlass.range_constexpr(8):
                            a = (a_words[0][2 * s], a_words[1][2 * s], a_words[0][2 * s + 1], a_words[1][2 * s + 1])
                            b = (xw[2 * s], xw[2 * s + 1])
                            d = mma_16816(a, b, d, self.x_is_bf16)
                        for i in cutlass.range_constexpr(4):
                            acc[mg * 4 + i] = cutlass.select_(ok[u], d[i], acc[mg * 4 + i])

            # D fragment: c0, c1 = (weight row g, act rows 2q, 2q+1), c2, c3 = (row g + 8, same)
            for mg in cutlass.range_constexpr(MG):
                for i in cutlass.range_constexpr(4):
                    sPart[warp, g + 8 * (i // 2), mg * 8 + 2 * q + i % 2] = acc[mg * 4 + i]
            cute.arch.sync_threads()
            for e in cutlass.range(tidx, 16 * TM, self.threads):
                r = e // TM
                mi = e % TM
                t = sPart[0, r, mi]
                for w in cutlass.range_constexpr(1, NW):
                    t = t + sPart[w, r, mi]
                sTot[rg * 16 + r, mi] = t
            cute.arch.sync_threads()

        self.store_tile(sTot, mAlpha, mBias, mRes, mOut, mWork, m, n, n_out, tidx, bx, bs, bm)


class Sm90W4A16MmaTemplate(Sm90W4A16GemvTemplate):
    """Registry entry of the small-M tensor-core family (``template_id = "sm90_w4a16_mma"``); same ABI."""

    template_id = "sm90_w4a16_mma"
    family = "mma"
    kernel_class = Sm90W4A16MmaKernel

    def gated_tile_n_problem(self, tile_n: int) -> str | None:
        return f"silu_mul needs tile_n % 32 == 0 (16-row gate and up groups), got {tile_n}" if tile_n % 32 else None


TEMPLATE = register_template(Sm90W4A16MmaTemplate(), replace=True)

__all__ = ["Sm90W4A16MmaKernel", "Sm90W4A16MmaTemplate", "TEMPLATE", "mma_16816", "pack2"]
