"""Validation programs for the emulator's ISA modules, built only from CuTe's own atoms, layouts and partitioners
(no nvgemm code): compiled with ``keep_ptx`` by tests/emulator/test_isa_cute_programs.py and executed on the
emulator. Kept in a file of their own because ``cute.jit`` needs importable source."""

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warpgroup
from cutlass.tensor_utils import LayoutEnum

WG_M, WG_N, WG_K = 64, 128, 64


@cute.kernel
def _wgmma_ss_tile(tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
                   gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor):
    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.BFloat16, sA_layout.outer, 1024, swizzle=sA_layout.inner)
    sB = smem.allocate_tensor(cutlass.BFloat16, sB_layout.outer, 1024, swizzle=sB_layout.inner)
    tidx, _, _ = cute.arch.thread_idx()
    for i in cutlass.range(tidx, WG_M * WG_K, 128):
        sA[i // WG_K, i % WG_K, 0] = gA[i // WG_K, i % WG_K]
    for i in cutlass.range(tidx, WG_N * WG_K, 128):
        sB[i // WG_K, i % WG_K, 0] = gB[i // WG_K, i % WG_K]
    cute.arch.fence_proxy("async.shared", space="cta")
    cute.arch.barrier()
    thr = tiled_mma.get_slice(tidx)
    acc = cute.make_rmem_tensor(thr.partition_shape_C((WG_M, WG_N)), cutlass.Float32)
    acc.fill(-1.0)  # scale-d = 0 on the first k-block must discard it
    tCrA = tiled_mma.make_fragment_A(thr.partition_A(sA))
    tCrB = tiled_mma.make_fragment_B(thr.partition_B(sB))
    warpgroup.fence()
    tiled_mma.set(warpgroup.Field.ACCUMULATE, False)  # the first k-block overwrites (scale-d = 0)
    for kb in cutlass.range_constexpr(WG_K // 16):
        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, 0)], tCrB[(None, None, kb, 0)], acc)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    warpgroup.wait_group(0)
    tCgC = thr.partition_C(gC)
    for i in cutlass.range_constexpr(cute.size(acc)):
        tCgC[i] = acc[i]


@cute.jit
def wgmma_ss_tile(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer):
    """C (64 x 128, fp32, row-major) = A (64 x 64 bf16, K-major) @ B (128 x 64 bf16, K-major)^T through CuTe's SS
    WGMMA atom (m64n128k16) with CuTe's 128B-swizzled K-major shared-memory layouts."""
    tm = sm90_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K,
                                           OperandMajorMode.K, cutlass.Float32, (1, 1, 1), (WG_M, WG_N))
    sa = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (WG_M, WG_N, WG_K), cutlass.BFloat16, 1)
    sb = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (WG_M, WG_N, WG_K), cutlass.BFloat16, 1)
    gA = cute.make_tensor(a, cute.make_layout((WG_M, WG_K), stride=(WG_K, 1)))
    gB = cute.make_tensor(b, cute.make_layout((WG_N, WG_K), stride=(WG_K, 1)))
    gC = cute.make_tensor(c, cute.make_layout((WG_M, WG_N), stride=(WG_N, 1)))
    _wgmma_ss_tile(tm, sa, sb, gA, gB, gC).launch(grid=(1, 1, 1), block=(128, 1, 1), smem=48 * 1024)


TC_M, TC_N, TC_K = 128, 128, 64


