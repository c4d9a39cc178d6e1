"""Validation programs for the emulator's TMA and block-scaled tcgen05 modules, built only from CuTe's own atoms,
layouts and partitioners (no nvgemm kernel code): TMA tile load / store with swizzled shared layouts and an
mbarrier transaction count, and ``tcgen05.mma .kind::mxf4nvf4`` with ``tcgen05.cp`` scale factors. Compiled AOT
through a test-only kernel template (tests/emulator/test_isa_cute_tma_nvfp4.py) so the host code CuTe generates
-- which encodes the tensor maps -- runs against the emulator's fake CUDA runtime. Kept in a file of their own
because ``cute.jit`` needs importable source."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import cpasync, tcgen05, warpgroup

# -- TMA copy: a (ROWS, COLS) bf16 row-major tensor in (BR, BC) boxes, the last row and column of boxes over the
# tensor's edge (zero fill on load, clipped on store)
ROWS, COLS, BR = 40, 80, 32
SW_ATOM = {128: warpgroup.SmemLayoutAtomKind.K_SW128, 64: warpgroup.SmemLayoutAtomKind.K_SW64,
           32: warpgroup.SmemLayoutAtomKind.K_SW32}


def box_cols(swizzle: int) -> int:
    """Columns of a box: one swizzle span of bf16 (a row of the box is one span)."""
    return swizzle // 2


def grid_of(swizzle: int) -> tuple[int, int]:
    bc = box_cols(swizzle)
    return (COLS + bc - 1) // bc, (ROWS + BR - 1) // BR


def make_tma_copy(swizzle: int):
    BC = box_cols(swizzle)
    NBYTES = BR * BC * 2

    @cute.kernel
    def tma_copy_kernel(tma_ld: cute.CopyAtom, mLd: cute.Tensor, tma_st: cute.CopyAtom, mSt: cute.Tensor,
                        s_layout: cute.ComposedLayout, gRaw: cute.Tensor, gTile: cute.Tensor):
        smem = cutlass.memory.SmemAllocator()
        raw = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(NBYTES), 1024)
        mbar = smem.allocate_tensor(cutlass.Int64, cute.make_layout(1), 8)
        sT = cute.make_tensor(cute.recast_ptr(raw.iterator, s_layout.inner, dtype=cutlass.BFloat16), s_layout.outer)
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        gLd = cute.local_tile(mLd, (BR, BC), (by, bx))
        gSt = cute.local_tile(mSt, (BR, BC), (by, bx))
        tAs, tAg = cpasync.tma_partition(tma_ld, 0, cute.make_layout(1), cute.group_modes(sT, 0, 2),
                                         cute.group_modes(gLd, 0, 2))
        tSs, tSg = cpasync.tma_partition(tma_st, 0, cute.make_layout(1), cute.group_modes(sT, 0, 2),
                                         cute.group_modes(gSt, 0, 2))
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(mbar.iterator, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(mbar.iterator, NBYTES)
            cute.copy(tma_ld, tAg, tAs, tma_bar_ptr=mbar.iterator)  # the TMA atom elects its issuing lane
        cute.arch.mbarrier_wait(mbar.iterator, 0)
        cta = by * cute.arch.grid_dim()[0] + bx
        for i in cutlass.range(tidx, NBYTES, 128):  # the shared bytes as they lie (the placement check)
            gRaw[cta, i] = raw[i]
        for i in cutlass.range(tidx, BR * BC, 128):  # the tile through CuTe's swizzled view (zero fill check)
            gTile[cta, i // BC, i % BC] = sT[i // BC, i % BC]
        cute.arch.barrier()
        if warp == 0:
            cute.copy(tma_st, tSs, tSg)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def tma_copy(src: cute.Pointer, dst: cute.Pointer, raw: cute.Pointer, tile: cute.Pointer,
                 stream: cuda.CUstream):
        """Every (BR, BC) box of ``src`` (ROWS x COLS bf16, row-major) TMA-loaded into a ``swizzle``-byte
        swizzled shared tile (CuTe's K-major atom) and TMA-stored to ``dst``; each CTA also writes its shared
        bytes to ``raw[cta]`` and the tile read through CuTe's swizzled view to ``tile[cta]``."""
        gx, gy = grid_of(swizzle)
        s_layout = cute.tile_to_shape(warpgroup.make_smem_layout_atom(SW_ATOM[swizzle], cutlass.BFloat16), (BR, BC),
                                      (0, 1))
        mSrc = cute.make_tensor(src, cute.make_layout((ROWS, COLS), stride=(COLS, 1)))
        mDst = cute.make_tensor(dst, cute.make_layout((ROWS, COLS), stride=(COLS, 1)))
        gRaw = cute.make_tensor(raw, cute.make_layout((gx * gy, NBYTES), stride=(NBYTES, 1)))
        gTile = cute.make_tensor(tile, cute.make_layout((gx * gy, BR, BC), stride=(BR * BC, BC, 1)))
        tma_ld, mLd = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mSrc, s_layout, (BR, BC))
        tma_st, mSt = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mDst, s_layout, (BR, BC))
        tma_copy_kernel(tma_ld, mLd, tma_st, mSt, s_layout, gRaw, gTile).launch(
            grid=(gx, gy, 1), block=(128, 1, 1), smem=NBYTES + 1024 + 64, stream=stream)

    return tma_copy


