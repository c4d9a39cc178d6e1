"""sm_90a NVFP4 weight-only (W4A16) WGMMA family: larger M (up to a few hundred), in CuTeDSL.

    out[m, f] = epilogue( alpha * sum_k x[m, k] * (E2M1[q[n, k]] * s[n, k // 16]) )

Each CTA computes a ``tile_m x tile_n`` output tile with one warpgroup per 64 rows of M
(``num_warps = 4 * tile_m / 64``), stepping K by ``tile_k = 64``:

1. all threads load the activation tile ``x[m0:m0+tile_m, k0:k0+64]`` with 16-byte loads and
   store it into a 128-byte-swizzled K-major shared-memory tile (the WGMMA A operand);
2. all threads load the packed weight tile (16-byte ``ld.global.nc.L1::no_allocate`` loads of the
   re-laid-out rows, same operand preparation as the gemv family) and its e4m3 scales, decode in
   registers to ``E2M1 * scale`` — exact in bf16 and fp16, since it needs at most 6 significant bits
   and lies in [2**-10, 2688] — and store it into the swizzled K-major B tile;
3. ``fence.proxy.async.shared::cta`` + barrier (generic-proxy stores read by the tensor cores), then
   4 ``wgmma.mma_async`` k-steps of 16 accumulate in fp32 registers; wait; barrier.

There is one shared-memory stage and no warp specialization: this is the straightforward,
correct version of the family (the tensor cores do the math; overlapping loads with WGMMA through
a multi-stage pipeline is the next step). The fp32 accumulator tile goes through shared memory so
that the epilogue (:class:`~nvgemm.templates.sm90_w4a16_gemv.Sm90EpilogueMixin`: alpha -> bias ->
activation -> residual, fp32, one rounding) can pair the gate and up columns of ``silu_mul`` (a CTA
takes ``tile_n/2`` gate rows and the matching up rows, as in the gemv family). ``split_k > 1``
writes raw partials to the fp32 workspace and reuses the gemv family's fixed-order reduce kernel.

Operands and C ABI: identical to the gemv family (``Sm90W4A16GemvTemplate.abi``), so the host side
(``nvgemm.runtime.sm90_launch``) prepares the same arguments. Constraints: K % 64 == 0 at run time
(checked by the runtime), tile_m 64 | 128, tile_n a multiple of 16 in [16, 128], tile_k == 64.
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

from .registry import register_template
from .sm90_config import Sm90W4A16Config
from .sm90_w4a16_gemv import (
    Sm90EpilogueMixin,
    Sm90W4A16GemvTemplate,
    decode_word_f32,
    e4m3x2_to_f32x2,
    ld_cached_v4,
    ld_stream_u16,
    ld_stream_v4,
    x_to_f32x2,
)

BK = 64  # K elements per main-loop step (4 WGMMA k-steps of 16)


class Sm90W4A16WgmmaKernel(Sm90EpilogueMixin):
    """Dequantize-to-shared-memory + WGMMA kernel (see the module docstring)."""

    unscale = 1.0  # B holds E2M1 * scale exactly; no decode factor left in the accumulator

    def __init__(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str = "bf16"):
        self.init_common(config, epilogue, x_format, "wgmma")
        self.ab_dtype = cutlass.BFloat16 if self.x_is_bf16 else cutlass.Float16
        self.use_gemv_reduce(config, epilogue, x_format)

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
        self.kernel(mX, mW, mS, mAlpha, mBias, mRes, mOut, mWork, tiled_mma, sA_layout, sB_layout).launch(
            grid=(grid_n, self.split_k, grid_m), block=(self.threads, 1, 1), stream=stream
        )
        self.launch_reduce(mX, mW, mAlpha, mBias, mRes, mOut, mWork, stream)

    def tile_coord(self, i: Int32, rows: int):
        """Weight rows fastest (consecutive threads store consecutive features of one output row)."""
        return i % rows, i // rows

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
        tiled_mma: cute.TiledMma,
        sA_layout: cute.ComposedLayout,
        sB_layout: cute.ComposedLayout,
    ):
        BM, BN, NT = self.tile_m, self.tile_n, self.threads
        tidx, _, _ = cute.arch.thread_idx()
        bx, bs, bm = cute.arch.block_idx()

        m = mX.shape[0]
        k = mX.shape[1]
        n = mW.shape[0]
        n_out = mOut.shape[1]

        smem = cutlass.memory.SmemAllocator()
        sA = smem.allocate_tensor(self.ab_dtype, sA_layout.outer, 1024, swizzle=sA_layout.inner)
        sB = smem.allocate_tensor(self.ab_dtype, sB_layout.outer, 1024, swizzle=sB_layout.inner)
        # fp32 tile indexed sC[n, m], laid out as a row-major [BM, BN + 1] array
        sC = smem.allocate_tensor(Float32, cute.make_layout((BN, BM), stride=(1, BN + 1)), 16)

        thr_mma = tiled_mma.get_slice(tidx)
        tCsA = thr_mma.partition_A(sA)
        tCsB = thr_mma.partition_B(sB)
        tCrA = tiled_mma.make_fragment_A(tCsA)
        tCrB = tiled_mma.make_fragment_B(tCsB)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((BM, BN)), Float32)
        acc.fill(0.0)

        x_base, w_base, s_base, x_rs, w_rs, s_rs = self.operand_bases(mX, mW, mS)
        kt_lo, kt_hi, _ = self.split_range(k // BK, bs, 1)

        tiled_mma.set(warpgroup.Field.ACCUMULATE, False)
        for kt in cutlass.range(kt_lo, kt_hi, unroll=1):
            # ---- A: activations, 16-byte chunks (8 elements), BM x 64 -> swizzled smem
            for c in cutlass.range_constexpr(BM * BK // 8 // NT):
                chunk = c * NT + tidx
                r = chunk // (BK // 8)
                kc = chunk % (BK // 8)
                mr = cutlass.min(bm * BM + r, m - 1)  # rows past M: clamped loads, results dropped
                words = ld_cached_v4(x_base + Int64(mr) * x_rs + Int64(kt * BK + kc * 8) * 2)
                for j in cutlass.range_constexpr(4):
                    lo, hi = x_to_f32x2(words[j], self.x_is_bf16)
                    sA[(r, kc * 8 + 2 * j, 0)] = lo.to(self.ab_dtype)
                    sA[(r, kc * 8 + 2 * j + 1, 0)] = hi.to(self.ab_dtype)
            # ---- B: weights, one 16-byte vector (32 elements, 2 scale blocks) per task
            for c in cutlass.range_constexpr((BN * (BK // 32) + NT - 1) // NT):
                task = c * NT + tidx
                # with fewer tasks than threads the surplus threads redo the last one (same value,
                # same address: a benign duplicate store), keeping the loop free of divergence
                task = cutlass.min(task, BN * (BK // 32) - 1)
                r = task // (BK // 32)
                vh = task % (BK // 32)
                row, feat = self.gemm_row(n_out, bx, r)
                rc = cutlass.min(row, n - 1)  # rows past N: clamped loads, columns never stored
                v = Int64(kt * (BK // 32) + vh)
                wv = ld_stream_v4(w_base + Int64(rc) * w_rs + v * 16)
                sc0, sc1 = e4m3x2_to_f32x2(ld_stream_u16(s_base + Int64(rc) * s_rs + v * 2))
                for wi in cutlass.range_constexpr(4):
                    sc = sc0 if wi < 2 else sc1
                    e = decode_word_f32(wv[wi])
                    for j in cutlass.range_constexpr(8):
                        # E2M1 * 2**-14 * s * 2**14 = E2M1 * s, exact in fp32 and in the bf16/fp16 store
                        sB[(r, vh * 32 + wi * 8 + j, 0)] = (e[j] * sc * Float32(16384.0)).to(self.ab_dtype)
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
        self.store_tile(sC, mAlpha, mBias, mRes, mOut, mWork, m, n, n_out, tidx, bx, bs, bm)


class Sm90W4A16WgmmaTemplate(Sm90W4A16GemvTemplate):
    """Registry entry of the WGMMA family (``template_id = "sm90_w4a16_wgmma"``); same C ABI as gemv."""

    template_id = "sm90_w4a16_wgmma"
    family = "wgmma"
    kernel_class = Sm90W4A16WgmmaKernel

    def gated_tile_n_problem(self, tile_n: int) -> str | None:
        return f"silu_mul needs tile_n % 32 == 0 (gate and up halves), got {tile_n}" if tile_n % 32 else None


TEMPLATE = register_template(Sm90W4A16WgmmaTemplate(), replace=True)

__all__ = ["BK", "Sm90W4A16WgmmaKernel", "Sm90W4A16WgmmaTemplate", "TEMPLATE"]