@cute.kernel
def _tcgen05_f16_tile(tiled_mma: cute.TiledMma, sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
                      gA: cute.Tensor, gB: cute.Tensor, gC: cute.Tensor):
    from cutlass.cute.nvgpu import tcgen05

    smem = cutlass.memory.SmemAllocator()
    sA = smem.allocate_tensor(cutlass.BFloat16, sA_layout.outer, 1024, swizzle=sA_layout.inner)
    sB = smem.allocate_tensor(cutlass.BFloat16, sB_layout.outer, 1024, swizzle=sB_layout.inner)
    mbar = smem.allocate_tensor(cutlass.Int64, cute.make_layout(1), 8)
    tmem_holder = smem.allocate_tensor(cutlass.Int32, cute.make_layout(1), 4)
    tidx, _, _ = cute.arch.thread_idx()
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    thr = tiled_mma.get_slice(0)
    tCgA, tCgB = thr.partition_A(gA), thr.partition_B(gB)  # the same MMA-partitioned shapes as sA, sB
    sA0, sB0 = sA[(None, None, None, 0)], sB[(None, None, None, 0)]
    for i in cutlass.range(tidx, TC_M * TC_K, 128):
        sA0[i] = tCgA[i]
    for i in cutlass.range(tidx, TC_N * TC_K, 128):
        sB0[i] = tCgB[i]
    if warp == 0:
        with cute.arch.elect_one():
            cute.arch.mbarrier_init(mbar.iterator, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.alloc_tmem(TC_N, tmem_holder.iterator)
        cute.arch.relinquish_tmem_alloc_permit()
    cute.arch.fence_proxy("async.shared", space="cta")
    cute.arch.barrier()
    acc_ptr = cute.arch.retrieve_tmem_ptr(cutlass.Float32, 16, tmem_holder.iterator)
    tCtAcc = cute.make_tensor(acc_ptr, tiled_mma.make_fragment_C(tiled_mma.partition_shape_C((TC_M, TC_N))).layout)
    tCrA = tiled_mma.make_fragment_A(sA)
    tCrB = tiled_mma.make_fragment_B(sB)
    if warp == 0:  # the MMA warp (CuTe issues the MMA from one thread)
        for kb in cutlass.range_constexpr(TC_K // 16):
            tiled_mma.set(tcgen05.Field.ACCUMULATE, kb != 0)
            cute.gemm(tiled_mma, tCtAcc, tCrA[(None, None, kb, 0)], tCrB[(None, None, kb, 0)], tCtAcc)
        with cute.arch.elect_one():
            tcgen05.commit(mbar.iterator)
    cute.arch.mbarrier_wait(mbar.iterator, 0)
    atom = cute.make_copy_atom(tcgen05.Ld32x32bOp(tcgen05.Repetition.x32), cutlass.Float32)
    tiled_t2r = tcgen05.make_tmem_copy(atom, tCtAcc[(None, 0, 0)])
    thr_t2r = tiled_t2r.get_slice(tidx)
    tCgC = thr.partition_C(gC)
    tTR_tAcc = thr_t2r.partition_S(tCtAcc[(None, 0, 0)])
    tTR_gC = thr_t2r.partition_D(tCgC[(None, 0, 0)])
    tTR_rAcc = cute.make_rmem_tensor(tTR_gC.shape, cutlass.Float32)
    cute.copy(tiled_t2r, tTR_tAcc, tTR_rAcc)
    for i in cutlass.range_constexpr(cute.size(tTR_rAcc)):
        tTR_gC[i] = tTR_rAcc[i]
    cute.arch.barrier()
    if warp == 0:
        cute.arch.dealloc_tmem(acc_ptr, TC_N)


@cute.jit
def tcgen05_f16_tile(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer):
    """C (128 x 128, fp32) = A (128 x 64 bf16, K-major) @ B (128 x 64 bf16, K-major)^T through CuTe's
    ``tcgen05.mma.kind::f16`` atom (SS, cta_group::1), its smem layouts, a TMEM accumulator and
    ``tcgen05.ld.32x32b`` through CuTe's TMEM copy partitioner."""
    import cutlass.utils.blackwell_helpers as sm100_utils
    from cutlass.cute.nvgpu import tcgen05

    tm = sm100_utils.make_trivial_tiled_mma(cutlass.BFloat16, OperandMajorMode.K, OperandMajorMode.K,
                                            cutlass.Float32, tcgen05.CtaGroup.ONE, (TC_M, TC_N))
    sa = sm100_utils.make_smem_layout_a(tm, (TC_M, TC_N, TC_K), cutlass.BFloat16, 1)
    sb = sm100_utils.make_smem_layout_b(tm, (TC_M, TC_N, TC_K), cutlass.BFloat16, 1)
    gA = cute.make_tensor(a, cute.make_layout((TC_M, TC_K), stride=(TC_K, 1)))
    gB = cute.make_tensor(b, cute.make_layout((TC_N, TC_K), stride=(TC_K, 1)))
    gC = cute.make_tensor(c, cute.make_layout((TC_M, TC_N), stride=(TC_N, 1)))
    _tcgen05_f16_tile(tm, sa, sb, gA, gB, gC).launch(grid=(1, 1, 1), block=(128, 1, 1), smem=64 * 1024)


MS_M, MS_N, MS_K, MS_BK = 64, 64, 128, 64  # two K tiles of 64, both staged before the first is consumed


@cute.kernel
def _mma_sync_tile(tiled_mma: cute.TiledMma, g2s: cute.TiledCopy, s2r_a_atom: cute.CopyAtom,
                   s2r_b_atom: cute.CopyAtom, s_layout: cute.Layout, gA: cute.Tensor, gB: cute.Tensor,
                   gC: cute.Tensor):
    dtype = gA.element_type
    smem = cutlass.memory.SmemAllocator()
    swz = cute.make_swizzle(3, 4, 3)  # on byte offsets: 16-byte chunk ^= 128-byte row (mod 8), the ldmatrix layout
    sA = smem.allocate_tensor(dtype, s_layout, 128, swizzle=swz)  # (MS_M, MS_BK, stage)
    sB = smem.allocate_tensor(dtype, s_layout, 128, swizzle=swz)  # (MS_N, MS_BK, stage)
    tidx, _, _ = cute.arch.thread_idx()
    # G2S: cp.async.cg 16-byte copies through CuTe's tiled-copy partitioner, one commit group per K tile
    gA_t = cute.local_tile(gA, (MS_M, MS_BK), (0, None))  # (MS_M, MS_BK, k tiles)
    gB_t = cute.local_tile(gB, (MS_N, MS_BK), (0, None))
    thr_g2s = g2s.get_slice(tidx)
    for kt in cutlass.range_constexpr(MS_K // MS_BK):
        cute.copy(g2s, thr_g2s.partition_S(gA_t[None, None, kt]), thr_g2s.partition_D(sA[None, None, kt]))
        cute.copy(g2s, thr_g2s.partition_S(gB_t[None, None, kt]), thr_g2s.partition_D(sB[None, None, kt]))
        cute.arch.cp_async_commit_group()
    thr = tiled_mma.get_slice(tidx)
    tCsA, tCsB = thr.partition_A(sA), thr.partition_B(sB)
    tCrA = tiled_mma.make_fragment_A(tCsA[None, None, None, 0])
    tCrB = tiled_mma.make_fragment_B(tCsB[None, None, None, 0])
    acc = tiled_mma.make_fragment_C(thr.partition_C(gC))
    acc.fill(0.0)
    # S2R: ldmatrix through CuTe's MMA-matched tiled copies
    s2r_a = cute.make_tiled_copy_A(s2r_a_atom, tiled_mma)
    s2r_b = cute.make_tiled_copy_B(s2r_b_atom, tiled_mma)
    thr_a, thr_b = s2r_a.get_slice(tidx), s2r_b.get_slice(tidx)
    tXsA, tXrA = thr_a.partition_S(sA), thr_a.retile(tCrA)
    tXsB, tXrB = thr_b.partition_S(sB), thr_b.retile(tCrB)
    for kt in cutlass.range_constexpr(MS_K // MS_BK):
        cute.arch.cp_async_wait_group(MS_K // MS_BK - 1 - kt)  # tile kt landed; later tiles may still be in flight
        cute.arch.sync_threads()
        for kb in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
            cute.copy(s2r_a, tXsA[None, None, kb, kt], tXrA[None, None, kb])
            cute.copy(s2r_b, tXsB[None, None, kb, kt], tXrB[None, None, kb])
            cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)
    tCgC = thr.partition_C(gC)
    for i in cutlass.range_constexpr(cute.size(acc)):
        tCgC[i] = acc[i]


def make_mma_sync_tile(dtype):
    """C (64 x 64, fp32, row-major) = A (64 x 128, K-major) @ B (64 x 128, K-major)^T for 16-bit ``dtype``
    (``cutlass.BFloat16`` / ``cutlass.Float16``) through CuTe's ``mma.sync`` m16n8k16 atom tiled over a 2 x 2
    warp layout (128 threads), operands staged global -> shared with ``cp.async`` (CuTe's G2S atom, two commit
    groups) and shared -> registers with ``ldmatrix.x4`` (CuTe's MMA-matched tiled copies), swizzled smem."""

    @cute.jit
    def mma_sync_tile(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer):
        op = cute.nvgpu.warp.MmaF16BF16Op(dtype, cutlass.Float32, (16, 8, 16))
        tiled_mma = cute.make_tiled_mma(op, cute.make_layout((2, 2, 1)), permutation_mnk=(32, 32, 16))
        g2s_atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(cache_mode=cute.nvgpu.LoadCacheMode.GLOBAL),
                                       dtype, num_bits_per_copy=128)
        # 128 threads x 8 elements: 16 rows of 8 threads per pass, K-major
        g2s = cute.make_tiled_copy_tv(g2s_atom, cute.make_layout((16, 8), stride=(8, 1)), cute.make_layout((1, 8)))
        ldm = cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(False, 4), dtype)
        s_layout = cute.tile_to_shape(cute.make_layout((8, MS_BK), stride=(MS_BK, 1)),
                                      (MS_M, MS_BK, MS_K // MS_BK), (0, 1, 2))
        gA = cute.make_tensor(a, cute.make_layout((MS_M, MS_K), stride=(MS_K, 1)))
        gB = cute.make_tensor(b, cute.make_layout((MS_N, MS_K), stride=(MS_K, 1)))
        gC = cute.make_tensor(c, cute.make_layout((MS_M, MS_N), stride=(MS_N, 1)))
        _mma_sync_tile(tiled_mma, g2s, ldm, ldm, s_layout, gA, gB, gC).launch(grid=(1, 1, 1), block=(128, 1, 1),
                                                                               smem=2 * 2 * MS_M * MS_K + 1024)

    return mma_sync_tile