# -- NVFP4 block-scaled MMA: one (FM x FN) tile, K = FK in one TMA load, 4 MMAs of K = 64
FM, FN, FK = 128, 128, 256
SF_VEC = 16


def _alloc_smem(a_sl, b_sl, sfa_sl, sfb_sl):
    """Shared memory of one NVFP4 tile: A and B (CuTe's swizzled UMMA layouts), SFA, SFB, two mbarriers (TMA
    full, accumulator full) and the word ``tcgen05.alloc`` writes the TMEM address to."""
    smem = cutlass.memory.SmemAllocator()
    ab_t, sf_t = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    return (smem.allocate_tensor(ab_t, a_sl.outer, 1024, swizzle=a_sl.inner),
            smem.allocate_tensor(ab_t, b_sl.outer, 1024, swizzle=b_sl.inner),
            smem.allocate_tensor(sf_t, sfa_sl, 128), smem.allocate_tensor(sf_t, sfb_sl, 128),
            smem.allocate_tensor(cutlass.Int64, cute.make_layout(2), 8),
            smem.allocate_tensor(cutlass.Int32, cute.make_layout(1), 4))


def _scale_tmem(tiled_mma, tiler, acc_ptr, sfa_sl, sfb_sl, sSFA, sSFB, cta_group):
    """The TMEM accumulator of ``tiler``'s (M, N), SFA and SFB in the columns after it (CuTe's block-scaled TMEM
    layouts), and the ``tcgen05.cp`` S2T copies (atom, smem descriptors, TMEM destination) of both scales."""

    sf_t = cutlass.Float8E4M3FN
    tCtAcc = cute.make_tensor(acc_ptr, tiled_mma.make_fragment_C(tiled_mma.partition_shape_C(tiler[:2])).layout)
    col = acc_ptr + tcgen05.find_tmem_tensor_col_offset(tCtAcc)
    tCtSFA = cute.make_tensor(cute.recast_ptr(col, dtype=sf_t),
                              blockscaled_utils.make_tmem_layout_sfa(tiled_mma, tiler, SF_VEC, sfa_sl))
    col = col + tcgen05.find_tmem_tensor_col_offset(tCtSFA)
    tCtSFB = cute.make_tensor(cute.recast_ptr(col, dtype=sf_t),
                              blockscaled_utils.make_tmem_layout_sfb(tiled_mma, tiler, SF_VEC, sfb_sl))
    s2t = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(cta_group), sf_t)
    copies = []
    for t_tmem, s_smem in ((tCtSFA, sSFA), (tCtSFB, sSFB)):
        t_c = cute.filter_zeros(t_tmem)
        cp = tcgen05.make_s2t_copy(s2t, t_c)
        thr_cp = cp.get_slice(0)
        copies.append((cp, tcgen05.get_s2t_smem_desc_tensor(cp, thr_cp.partition_S(cute.filter_zeros(s_smem))),
                       thr_cp.partition_D(t_c)))
    return tCtAcc, tCtSFA, tCtSFB, copies


