"""sm_90a NVFP4 weight-only (W4A16) WGMMA family: larger M (tens to hundreds of tokens), in CuTeDSL.

    out[m, f] = epilogue( alpha * sum_k x[m, k] * E2M1[q[f, k]] * s[f, k // 16] )

Each CTA computes a ``tile_m x tile_n`` output tile (tokens x weight rows) with one warpgroup per
64 tokens (``num_warps = 4 * tile_m / 64``), stepping K by one 64-element chunk of the prepared
weight (:mod:`.operand`):

1. all threads load the activation tile ``x[m0:m0+tile_m, k0:k0+64]`` with 16-byte loads (zero
   past K) and store it into a 128-byte-swizzled K-major shared-memory tile (the WGMMA A operand);
2. all threads take the CTA's ``tile_n / 16`` weight row tiles x 32 lane vectors of the chunk
   (16-byte ``ld.global.nc.L1::no_allocate`` loads), decode them exactly as the mma family does
   (rotations + selects, then one packed multiply by the re-encoded block scales: ``E2M1 * s *
   2**-7``, exact in bf16 and fp16) and store the values into the swizzled K-major B tile;
3. ``fence.proxy.async.shared::cta`` + barrier (generic-proxy stores read by the tensor cores), then
   4 ``wgmma.mma_async`` k-steps of 16 accumulate in fp32 registers; wait; barrier.

One shared-memory stage, no warp specialisation: the tensor cores do the math but loads, decode
and MMAs do not overlap. The fp32 tile goes through shared memory so the epilogue
(:class:`~.common.Sm90KernelBase`: unscale 2**7 -> alpha -> bias -> activation -> residual, one
rounding) can pair the gate and up columns of ``silu_mul`` (a CTA takes ``tile_n / 2`` gate rows
and the matching up rows). ``split_k > 1``: raw partials to the fp32 workspace, and the CTA that
arrives last at its tile's counter sums them in split order (deterministic) and runs the epilogue.

Constraints: tile_m 64 | 128, tile_n a multiple of 16 in [16, 128] (32 for ``silu_mul``), tile_k
64, stages 1, bf16/fp16 activations, K % 32 == 0 (the prepared weight pads K to 256).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

from nvgemm.epilogues.spec import EpilogueSpec

from ..registry import register_template
from .common import (
    Sm90KernelBase,
    Sm90TemplateBase,
    decode_word,
    hmul2_bcast,
    ld_cached_v4,
    ld_stream_u32,
    ld_stream_v4,
    pair_to_f32,
    scale_pair,
    splitk_arrive,
    st_global_f32,
)
from .config import CHUNK, Sm90W4A16Config
from .operand import SCHEMES

BK = CHUNK  # K elements per main-loop step (4 WGMMA k-steps of 16)


class Sm90W4A16WgmmaKernel(Sm90KernelBase):
    """Dequantize-to-shared-memory + WGMMA kernel (see the module docstring)."""

    def __init__(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str = "bf16"):
        self.init_common(config, epilogue, x_format, "wgmma")
        self.ab_dtype = cutlass.BFloat16 if self.x_is_bf16 else cutlass.Float16
        sch = SCHEMES[x_format]
        self.s_shift, self.s_add = sch.scale_shift, sch.scale_add
        self.n_rtiles = self.tile_n // 16

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
        mCount: cute.Tensor,
        stream: cuda.CUstream,
    ):
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype, self.ab_dtype, OperandMajorMode.K, OperandMajorMode.K, Float32,
            (self.tile_m // 64, 1, 1), (64, self.tile_n),
        )
        tiler = (self.tile_m, self.tile_n, BK)
        sA_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tiler, self.ab_dtype, 1)
        sB_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tiler, self.ab_dtype, 1)
        m = mX.shape[0]
        n_out = mOut.shape[1]
        grid_n = (n_out + self.feat_per_cta - 1) // self.feat_per_cta
        grid_m = (m + self.tile_m - 1) // self.tile_m
        self.kernel(mX, mW, mS, mAlpha, mBias, mRes, mOut, mWork, mCount, tiled_mma, sA_layout, sB_layout).launch(
            grid=(grid_n, self.split_k, grid_m), block=(self.threads, 1, 1), stream=stream
        )

    @cute.jit
    def tile_of(self, bx: Int32, rt: Int32, n_tiles: Int32) -> Int32:
        """Global 16-row tile of the CTA's row tile ``rt`` (gate tiles, then the matching up tiles)."""
        if cutlass.const_expr(self.gated):
            h = self.n_rtiles // 2
            t = bx * h + rt
            if rt >= h:
                t = bx * h + rt - h + n_tiles // 2
            return t
        else:
            return bx * self.n_rtiles + rt

    # ----------------------------------------------------------------------------- kernel
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
        mCount: cute.Tensor,
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
    ):
        BM, BN, NT = self.tile_m, self.tile_n, self.threads
        tidx, _, _ = cute.arch.thread_idx()
        bx, bs, bm = cute.arch.block_idx()

        m = mX.shape[0]
        k = mX.shape[1]
        n_tiles = mW.shape[0]
        n_out = mOut.shape[1]
        n_pad = n_tiles * 16
        n_chunks = mW.shape[1] // 512

        smem = cutlass.memory.SmemAllocator()
        sA = smem.allocate_tensor(self.ab_dtype, sA_layout.outer, 1024, swizzle=sA_layout.inner)
        sB = smem.allocate_tensor(self.ab_dtype, sB_layout.outer, 1024, swizzle=sB_layout.inner)
        # fp32 tile indexed sC[n, m], laid out as a row-major [BM, BN + 1] array
        sC = smem.allocate_tensor(Float32, cute.make_layout((BN, BM), stride=(1, BN + 1)), 16)
        flag_t = smem.allocate_tensor(cutlass.Int32, cute.make_layout(4), 16)

        thr_mma = tiled_mma.get_slice(tidx)
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((BM, BN)), Float32)
        acc.fill(0.0)

        x_base = mX.iterator.toint()
        x_rs = Int64(mX.stride[0]) * 2
        per = (n_chunks + self.split_k - 1) // self.split_k
        kt_lo = bs * per
        kt_hi = cutlass.min(n_chunks, kt_lo + per)

        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        for kt in cutlass.range(kt_lo, kt_hi, unroll=1):
            # ---- A: activations, 16-byte pieces (8 elements), BM x 64 -> swizzled smem (zero past K)
            for c in cutlass.range_constexpr(BM * BK // 8 // NT):
                piece = c * NT + tidx
                r = piece // (BK // 8)
                kc = piece % (BK // 8)
                mr = cutlass.min(bm * BM + r, m - 1)  # rows past M: clamped loads, results dropped
                kk = kt * BK + kc * 8
                words = ld_cached_v4(x_base + Int64(mr) * x_rs + Int64(cutlass.min(kk, k - 8)) * 2)
                for j in cutlass.range_constexpr(4):
                    lo, hi = pair_to_f32(words[j], self.x_is_bf16)
                    lo = Float32(cutlass.select_(kk < k, lo, Float32(0.0)))
                    hi = Float32(cutlass.select_(kk < k, hi, Float32(0.0)))
                    sA[(r, kc * 8 + 2 * j, 0)] = lo.to(self.ab_dtype)
                    sA[(r, kc * 8 + 2 * j + 1, 0)] = hi.to(self.ab_dtype)
            # ---- B: weights, one lane vector (rows g, g + 8 of a row tile, block q) per task
            for c in cutlass.range_constexpr((self.n_rtiles * 32 + NT - 1) // NT):
                task = c * NT + tidx
                # with fewer tasks than threads the surplus threads redo the last one (same value,
                # same address: a benign duplicate store), keeping the loop free of divergence
                task = cutlass.min(task, self.n_rtiles * 32 - 1)
                rt = task // 32
                ln = task % 32
                g = ln // 4
                q = ln % 4
                t = cutlass.min(self.tile_of(bx, rt, n_tiles), n_tiles - 1)  # rows past N: never stored
                wrow = mW.iterator.toint() + Int64(t) * Int64(mW.stride[0])
                srow = mS.iterator.toint() + Int64(t) * Int64(mS.stride[0])
                wv = ld_stream_v4(wrow + Int64(kt) * 512 + Int64(ln * 16))
                sw = ld_stream_u32(srow + Int64(kt // 4) * 256 + Int64(ln * 8) + Int64((kt % 4) // 2) * 4)
                sp = scale_pair(sw, 0, self.s_shift, self.s_add)
                if kt % 2 == 1:
                    sp = scale_pair(sw, 1, self.s_shift, self.s_add)
                for s in cutlass.range_constexpr(4):
                    o = decode_word(wv[s], self.kind)
                    for j in cutlass.range_constexpr(4):
                        v = hmul2_bcast(o[j], sp, j % 2, self.x_is_bf16)  # E2M1 * s * 2**-7, exact
                        lo, hi = pair_to_f32(v, self.x_is_bf16)
                        row = rt * 16 + g + 8 * (j % 2)
                        kk = q * 16 + 4 * s + 2 * (j // 2)
                        sB[(row, kk, 0)] = lo.to(self.ab_dtype)
                        sB[(row, kk + 1, 0)] = hi.to(self.ab_dtype)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            # ---- WGMMA over the 64-deep K step
            warpgroup.fence()
            for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
                cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, 0)], tCrB[(None, None, kb, 0)], acc)
                tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
            warpgroup.commit_group()
            warpgroup.wait_group(0)
            cute.arch.sync_threads()

        # ---- accumulators -> shared memory (so gate/up columns can pair), then the epilogue
        cC = cute.make_identity_tensor((BM, BN))
        tCcC = thr_mma.partition_C(cC)
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            mi, ni = tCcC[i]
            sC[ni, mi] = acc[i]
        cute.arch.sync_threads()
        if cutlass.const_expr(self.split_k == 1):
            self.store_tile(sC, mAlpha, mBias, mRes, mOut, mWork, m, n_pad, n_tiles, n_out, tidx, bx, bm, False)
        else:
            for i in cutlass.range(tidx, BN * BM, NT):
                r = i % BN
                mi = i // BN
                tok = bm * BM + mi
                t = self.tile_of(bx, r // 16, n_tiles)
                row = t * 16 + r % 16
                if (tok < m) & (t < n_tiles):
                    st_global_f32(mWork.iterator.toint() + (Int64(bs * m + tok) * Int64(n_pad) + Int64(row)) * 4,
                                  sC[r, mi])
            grid_n = cute.arch.grid_dim()[0]
            if splitk_arrive(mCount, bm * grid_n + bx, self.split_k, flag_t.iterator.toint(), tidx) == 1:
                self.store_tile(sC, mAlpha, mBias, mRes, mOut, mWork, m, n_pad, n_tiles, n_out, tidx, bx, bm, True)

    @cute.jit
    def store_tile(self, sC: cute.Tensor, mAlpha: cute.Tensor, mBias: cute.Tensor, mRes: cute.Tensor,
                   mOut: cute.Tensor, mWork: cute.Tensor, m: Int32, n_pad: Int32, n_tiles: Int32, n_out: Int32,
                   tidx: Int32, bx: Int32, bm: Int32, from_work: bool):
        """The epilogue of the CTA's features (consecutive threads: consecutive features of one
        token). ``from_work``: values are the split-K partials summed in split order."""
        nf = self.feat_per_cta
        for i in cutlass.range(tidx, nf * self.tile_m, self.threads):
            r = i % nf
            mi = i // nf
            tok = bm * self.tile_m + mi
            t = self.tile_of(bx, r // 16, n_tiles)
            row = t * 16 + r % 16
            ru = r + nf if self.gated else r
            tu = self.tile_of(bx, ru // 16, n_tiles)
            row_u = tu * 16 + ru % 16
            if (tok < m) & (row < n_out) & (t < n_tiles):
                vg = sC[r, mi]
                vu = Float32(0.0)
                if cutlass.const_expr(self.gated):
                    vu = sC[ru, mi]
                if cutlass.const_expr(from_work):
                    vg, vu = self.splitk_sum(mWork, m, n_pad, tok, row, row_u)
                self.store_epilogue(mAlpha, mBias, mRes, mOut, tok, row, row, vg, row_u, vu)


class Sm90W4A16WgmmaTemplate(Sm90TemplateBase):
    """Registry entry of the WGMMA family (``template_id = "sm90_w4a16_wgmma"``); same C ABI as mma."""

    template_id = "sm90_w4a16_wgmma"
    family = "wgmma"
    kernel_class = Sm90W4A16WgmmaKernel

    def gated_problem(self, c: Sm90W4A16Config) -> str | None:
        return f"silu_mul needs tile_n % 32 == 0 (gate and up halves), got {c.tile_n}" if c.tile_n % 32 else None


TEMPLATE = register_template(Sm90W4A16WgmmaTemplate(), replace=True)

__all__ = ["BK", "Sm90W4A16WgmmaKernel", "Sm90W4A16WgmmaTemplate", "TEMPLATE"]
