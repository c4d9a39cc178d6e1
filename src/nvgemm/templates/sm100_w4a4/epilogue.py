"""Epilogue role of the sm_100a NVFP4 GEMM (warps 0-3), and the host probe of its thread ownership.

:class:`Sm100EpilogueMixin` is mixed into :class:`nvgemm.templates.sm100_w4a4.kernel.Sm100Nvfp4GemmKernel`;
it reads the attributes the kernel's ``_setup_attributes`` sets.

TMEM -> registers
    ``tcgen05.ld.32x32b`` for every output dtype and orientation (:meth:`_t2r_layout`): epilogue
    thread ``t`` owns accumulator row ``t`` of its CTA tile (one TMEM lane each) and ``epi_n``
    consecutive columns per sub-tile (``epi_n = min(tile_n, 32)``). Consequences the code relies on
    (and :func:`thread_ownership` lets the tests check from these very layouts):

    * native tiles: a thread's registers are one contiguous row segment, so per-feature vectors
      (alpha, bias: features are columns) and the residual row are read with vector loads, and
      interleaved gate/up columns ``2j, 2j+1`` sit in adjacent registers of one thread;
    * swap-AB tiles (features are rows): lanes ``2j`` / ``2j+1`` hold gate / up of one feature at
      the same register index (one ``shfl.bfly 1``), and for a fixed register the 32 lanes of a
      warp hold 32 consecutive features of one token -- consecutive addresses of the row-major
      ``[tokens, N]`` output, so the per-element stores coalesce.

Epilogue math per element (fp32, fixed order; one rounding at the store):
``acc*alpha -> +bias -> act -> +residual``. alpha/bias are loaded once per tile (swap-AB: one value
per thread, its row) or once per sub-tile as vectors (native), never per element.

Stores
    native tiles: registers -> swizzled smem stage -> one TMA bulk tensor store per sub-tile (two
    smem stages; TMA clips ragged M/N edges). A sub-tile must be >= 8 output columns wide (the
    smem layout's minimum): gated native tiles need tile_n >= 16 (the validity rule says so).
    swap-AB tiles: element-wise predicated global stores, coalesced across the warp.

Split-K (S > 1)
    each split publishes its fp32 partial to a **thread-major** workspace
    ``[tile][split][sub-tile][chunk][thread][4]`` with 16-byte stores (thread t's 4 consecutive
    registers are one vector; a warp's 32 vectors are 512 contiguous bytes). The last split to
    arrive loads the partials back in rounds: all ``S x chunk`` 16-byte loads of a round are
    issued first (S is a compile-time constant, the loops are unrolled), then each element is
    summed in the fixed order s = 0, 1, ..., S-1 (bitwise deterministic). A split with no K tiles
    (split_k > K tiles) publishes zeros instead of reading a never-written accumulator.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import cpasync, tcgen05

from nvgemm.aot.abi import cute_compile
from nvgemm.templates.sm100_w4a4.requant import div_rn, e4m3_to_f32, to_e2m1x2, to_e4m3

# 16-byte vectors in flight per thread in one split-K reduction round (S x chunk <= this).
SPLITK_VECTORS_IN_FLIGHT = 16


class Sm100EpilogueMixin:
    """Epilogue warps of :class:`~nvgemm.templates.sm100_w4a4.kernel.Sm100Nvfp4GemmKernel`."""

    # ------------------------------------------------------------------ static choices

    @staticmethod
    def _t2r_layout():
        """The output-layout hint handed to ``get_tmem_load_op``: ROW_MAJOR selects the 32x32b
        TMEM load (one lane per accumulator row) for fp32, bf16 and fp16 outputs alike. The
        hint must not follow the real output layout: for a column-major (swap-AB) 16-bit output it
        would select 16x256b, where four lanes share a row and the gate/up pairing breaks."""
        return utils.LayoutEnum.ROW_MAJOR

    def _setup_epilogue_attributes(self):
        """Epilogue tile, output tile width, store path and smem stages (host side, static)."""
        self.epi_n = min(self.cta_tile_shape_mnk[1], 32)
        self.epi_tile = (self.cta_tile_shape_mnk[0], self.epi_n)
        self.subtile_cnt = self.cta_tile_shape_mnk[1] // self.epi_n
        # output columns of one sub-tile / of one CTA tile (gated: half the GEMM features)
        self.out_w = self.epi_n // 2 if (self.gated and not self.feature_along_m) else self.epi_n
        self.out_cta_n = self.cta_tile_shape_mnk[1] // 2 if (self.gated and not self.feature_along_m) else (
            self.cta_tile_shape_mnk[1])
        self.use_tma_store = not self.feature_along_m
        self.num_c_stage = 2 if self.use_tma_store else 0
        self.c_smem_layout_staged = None
        if self.use_tma_store:
            self.c_smem_layout_staged = sm100_utils.make_smem_layout_epi(
                self.c_dtype, utils.LayoutEnum.ROW_MAJOR, (self.epi_tile[0], self.out_w), self.num_c_stage
            )
        # split-K reduction rounds: `chunk` 16-byte vectors per split per round
        vecs = self.epi_n // 4
        self.splitk_chunk = max(1, min(vecs, SPLITK_VECTORS_IN_FLIGHT // max(1, self.split_k)))
        while vecs % self.splitk_chunk:
            self.splitk_chunk -= 1

    def _c_smem_bytes(self) -> int:
        if not self.use_tma_store:
            return 0
        return cute.size_in_bytes(self.c_dtype, self.c_smem_layout_staged)

    def _c_smem_elems(self) -> int:
        lay = self.c_smem_layout_staged
        return cute.cosize(lay.outer if isinstance(lay, cute.ComposedLayout) else lay)

    def _c_smem_tensor(self, storage, lay):
        """The staged C smem tensor (128, out_w, num_c_stage), swizzled like the TMA expects
        (``lay``: the staged layout, passed into the kernel as an argument)."""
        if isinstance(lay, cute.ComposedLayout):
            return storage.sC.get_tensor(lay.outer, swizzle=lay.inner)
        return storage.sC.get_tensor(lay)

    # ------------------------------------------------------------------ partitions (shared with the probe)

    @cute.jit
    def _t2r_copy(self, tCtAcc, use_2cta: cutlass.Constexpr):
        """The TMEM-load tiled copy and the accumulator split into epilogue sub-tiles
        (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N, STAGE)."""
        copy_atom_t2r = sm100_utils.get_tmem_load_op(
            self.cta_tile_shape_mnk, self._t2r_layout(), self.c_dtype, self.acc_dtype, self.epi_tile, use_2cta,
        )
        tAcc_epi = cute.flat_divide(tCtAcc[((None, None), 0, 0, None)], self.epi_tile)
        return tcgen05.make_tmem_copy(copy_atom_t2r, tAcc_epi[(None, None, 0, 0, 0)]), tAcc_epi

    @cute.jit
    def _acc_coords(self, thr_mma, m_gemm, n_gemm):
        """Identity tensor of the GEMM partitioned like the accumulator and split into epilogue
        sub-tiles: (EPI_TILE_M, EPI_TILE_N, EPI_M, EPI_N, RestM, RestN, RestL) -> (row, col, l)."""
        cC = cute.make_identity_tensor((m_gemm, n_gemm, 1))
        gcC = cute.local_tile(cC, cute.slice_(self.mma_tiler, (None, None, 0)), (None, None, None))
        tCcC = thr_mma.partition_C(gcC)
        return cute.flat_divide(tCcC[((None, None), 0, 0, None, None, None)], self.epi_tile)

    @cute.jit
    def _out_copy(self, tAcc_epi, use_2cta: cutlass.Constexpr):
        """A 32x32b tiled copy over one OUTPUT sub-tile (128, out_w) (gated native: half the
        accumulator columns). Never executed: its destination layout -- thread t owns row t,
        out_w consecutive output columns -- partitions the residual and drives the
        register -> smem copy of the TMA store."""
        src = tAcc_epi[(None, None, 0, 0, 0)]
        if cutlass.const_expr(self.out_w != self.epi_n):
            src = cute.flat_divide(src, (self.epi_tile[0], self.out_w))[(None, None, 0, 0)]
        atom = sm100_utils.get_tmem_load_op(
            (self.cta_tile_shape_mnk[0], self.out_cta_n, self.cta_tile_shape_mnk[2]), self._t2r_layout(),
            self.c_dtype, self.acc_dtype, (self.epi_tile[0], self.out_w), use_2cta,
        )
        return tcgen05.make_tmem_copy(atom, src)

    @cute.jit
    def _out_tiles(self, mO_mnl):
        """An output-coordinate tensor (C, residual or an identity) split into the CTA's output
        sub-tiles: (128, out_w, 1, EPI_N, RestM, RestN, RestL)."""
        gO = cute.local_tile(mO_mnl, (self.cta_tile_shape_mnk[0], self.out_cta_n), (None, None, None))
        return cute.flat_divide(gO, (self.epi_tile[0], self.out_w))

    # ------------------------------------------------------------------ the role

    @cute.jit
    def _epilogue_warps(
        self, thr_mma, tmem, acc_pipeline, sched_params, tCtAcc_fake,
        mC_mnl, mR_mnl, mAlpha, mBias, mWs, mCnt, tma_atom_c, mC_tma, sC, storage,
        tidx, use_2cta: cutlass.Constexpr, v_size, num_tiles_n, m_gemm, n_gemm, k_tile_total, work=None,
    ):
        tmem.allocate(self.num_tmem_alloc_cols)
        tmem.wait_for_alloc()
        acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
        tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)

        # TMEM -> registers: thread t gets accumulator row t (see _t2r_layout); the same
        # partitions give each register's GEMM (row, col) and the thread's output row segment.
        tiled_copy_t2r, tAcc_epi = self._t2r_copy(tCtAcc_base, use_2cta)
        thr_t2r = tiled_copy_t2r.get_slice(tidx)
        tTR_tAcc_base = thr_t2r.partition_S(tAcc_epi)  # (T2R, T2R_M, T2R_N, EPI_M, EPI_N, STAGE)
        tTR_cC_all = thr_t2r.partition_D(self._acc_coords(thr_mma, m_gemm, n_gemm))
        t2r_out = self._out_copy(tAcc_epi, use_2cta)
        tTR_gR_all = t2r_out.get_slice(tidx).partition_D(self._out_tiles(mR_mnl))
        tTR_rC = cute.make_rmem_tensor(tTR_gR_all[(None, None, None, 0, 0, 0, 0, 0)].shape, self.c_dtype)
        tTR_rAcc = cute.make_rmem_tensor(tTR_cC_all[(None, None, None, 0, 0, 0, 0, 0)].shape, self.acc_dtype)
        rAlpha = cute.make_rmem_tensor((self.epi_n,), cutlass.Float32)
        rBias = cute.make_rmem_tensor((self.epi_n,), self.bias_dtype)
        rRes = cute.make_rmem_tensor(tTR_rC.shape, self.residual_dtype)

        # TMA store: register -> smem tiled copy, and the (smem stage, gmem sub-tile) TMA partitions
        tiled_copy_r2s = None
        tRS_sC = None
        bSG_sC = None
        bSG_gC_all = None
        c_pipeline = None
        if cutlass.const_expr(self.use_tma_store):
            atom_r2s = sm100_utils.get_smem_store_op(utils.LayoutEnum.ROW_MAJOR, self.c_dtype, self.acc_dtype, t2r_out)
            tiled_copy_r2s = cute.make_tiled_copy_D(atom_r2s, t2r_out)
            tRS_sC = tiled_copy_r2s.get_slice(tidx).partition_D(sC)
            gC_epi = self._out_tiles(mC_tma)
            bSG_sC, bSG_gC_all = cpasync.tma_partition(
                tma_atom_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), cute.group_modes(gC_epi, 0, 2),
            )
            c_pipeline = pipeline.PipelineTmaStore.create(
                num_stages=self.num_c_stage,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_epi_threads),
            )

        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        alpha_s = cutlass.Float32(1.0)
        if cutlass.const_expr(self.spec.alpha == "scalar"):
            alpha_s = mAlpha[0].to(cutlass.Float32)

        # split-K: the atomic's result, broadcast from thread 0 to the 128 epilogue threads
        sFlag = cute.make_tensor(storage.splitk_flag.ptr, cute.make_layout(1))
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        num_stores = cutlass.Int32(0)  # TMA-store sub-tiles issued so far (smem stage rotation)

        tile_sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work_tile = tile_sched.initial_work_tile_info()
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_acc_stage)
        while work_tile.is_valid_tile:
            coord = work_tile.tile_idx
            mma_coord = (coord[0] // v_size, coord[1], 0)
            split_idx = coord[2]
            tTR_tAcc = tTR_tAcc_base[(None, None, None, None, None, acc_state.index)]
            tTR_tAcc = cute.group_modes(tTR_tAcc, 3, cute.rank(tTR_tAcc))
            tTR_cC = tTR_cC_all[(None, None, None, None, None, *mma_coord)]
            tTR_cC = cute.group_modes(tTR_cC, 3, cute.rank(tTR_cC))
            tTR_gR = tTR_gR_all[(None, None, None, 0, None, coord[0], coord[1], 0)]
            bSG_gC = None
            if cutlass.const_expr(self.use_tma_store):
                bSG_gC = bSG_gC_all[(None, 0, None, coord[0], coord[1], 0)]
            cta_tile_id = coord[0] * num_tiles_n + coord[1]
            mAlphaT, alpha_sT = self._tile_alpha(mAlpha, alpha_s, coord, work)

            acc_pipeline.consumer_wait(acc_state)
            if cutlass.const_expr(self.split_k == 1):
                alpha_r, bias_r = self._row_features(tTR_cC, m_gemm, mAlphaT, mBias, alpha_sT)
                for st in cutlass.range(self.subtile_cnt):
                    if cutlass.const_expr(work is None):
                        cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, st)], tTR_rAcc)
                        num_stores = self._finish_subtile(
                            tTR_rAcc, tTR_rC, rAlpha, rBias, rRes, tTR_cC[(None, None, None, st)], tTR_gR[
                                (None, None, None, st)], st, coord, mC_mnl, mR_mnl, mAlphaT, mBias, alpha_sT, alpha_r,
                            bias_r, m_gemm, n_gemm, tiled_copy_r2s, tRS_sC, bSG_sC, bSG_gC, tma_atom_c, c_pipeline,
                            warp_idx, num_stores)
                    else:
                        # a tile without K work (empty work slot: its outputs are never read) stores
                        # nothing; its TMEM accumulator was never written either
                        _kb0, k_cnt0 = self._tile_k_range(coord, k_tile_total, work)
                        if k_cnt0 > 0:
                            cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, st)], tTR_rAcc)
                            num_stores = self._finish_subtile(
                                tTR_rAcc, tTR_rC, rAlpha, rBias, rRes, tTR_cC[(None, None, None, st)], tTR_gR[
                                    (None, None, None, st)], st, coord, mC_mnl, mR_mnl, mAlphaT, mBias, alpha_sT,
                                alpha_r, bias_r, m_gemm, n_gemm, tiled_copy_r2s, tRS_sC, bSG_sC, bSG_gC, tma_atom_c,
                                c_pipeline, warp_idx, num_stores)
                cute.arch.fence_view_async_tmem_load()
                acc_pipeline.consumer_release(acc_state)
                self._tile_done(coord, work, mC_mnl, mCnt, sFlag, tidx, m_gemm, num_tiles_n)
            else:
                # 1) publish this split's fp32 partial (thread-major workspace, 16-byte stores)
                _kb, k_cnt = self._tile_k_range(coord, k_tile_total, work)
                for st in cutlass.range(self.subtile_cnt):
                    if cutlass.const_expr(work is None):
                        cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, st)], tTR_rAcc)
                        if k_cnt == 0:
                            tTR_rAcc.fill(0.0)  # empty split: its accumulator was never written
                    else:
                        if k_cnt == 0:
                            tTR_rAcc.fill(0.0)  # empty split / work slot: TMEM may never have been written
                        else:
                            cute.copy(tiled_copy_t2r, tTR_tAcc[(None, None, None, st)], tTR_rAcc)
                    cute.autovec_copy(self._as_vectors(tTR_rAcc), self._ws_view(mWs, tidx, st, split_idx, cta_tile_id))
                cute.arch.fence_view_async_tmem_load()
                acc_pipeline.consumer_release(acc_state)
                cute.arch.fence_acq_rel_gpu()
                self.epilog_sync_barrier.arrive_and_wait()
                if tidx == 0:
                    old = cute.arch.atomic_add(mCnt.iterator + cta_tile_id, cutlass.Int32(1),
                                               sem="acq_rel", scope="gpu")
                    sFlag[0] = old
                self.epilog_sync_barrier.arrive_and_wait()
                arrived = sFlag[0]
                # 2) the last split reduces all partials in the fixed order 0..S-1
                if arrived == self.split_k - 1:
                    cute.arch.fence_acq_rel_gpu()
                    alpha_r, bias_r = self._row_features(tTR_cC, m_gemm, mAlphaT, mBias, alpha_sT)
                    for st in cutlass.range(self.subtile_cnt):
                        self._reduce_partials(mWs, tidx, st, cta_tile_id, tTR_rAcc)
                        num_stores = self._finish_subtile(
                            tTR_rAcc, tTR_rC, rAlpha, rBias, rRes, tTR_cC[(None, None, None, st)], tTR_gR[
                                (None, None, None, st)], st, coord, mC_mnl, mR_mnl, mAlphaT, mBias, alpha_sT, alpha_r,
                            bias_r, m_gemm, n_gemm, tiled_copy_r2s, tRS_sC, bSG_sC, bSG_gC, tma_atom_c, c_pipeline,
                            warp_idx, num_stores)
                    if tidx == 0:
                        mCnt[cta_tile_id] = cutlass.Int32(0)
                    self._tile_done(coord, work, mC_mnl, mCnt, sFlag, tidx, m_gemm, num_tiles_n)
                self.epilog_sync_barrier.arrive_and_wait()
            acc_state.advance()
            tile_sched.advance_to_next_work()
            work_tile = tile_sched.get_current_work()

        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        tmem.relinquish_alloc_permit()
        self.epilog_sync_barrier.arrive_and_wait()
        tmem.free(acc_tmem_ptr)
        if cutlass.const_expr(self.use_tma_store):
            c_pipeline.producer_tail()

    # ------------------------------------------------------------------ split-K workspace

    def _as_vectors(self, rAcc):
        """Registers viewed as (4, epi_n/4): mode 0 = the 4 elements of one 16-byte vector."""
        return cute.make_tensor(rAcc.iterator, cute.make_layout((4, self.epi_n // 4)))

    @cute.jit
    def _ws_view(self, mWs, tidx, st, split, tile):
        """Thread ``tidx``'s (4, epi_n/4) slice of sub-tile ``st`` of one split's partial."""
        return mWs[(None, None), tidx, st, split, tile]

    @cute.jit
    def _reduce_partials(self, mWs, tidx, st, tile, rSum):
        """rSum = sum_{s=0..S-1} partial_s (fixed order), in rounds of `chunk` vectors: a round
        issues all S x chunk 16-byte loads before its first add."""
        chunk = self.splitk_chunk
        rounds = self.epi_n // 4 // chunk
        buf = cute.make_rmem_tensor((4, chunk, self.split_k), self.acc_dtype)
        vSum = self._as_vectors(rSum)
        for rd in cutlass.range_constexpr(rounds):
            for s in cutlass.range_constexpr(self.split_k):
                src = cute.local_tile(self._ws_view(mWs, tidx, st, s, tile), (4, chunk), (0, rd))
                cute.autovec_copy(src, buf[(None, None, s)])
            for j in cutlass.range_constexpr(chunk):
                for e in cutlass.range_constexpr(4):
                    acc = buf[e, j, 0]
                    for s in cutlass.range_constexpr(1, self.split_k):
                        acc = acc + buf[e, j, s]
                    vSum[e, rd * chunk + j] = acc

    # ------------------------------------------------------------------ per-feature operands

    @cute.jit
    def _row_features(self, tTR_cC, m_size, mAlpha, mBias, alpha_s):
        """swap-AB: this thread's feature is its row, fixed for the tile -> alpha and bias are
        loaded once per tile (coalesced across the warp: 32 consecutive features)."""
        alpha_r = alpha_s
        bias_r = cutlass.Float32(0.0)
        if cutlass.const_expr(self.feature_along_m):
            r, _c, _l = tTR_cC[0]
            if r < m_size:
                if cutlass.const_expr(self.spec.alpha == "vector"):
                    alpha_r = mAlpha[r].to(cutlass.Float32)
                if cutlass.const_expr(self.spec.bias):
                    bias_r = mBias[r].to(cutlass.Float32)
        return alpha_r, bias_r

    @cute.jit
    def _col_features(self, c0, n_size, gblk, mAlpha, mBias, rAlpha, rBias):
        """native: alpha/bias of the sub-tile's epi_n consecutive feature columns, as vector loads
        when the sub-tile is inside N, else element-wise predicated (out-of-range -> 0)."""
        if cutlass.const_expr(self.spec.alpha == "vector" or self.spec.bias):
            if c0 + self.epi_n <= n_size:
                if cutlass.const_expr(self.spec.alpha == "vector"):
                    cute.autovec_copy(cute.local_tile(mAlpha, (self.epi_n,), (gblk,)), rAlpha)
                if cutlass.const_expr(self.spec.bias):
                    cute.autovec_copy(cute.local_tile(mBias, (self.epi_n,), (gblk,)), rBias)
            else:
                for i in cutlass.range_constexpr(self.epi_n):
                    inb = c0 + i < n_size
                    if cutlass.const_expr(self.spec.alpha == "vector"):
                        rAlpha[i] = cutlass.Float32(0.0)
                        if inb:
                            rAlpha[i] = mAlpha[c0 + i].to(cutlass.Float32)
                    if cutlass.const_expr(self.spec.bias):
                        rBias[i] = rBias.element_type(0.0)
                        if inb:
                            rBias[i] = mBias[c0 + i]

    # ------------------------------------------------------------------ one sub-tile

    @cute.jit
    def _finish_subtile(
        self, rAcc, rC, rAlpha, rBias, rRes, cs, gR_sub, st, coord, mC, mR, mAlpha, mBias, alpha_s, alpha_r, bias_r,
        m_size, n_size, tiled_copy_r2s, tRS_sC, bSG_sC, bSG_gC, tma_atom_c, c_pipeline, warp_idx, num_stores,
    ):
        """Epilogue math on one register sub-tile (fp32 -> one rounding) and its store; returns
        the updated count of TMA-store sub-tiles."""
        if cutlass.const_expr(self.spec.out_quant):
            self._store_requant(rAcc, cs, mC, mR, mAlpha, alpha_r, bias_r, m_size, n_size)
        elif cutlass.const_expr(self.feature_along_m):
            self._store_swap_ab(rAcc, cs, mC, mR, alpha_r, bias_r, m_size, n_size)
        else:
            r0, c0, _l = cs[0]
            self._col_features(c0, n_size, coord[1] * self.subtile_cnt + st, mAlpha, mBias, rAlpha, rBias)
            row_in = r0 < m_size
            if cutlass.const_expr(self.spec.residual):
                self._load_residual_row(rRes, gR_sub, cs, mR, row_in, m_size, n_size)
            self._native_math(rAcc, rC, rAlpha, rBias, rRes, alpha_s)
            if cutlass.const_expr(self.use_tma_store):  # always, for native tiles
                buf = num_stores % self.num_c_stage
                cute.copy(tiled_copy_r2s, tiled_copy_r2s.retile(rC), tRS_sC[(None, None, None, buf)])
                # make the smem writes visible to the TMA (async) proxy, then one thread stores
                cute.arch.fence_proxy("async.shared", space="cta")
                self.epilog_sync_barrier.arrive_and_wait()
                if warp_idx == self.epilog_warp_id[0]:
                    cute.copy(tma_atom_c, bSG_sC[(None, buf)], bSG_gC[(None, st)])
                    c_pipeline.producer_commit()
                    c_pipeline.producer_acquire()  # the other stage is free again
                self.epilog_sync_barrier.arrive_and_wait()
                num_stores = num_stores + 1
        return num_stores

    @cute.jit
    def _load_residual_row(self, rRes, gR_sub, cs, mR, row_in, m_size, n_size):
        """native: the thread's residual row segment (output coordinates), vector loads when the
        segment is inside the output, else element-wise predicated (out-of-range -> 0)."""
        r0, c0, _l = cs[0]
        oc0 = c0 // 2 if cutlass.const_expr(self.gated) else c0
        n_out = n_size // 2 if cutlass.const_expr(self.gated) else n_size
        if row_in & (oc0 + self.out_w <= n_out):
            cute.autovec_copy(gR_sub, rRes)
        else:
            for j in cutlass.range_constexpr(self.out_w):
                rRes[j] = rRes.element_type(0.0)
                if row_in & (oc0 + j < n_out):
                    rRes[j] = mR[r0, oc0 + j, 0]

    @cute.jit
    def _native_math(self, rAcc, rC, rAlpha, rBias, rRes, alpha_s):
        """rC[j] = cast(epilogue(acc)) for the thread's row segment (features are columns)."""
        for j in cutlass.range_constexpr(self.out_w):
            res = cutlass.Float32(0.0)
            if cutlass.const_expr(self.spec.residual):
                res = rRes[j].to(cutlass.Float32)
            if cutlass.const_expr(self.gated):
                # interleaved features: register 2j = gate, 2j+1 = up of output column j
                g = self.epi.apply_pre(rAcc[2 * j], self._alpha_at(rAlpha, alpha_s, 2 * j), self._bias_at(rBias, 2 * j))
                u = self.epi.apply_pre(rAcc[2 * j + 1], self._alpha_at(rAlpha, alpha_s, 2 * j + 1),
                                       self._bias_at(rBias, 2 * j + 1))
                v = self.epi.apply_post(self.epi.activation.apply_gated(g, u), res)
            else:
                v = self.epi.apply(rAcc[j], self._alpha_at(rAlpha, alpha_s, j), self._bias_at(rBias, j), res)
            rC[j] = v.to(self.c_dtype)

    def _alpha_at(self, rAlpha, alpha_s, i):
        if cutlass.const_expr(self.spec.alpha == "vector"):
            return rAlpha[i]
        return alpha_s

    def _bias_at(self, rBias, i):
        if cutlass.const_expr(self.spec.bias):
            return rBias[i].to(cutlass.Float32)
        return cutlass.Float32(0.0)

    @cute.jit
    def _store_swap_ab(self, rAcc, cs, mC, mR, alpha_r, bias_r, m_size, n_size):
        """swap-AB: features are rows (= lanes); per register the warp stores 32 consecutive
        features of one token. Gated: the up value of even lane 2j sits in lane 2j+1 (same
        register index): one butterfly shuffle, even lanes store feature j."""
        for i in cutlass.range_constexpr(self.epi_n):
            r, c, _l = cs[i]
            inb = (r < m_size) & (c < n_size)
            if cutlass.const_expr(self.gated):
                y = self.epi.apply_pre(rAcc[i], alpha_r, bias_r)
                up = cute.arch.shuffle_sync_bfly(y, offset=1)
                if inb & (r % 2 == 0):
                    res = cutlass.Float32(0.0)
                    if cutlass.const_expr(self.spec.residual):
                        res = mR[r // 2, c, 0].to(cutlass.Float32)
                    v = self.epi.apply_post(self.epi.activation.apply_gated(y, up), res)
                    mC[r // 2, c, 0] = v.to(self.c_dtype)
            else:
                if inb:
                    res = cutlass.Float32(0.0)
                    if cutlass.const_expr(self.spec.residual):
                        res = mR[r, c, 0].to(cutlass.Float32)
                    mC[r, c, 0] = self.epi.apply(rAcc[i], alpha_r, bias_r, res).to(self.c_dtype)

    @cute.jit
    def _store_requant(self, rAcc, cs, mQ, mS, mAlpha, alpha_r, bias_r, m_size, n_size):
        """Fused SwiGLU + NVFP4 requant (swap-AB, interleaved gate/up; the lane model of
        :mod:`nvgemm.epilogues.requant`): per register the warp's 32 lanes hold rows 32w..32w+31 of one
        token = gate/up of 16 gated features = one NVFP4 block of the next layer's input. Shuffles run
        on every lane; only the stores are predicated (M tail: tokens >= n_size)."""
        # the next layer's input_scale sits right after the alpha values (none: 0, scalar: 1, vector: m)
        gs_at = {"none": 0, "scalar": 1}.get(self.spec.alpha, None)
        gs = mAlpha[m_size if gs_at is None else gs_at].to(cutlass.Float32)
        den = cutlass.Float32(6.0) * gs
        kb = m_size // 32
        kb4 = (kb + 3) // 4
        for i in cutlass.range_constexpr(self.epi_n):
            r, c, _l = cs[i]
            inb = (r < m_size) & (c < n_size)
            y = self.epi.apply_pre(rAcc[i], alpha_r, bias_r)
            up = cute.arch.shuffle_sync_bfly(y, offset=1)
            h = self.epi.activation.apply_gated(y, up).to(self.c_dtype).to(cutlass.Float32)
            if r % 2 == 1:
                h = cutlass.Float32(0.0)
            amax = cute.arch.fmax(h, -h)
            for off in cutlass.range_constexpr(4):
                amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=2 << off))
            sf = to_e4m3(cute.arch.fmin(div_rn(amax, den), cutlass.Float32(448.0)))
            step = e4m3_to_f32(sf) * gs
            # +0 for an all-zero block and for h == +-0: cvt keeps a zero's sign (-0 -> code 0x8), while
            # nvgemm.core.formats encodes every zero as code 0
            q = cutlass.Float32(0.0)
            if (step != cutlass.Float32(0.0)) & (h != cutlass.Float32(0.0)):
                q = div_rn(h, step)
            q_hi = cute.arch.shuffle_sync_bfly(q, offset=2)
            byte = to_e2m1x2(q_hi, q)
            if inb & (r % 4 == 0):
                mQ[r // 4, c, 0] = byte.to(cutlass.Uint8)
            if inb & (r % 32 == 0):
                mS[self._sf_byte(c, r // 32, kb4), 0, 0] = sf.to(cutlass.Uint8)
        self._zero_sf_padding(cs, mS, m_size, n_size, kb4)

    @cute.jit
    def _zero_sf_padding(self, cs, mS, m_size, n_size, kb4):
        """Zero the scale bytes of the 128x4-swizzled layout's padding that fall in this tile's column group
        (the host allocates the scales uninitialised): token rows ``n_size .. 128 * ceil(n_size / 128)`` of a
        real K block, and every token row of a padded K block (GEMM rows >= ``m_size`` of a ragged last tile;
        a tile's 128 rows are exactly one 4-block column group). Each warp owns one K block (its 32 rows); its
        32 lanes split the token rows. Once per tile: in the sub-tile holding token 0. Disjoint from the bytes
        :meth:`_store_requant` writes, so no ordering is needed."""
        r, c0, _l = cs[0]
        if c0 == 0:
            lane = r % 32
            hi = (n_size + 127) // 128 * 128
            lo = n_size + lane
            if r >= m_size:
                lo = lane
            for c in cutlass.range(lo, hi, 32):
                mS[self._sf_byte(c, r // 32, kb4), 0, 0] = cutlass.Uint8(0)


    def _sf_byte(self, c, b, kb4):
        """Byte offset of (token row ``c``, K block ``b``) in the 128x4-swizzled scales of the fused
        requant output (``kb4`` = 4-block column groups); grouped kernels override the row -> atom map."""
        return ((c // 128) * kb4 + b // 4) * 512 + (c % 32) * 16 + ((c // 32) % 4) * 4 + b % 4


# ---------------------------------------------------------------------- host probe


def _flat_modes(shape, stride):
    if isinstance(shape, tuple):
        out = []
        for sh, sd in zip(shape, stride):
            out += _flat_modes(sh, sd)
        return out
    return [(int(shape), stride)]


def _coords_of(tensor) -> list:
    """Every element's coordinate of a static coordinate tensor (an identity tensor partition):
    the tensor's base coordinate plus its layout's scaled-basis strides, in CuTe's
    (colexicographic) linear element order -- pure Python, no IR per element."""
    base = list(int(x) for x in tensor.iterator)
    modes = _flat_modes(tensor.layout.shape, tensor.layout.stride)
    size = 1
    for e, _ in modes:
        size *= e
    out = []
    for idx in range(size):
        crd = list(base)
        rest = idx
        for extent, stride in modes:
            c, rest = rest % extent, rest // extent
            if c and not isinstance(stride, int):
                for md in stride.mode:
                    crd[md] += c * int(stride.value)
            elif c and stride:
                raise ValueError(f"non-basis stride {stride} in a coordinate tensor")
        out.append(tuple(crd))
    return out


def _split(coords, parts):
    step = len(coords) // parts
    return [[c[:2] for c in coords[i * step:(i + 1) * step]] for i in range(parts)]


def thread_ownership(kernel, arch: str = "sm_100a") -> dict:
    """Which GEMM-tile (row, col) every epilogue thread holds in every register after the TMEM
    load, and which OUTPUT (row, col) its output-partition register j addresses (residual loads,
    r2s/TMA stores), computed from the kernel's own ``_t2r_copy`` / ``_acc_coords`` / ``_out_copy``
    / ``_out_tiles``
    (tiled MMA partition, TMEM copy atom, epilogue tile) traced with static thread indices; no GPU.

    Returns ``{(v, tidx): (acc, out)}``: ``acc`` = [[(row, col) per register] per sub-tile] relative
    to the MMA tile at tile coordinate (0, 0) (``v`` = CTA of a 2-CTA pair, 0 for 1-CTA tiles);
    ``out`` = the same for the output partition of the CTA's (128, out_cta_n) output tile.
    A sample of elements is also read through CuTe's own tensor indexing and must agree. Traced
    for ``arch`` whatever target an earlier trace in the process used.
    """
    v_count = 2 if kernel.use_2cta else 1
    out: dict = {}

    @cute.jit
    def probe():
        kernel._setup_attributes()
        tiled_mma, _ = kernel._make_tiled_mmas()
        m, n = kernel.mma_tiler[0], kernel.mma_tiler[1]
        acc_shape = tiled_mma.partition_shape_C(kernel.mma_tiler[:2])
        tAcc = tiled_mma.make_fragment_C(cute.append(acc_shape, kernel.num_acc_stage))
        tiled_copy_t2r, tAcc_epi = kernel._t2r_copy(tAcc, kernel.use_2cta)
        t2r_out = kernel._out_copy(tAcc_epi, kernel.use_2cta)
        cOut = kernel._out_tiles(cute.make_identity_tensor((kernel.cta_tile_shape_mnk[0], kernel.out_cta_n, 1)))
        for v in cutlass.range_constexpr(v_count):
            cAcc = kernel._acc_coords(tiled_mma.get_slice(v), m, n)
            for t in cutlass.range_constexpr(kernel.num_epi_threads):
                # the probe's GEMM is one MMA tile, so every Rest mode has extent 1 and the linear
                # (colexicographic) order is register-major within a sub-tile, sub-tiles last
                tTR_cC = tiled_copy_t2r.get_slice(t).partition_D(cAcc)
                acc = _coords_of(tTR_cC)
                tTR_cO = t2r_out.get_slice(t).partition_D(cOut)
                outc = _coords_of(tTR_cO)
                if t in (0, 1, 37):  # the evaluator agrees with CuTe's own indexing
                    for i in (0, 1, len(acc) - 1):
                        assert tuple(int(x) for x in tTR_cC[i]) == acc[i], (t, i)
                    for i in (0, len(outc) - 1):
                        assert tuple(int(x) for x in tTR_cO[i]) == outc[i], (t, i)
                out[(v, t)] = (_split(acc, kernel.subtile_cnt), _split(outc, kernel.subtile_cnt))

    cute_compile(probe, arch=arch)
    return out