def _issue_mmas(tiled_mma, tCtAcc, tCrA, tCrB, tCtSFA, tCtSFB, copies):
    """Copy the scales to TMEM, then one block-scaled MMA per K-block (the first overwrites the accumulator)."""

    for cp, src, dst in copies:
        cute.copy(cp, src, dst)
    for kb in range(cute.size(tCrA, mode=[2])):
        tiled_mma.set(tcgen05.Field.SFA, tCtSFA[(None, None, kb)].iterator)
        tiled_mma.set(tcgen05.Field.SFB, tCtSFB[(None, None, kb)].iterator)
        tiled_mma.set(tcgen05.Field.ACCUMULATE, kb != 0)
        cute.gemm(tiled_mma, tCtAcc, tCrA[(None, None, kb)], tCrB[(None, None, kb)], tCtAcc)


def _store_acc(tCtAcc, tCgC, tidx):
    """``tcgen05.ld.32x32b`` of this thread's accumulator rows through CuTe's TMEM copy partitioner, to global."""

    atom = cute.make_copy_atom(tcgen05.Ld32x32bOp(tcgen05.Repetition.x32), cutlass.Float32)
    t2r = tcgen05.make_tmem_copy(atom, tCtAcc[(None, 0, 0)])
    thr_t2r = t2r.get_slice(tidx)
    tTR_g = thr_t2r.partition_D(tCgC[(None, 0, 0)])
    tTR_r = cute.make_rmem_tensor(tTR_g.shape, cutlass.Float32)
    cute.copy(t2r, thr_t2r.partition_S(tCtAcc[(None, 0, 0)]), tTR_r)
    for i in range(cute.size(tTR_r)):
        tTR_g[i] = tTR_r[i]


def make_nvfp4_tile():

    ab_t, sf_t = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    tiler = (FM, FN, FK)

    @cute.kernel
    def nvfp4_kernel(tiled_mma: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
                     mB: cute.Tensor, tma_sfa: cute.CopyAtom, mSFA: cute.Tensor, tma_sfb: cute.CopyAtom,
                     mSFB: cute.Tensor, mC: cute.Tensor, a_sl: cute.ComposedLayout, b_sl: cute.ComposedLayout,
                     sfa_sl: cute.Layout, sfb_sl: cute.Layout, tx_bytes: cutlass.Constexpr):
        sA, sB, sSFA, sSFB, bars, tmem_holder = _alloc_smem(a_sl, b_sl, sfa_sl, sfb_sl)
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        thr = tiled_mma.get_slice(0)
        gA = cute.local_tile(mA, cute.slice_(tiler, (None, 0, None)), (0, 0, 0))
        gB = cute.local_tile(mB, cute.slice_(tiler, (0, None, None)), (0, 0, 0))
        gSFA = cute.local_tile(mSFA, cute.slice_(tiler, (None, 0, None)), (0, 0, 0))
        gSFB = cute.local_tile(mSFB, cute.slice_(tiler, (0, None, None)), (0, 0, 0))
        gC = cute.local_tile(mC, cute.slice_(tiler, (None, None, 0)), (0, 0, 0))
        one = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, one, cute.group_modes(sA, 0, 3),
                                           cute.group_modes(thr.partition_A(gA), 0, 3))
        tBsB, tBgB = cpasync.tma_partition(tma_b, 0, one, cute.group_modes(sB, 0, 3),
                                           cute.group_modes(thr.partition_B(gB), 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(tma_sfa, 0, one, cute.group_modes(sSFA, 0, 3),
                                               cute.group_modes(thr.partition_A(gSFA), 0, 3))
        tBsSFB, tBgSFB = cpasync.tma_partition(tma_sfb, 0, one, cute.group_modes(sSFB, 0, 3),
                                               cute.group_modes(thr.partition_B(gSFB), 0, 3))
        tAsSFA, tAgSFA = cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB)
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(bars.iterator, 1)
                cute.arch.mbarrier_init(bars.iterator + 1, 1)
            cute.arch.mbarrier_init_fence()
            cute.arch.alloc_tmem(256, tmem_holder.iterator)
            cute.arch.relinquish_tmem_alloc_permit()
        cute.arch.barrier()
        acc_ptr = cute.arch.retrieve_tmem_ptr(cutlass.Float32, 16, tmem_holder.iterator)
        tCtAcc, tCtSFA, tCtSFB, copies = _scale_tmem(tiled_mma, tiler, acc_ptr, sfa_sl, sfb_sl, sSFA, sSFB,
                                                     tcgen05.CtaGroup.ONE)
        tCrA, tCrB = tiled_mma.make_fragment_A(sA), tiled_mma.make_fragment_B(sB)
        tCgC = thr.partition_C(gC)  # before the MMA issue sets fields of tiled_mma in a branch
        if warp == 0:  # TMA producer and MMA issuer
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(bars.iterator, tx_bytes)
            cute.copy(tma_a, tAgA, tAsA, tma_bar_ptr=bars.iterator)
            cute.copy(tma_b, tBgB, tBsB, tma_bar_ptr=bars.iterator)
            cute.copy(tma_sfa, tAgSFA, tAsSFA, tma_bar_ptr=bars.iterator)
            cute.copy(tma_sfb, tBgSFB, tBsSFB, tma_bar_ptr=bars.iterator)
            cute.arch.mbarrier_wait(bars.iterator, 0)
            _issue_mmas(tiled_mma, tCtAcc, tCrA, tCrB, tCtSFA, tCtSFB, copies)
            with cute.arch.elect_one():
                tcgen05.commit(bars.iterator + 1)
        cute.arch.mbarrier_wait(bars.iterator + 1, 0)
        _store_acc(tCtAcc, tCgC, tidx)
        cute.arch.barrier()
        if warp == 0:
            cute.arch.dealloc_tmem(acc_ptr, 256)

    @cute.jit
    def nvfp4_tile(a: cute.Pointer, b: cute.Pointer, sfa: cute.Pointer, sfb: cute.Pointer, c: cute.Pointer,
                   stream: cuda.CUstream):
        """C (FM x FN fp32, row-major) = (A * SFA) (B * SFB)^T: A (FM x FK) and B (FN x FK) packed E2M1, K-major;
        SFA / SFB e4m3 per 16 K-elements in CuTe's blocked scale-factor layout (``tile_atom_to_shape_SF``).
        CuTe's ``tcgen05.mma .kind::mxf4nvf4.block16`` atom (SS, cta_group::1), its smem layouts, TMA atoms for
        all four operands (scales as 16-bit pairs), ``tcgen05.cp .32x128b.warpx4`` of the scales to TMEM
        through CuTe's S2T partitioner, and ``tcgen05.ld.32x32b`` of the accumulator."""
        mA = cute.make_tensor(a, cute.make_layout((FM, FK, 1), stride=(FK, 1, FM * FK)))
        mB = cute.make_tensor(b, cute.make_layout((FN, FK, 1), stride=(FK, 1, FN * FK)))
        mSFA = cute.make_tensor(sfa, blockscaled_utils.tile_atom_to_shape_SF(mA.shape, SF_VEC))
        mSFB = cute.make_tensor(sfb, blockscaled_utils.tile_atom_to_shape_SF(mB.shape, SF_VEC))
        mC = cute.make_tensor(c, cute.make_layout((FM, FN, 1), stride=(FN, 1, FM * FN)))
        tiled_mma = cute.make_tiled_mma(tcgen05.MmaMXF4NVF4Op(sf_t, (FM, FN, 64), tcgen05.CtaGroup.ONE,
                                                              tcgen05.OperandSource.SMEM))
        cl = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma.thr_id.shape,)).shape
        a_sl = cute.slice_(sm100_utils.make_smem_layout_a(tiled_mma, tiler, ab_t, 1), (None, None, None, 0))
        b_sl = cute.slice_(sm100_utils.make_smem_layout_b(tiled_mma, tiler, ab_t, 1), (None, None, None, 0))
        sfa_sl = cute.slice_(blockscaled_utils.make_smem_layout_sfa(tiled_mma, tiler, SF_VEC, 1), (None, None, None, 0))
        sfb_sl = cute.slice_(blockscaled_utils.make_smem_layout_sfb(tiled_mma, tiler, SF_VEC, 1), (None, None, None, 0))
        g2s = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        tma_a, tA = cute.nvgpu.make_tiled_tma_atom_A(g2s, mA, a_sl, tiler, tiled_mma, cl)
        tma_b, tB = cute.nvgpu.make_tiled_tma_atom_B(g2s, mB, b_sl, tiler, tiled_mma, cl)
        tma_sfa, tSFA = cute.nvgpu.make_tiled_tma_atom_A(g2s, mSFA, sfa_sl, tiler, tiled_mma, cl,
                                                         internal_type=cutlass.Int16)
        tma_sfb, tSFB = cute.nvgpu.make_tiled_tma_atom_B(g2s, mSFB, sfb_sl, tiler, tiled_mma, cl,
                                                         internal_type=cutlass.Int16)
        tx = (cute.size_in_bytes(ab_t, a_sl) + cute.size_in_bytes(ab_t, b_sl) + cute.size_in_bytes(sf_t, sfa_sl)
              + cute.size_in_bytes(sf_t, sfb_sl))
        nvfp4_kernel(tiled_mma, tma_a, tA, tma_b, tB, tma_sfa, tSFA, tma_sfb, tSFB, mC, a_sl, b_sl, sfa_sl, sfb_sl,
                     tx).launch(grid=(1, 1, 1), block=(128, 1, 1), smem=64 * 1024, stream=stream)

    return nvfp4_tile


# -- the same tile as a CTA pair: tcgen05 .cta_group::2, M = 2 x 128 over a (2, 1) cluster
PM = 256


def make_nvfp4_pair_tile():

    ab_t, sf_t = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    two = tcgen05.CtaGroup.TWO
    tiler = (PM, FN, FK)
    tiler_sfb = (PM // 2, (FN + 127) // 128 * 128, FK)  # SFB: every CTA holds whole 128-column atoms of all N

    @cute.kernel
    def pair_kernel(tiled_mma: cute.TiledMma, mma_sfb: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor,
                    tma_b: cute.CopyAtom, mB: cute.Tensor, tma_sfa: cute.CopyAtom, mSFA: cute.Tensor,
                    tma_sfb: cute.CopyAtom, mSFB: cute.Tensor, mC: cute.Tensor, cl: cute.Layout, cl_sfb: cute.Layout,
                    a_sl: cute.ComposedLayout, b_sl: cute.ComposedLayout, sfa_sl: cute.Layout, sfb_sl: cute.Layout,
                    tx_bytes: cutlass.Constexpr):
        sA, sB, sSFA, sSFB, bars, tmem_holder = _alloc_smem(a_sl, b_sl, sfa_sl, sfb_sl)
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        v = rank % 2
        blk = cl.get_flat_coord(rank)
        blk_sfb = cl_sfb.get_flat_coord(rank)
        thr = tiled_mma.get_slice(v)
        thr_sfb = mma_sfb.get_slice(v)
        gA = cute.local_tile(mA, cute.slice_(tiler, (None, 0, None)), (0, 0, 0))
        gB = cute.local_tile(mB, cute.slice_(tiler, (0, None, None)), (0, 0, 0))
        gSFA = cute.local_tile(mSFA, cute.slice_(tiler, (None, 0, None)), (0, 0, 0))
        gSFB = cute.local_tile(mSFB, cute.slice_(tiler_sfb, (0, None, None)), (0, 0, 0))
        gC = cute.local_tile(mC, cute.slice_(tiler, (None, None, 0)), (0, 0, 0))
        a_cta = cute.make_layout(cute.slice_(cl, (0, 0, None, 0)).shape)
        b_cta = cute.make_layout(cute.slice_(cl, (0, None, 0, 0)).shape)
        sfb_cta = cute.make_layout(cute.slice_(cl_sfb, (0, None, 0, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(tma_a, blk[2], a_cta, cute.group_modes(sA, 0, 3),
                                           cute.group_modes(thr.partition_A(gA), 0, 3))
        tBsB, tBgB = cpasync.tma_partition(tma_b, blk[1], b_cta, cute.group_modes(sB, 0, 3),
                                           cute.group_modes(thr.partition_B(gB), 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(tma_sfa, blk[2], a_cta, cute.group_modes(sSFA, 0, 3),
                                               cute.group_modes(thr.partition_A(gSFA), 0, 3))
        tBsSFB, tBgSFB = cpasync.tma_partition(tma_sfb, blk_sfb[1], sfb_cta, cute.group_modes(sSFB, 0, 3),
                                               cute.group_modes(thr_sfb.partition_B(gSFB), 0, 3))
        tAsSFA, tAgSFA = cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB)
        sfb_mask = cpasync.create_tma_multicast_mask(cl_sfb, blk_sfb, mcast_mode=1)
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(bars.iterator, 1)
                cute.arch.mbarrier_init(bars.iterator + 1, 1)
            cute.arch.mbarrier_init_fence()
            cute.arch.alloc_tmem(256, tmem_holder.iterator, is_two_cta=True)
            cute.arch.relinquish_tmem_alloc_permit(is_two_cta=True)
        cute.arch.cluster_arrive()  # barriers initialised and tensor memory allocated in both CTAs
        cute.arch.cluster_wait()
        acc_ptr = cute.arch.retrieve_tmem_ptr(cutlass.Float32, 16, tmem_holder.iterator)
        tCtAcc, tCtSFA, tCtSFB, copies = _scale_tmem(tiled_mma, tiler, acc_ptr, sfa_sl, sfb_sl, sSFA, sSFB, two)
        tCrA, tCrB = tiled_mma.make_fragment_A(sA), tiled_mma.make_fragment_B(sB)
        tCgC = thr.partition_C(gC)  # before the MMA issue sets fields of tiled_mma in a branch
        if warp == 0:  # both CTAs load their halves; every load completes on the leader's barrier
            if v == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(bars.iterator, tx_bytes)
            cute.copy(tma_a, tAgA, tAsA, tma_bar_ptr=bars.iterator)
            cute.copy(tma_b, tBgB, tBsB, tma_bar_ptr=bars.iterator)
            cute.copy(tma_sfa, tAgSFA, tAsSFA, tma_bar_ptr=bars.iterator)
            cute.copy(tma_sfb, tBgSFB, tBsSFB, tma_bar_ptr=bars.iterator, mcast_mask=sfb_mask)
            if v == 0:  # the leader issues the pair's scale copies and MMAs
                cute.arch.mbarrier_wait(bars.iterator, 0)
                _issue_mmas(tiled_mma, tCtAcc, tCrA, tCrB, tCtSFA, tCtSFB, copies)
                with cute.arch.elect_one():
                    tcgen05.commit(bars.iterator + 1, cutlass.Int16(3), two)  # arrive on both CTAs' barrier
        cute.arch.mbarrier_wait(bars.iterator + 1, 0)
        _store_acc(tCtAcc, tCgC, tidx)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        if warp == 0:
            cute.arch.dealloc_tmem(acc_ptr, 256, is_two_cta=True)

    @cute.jit
    def nvfp4_pair_tile(a: cute.Pointer, b: cute.Pointer, sfa: cute.Pointer, sfb: cute.Pointer, c: cute.Pointer,
                        stream: cuda.CUstream):
        """C (PM x FN fp32) = (A * SFA) (B * SFB)^T as one ``tcgen05.mma .cta_group::2 .kind::mxf4nvf4`` tile over a
        CTA pair (cluster 2 x 1): each CTA TMA-loads its 128 rows of A and SFA and its half of B; SFB is multicast
        to both (CuTe's ``cluster_shape_to_tma_atom_SFB``); the leader copies the scales (``tcgen05.cp
        .cta_group::2``) and issues the MMAs, and its commit arrives on both CTAs' barriers."""
        mA = cute.make_tensor(a, cute.make_layout((PM, FK, 1), stride=(FK, 1, PM * FK)))
        mB = cute.make_tensor(b, cute.make_layout((FN, FK, 1), stride=(FK, 1, FN * FK)))
        mSFA = cute.make_tensor(sfa, blockscaled_utils.tile_atom_to_shape_SF(mA.shape, SF_VEC))
        mSFB = cute.make_tensor(sfb, blockscaled_utils.tile_atom_to_shape_SF(mB.shape, SF_VEC))
        mC = cute.make_tensor(c, cute.make_layout((PM, FN, 1), stride=(FN, 1, PM * FN)))
        tiled_mma = cute.make_tiled_mma(tcgen05.MmaMXF4NVF4Op(sf_t, (PM, FN, 64), two, tcgen05.OperandSource.SMEM))
        mma_sfb = cute.make_tiled_mma(tcgen05.MmaMXF4NVF4Op(sf_t, tiler_sfb[:2] + (64,), tcgen05.CtaGroup.ONE,
                                                            tcgen05.OperandSource.SMEM))
        cluster = (2, 1, 1)
        cl = cute.tiled_divide(cute.make_layout(cluster), (tiled_mma.thr_id.shape,))
        cl_sfb = cute.tiled_divide(cute.make_layout(cluster), (mma_sfb.thr_id.shape,))
        a_sl = cute.slice_(sm100_utils.make_smem_layout_a(tiled_mma, tiler, ab_t, 1), (None, None, None, 0))
        b_sl = cute.slice_(sm100_utils.make_smem_layout_b(tiled_mma, tiler, ab_t, 1), (None, None, None, 0))
        sfa_sl = cute.slice_(blockscaled_utils.make_smem_layout_sfa(tiled_mma, tiler, SF_VEC, 1), (None, None, None, 0))
        sfb_sl = cute.slice_(blockscaled_utils.make_smem_layout_sfb(tiled_mma, tiler, SF_VEC, 1), (None, None, None, 0))
        op_a = sm100_utils.cluster_shape_to_tma_atom_A(cluster, tiled_mma.thr_id)
        op_b = sm100_utils.cluster_shape_to_tma_atom_B(cluster, tiled_mma.thr_id)
        op_sfb = sm100_utils.cluster_shape_to_tma_atom_SFB(cluster, tiled_mma.thr_id)
        tma_a, tA = cute.nvgpu.make_tiled_tma_atom_A(op_a, mA, a_sl, tiler, tiled_mma, cl.shape)
        tma_b, tB = cute.nvgpu.make_tiled_tma_atom_B(op_b, mB, b_sl, tiler, tiled_mma, cl.shape)
        tma_sfa, tSFA = cute.nvgpu.make_tiled_tma_atom_A(op_a, mSFA, sfa_sl, tiler, tiled_mma, cl.shape,
                                                         internal_type=cutlass.Int16)
        tma_sfb, tSFB = cute.nvgpu.make_tiled_tma_atom_B(op_sfb, mSFB, sfb_sl, tiler_sfb, mma_sfb, cl_sfb.shape,
                                                         internal_type=cutlass.Int16)
        per_cta = (cute.size_in_bytes(ab_t, a_sl) + cute.size_in_bytes(ab_t, b_sl) + cute.size_in_bytes(sf_t, sfa_sl)
                   + cute.size_in_bytes(sf_t, sfb_sl))
        pair_kernel(tiled_mma, mma_sfb, tma_a, tA, tma_b, tB, tma_sfa, tSFA, tma_sfb, tSFB, mC, cl, cl_sfb, a_sl, b_sl,
                    sfa_sl, sfb_sl, 2 * per_cta).launch(grid=(2, 1, 1), block=(128, 1, 1), cluster=cluster,
                                                        smem=64 * 1024, stream=stream)

    return nvfp4_pair_tile
