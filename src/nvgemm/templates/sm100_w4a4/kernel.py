"""sm_100a NVFP4 (W4A4) block-scaled GEMM: a persistent, warp-specialised tcgen05 kernel.

    C[m, n] = epilogue( sum_k E2M1(A[m, k]) * SFA[m, k/16] * E2M1(B[n, k]) * SFB[n, k/16] )

A and B are packed E2M1 (two per byte, even k in the low nibble), both K-major; SFA/SFB are
e4m3 block scales (one per 16 K values) in the 128x4 swizzled layout of
``nvgemm.core.formats.to_blocked`` (the layout tcgen05's block-scaled MMA reads); the accumulator is
fp32 in tensor memory (TMEM); the epilogue folds alpha and the rest of the
:class:`~nvgemm.epilogues.EpilogueSpec` in fp32 and rounds once at the store.

Warp roles (192 threads per CTA)
    warps 0-3  epilogue (:mod:`nvgemm.templates.sm100_w4a4.epilogue`): allocate TMEM, TMEM ->
               registers (``tcgen05.ld.32x32b``: one accumulator row per thread), apply the
               epilogue (``nvgemm.epilogues.cute_apply``), store (TMA bulk store from a swizzled
               smem stage for native tiles; coalesced per-element stores for swap-AB); with
               split-K, the fp32 partial goes to a workspace and the last-arriving split reduces.
    warp 4     MMA: copies the scale factors smem -> TMEM (tcgen05.cp) and issues
               ``tcgen05.mma.kind::mxf4nvf4.block_scale`` (the leader CTA only, for 2-CTA tiles).
    warp 5     TMA: loads A, B, SFA, SFB tiles (multicast across the cluster), optional L2
               prefetch of upcoming K tiles (a grouped variant: of the next GEMM's weights after
               its own last load, :meth:`Sm100Nvfp4GemmKernel._prefetch_next`).

Pipelines
    ab   (PipelineTmaUmma, ``num_ab_stage`` deep): TMA warp -> MMA warp, smem stages.
    acc  (PipelineUmmaAsync, 1-2 stages): MMA warp -> epilogue warps, TMEM accumulators
         (tile_n 256 has one accumulator stage: no overlapping accumulator, so the MMA warp
         waits for the epilogue between tiles; the candidate policy does not emit tile_n 256).
    c    (PipelineTmaStore, 2 smem stages, native tiles): epilogue -> TMA store.
    A static persistent tile scheduler hands every CTA (cluster) the same sequence of work
    tiles (m_tile, n_tile, k_split) in all three roles.

PDL (``config.pdl``)
    launched with the programmatic-stream-serialization attribute. The TMA warp L2-prefetches
    the first weight (and weight-scale) K tiles (a grouped kernel whose work list is final before the
    wait: TMA-loads them into the first smem stages), then executes ``griddepcontrol.wait`` before
    the first load of activations / activation scales; the epilogue warps execute it before
    reading alpha, bias, residual, the split-K workspace or writing the output. Every warp
    executes ``griddepcontrol.launch_dependents`` when its part of the main loop is done
    (TMA: last load issued; MMA: last MMA issued; epilogue: last accumulator read from TMEM).
    Per the PTX ISA only the first execution in a CTA counts (repeated ones have no further
    effect), so a CTA signals when its *earliest* warp gets there -- in practice the TMA warp
    after its last load; the dependent grid may then be scheduled once every CTA has signalled or
    exited. That is only a scheduling hint: the dependent's ``griddepcontrol.wait`` still waits
    for this grid to complete and its memory operations to be visible, so the output written
    after the signal is safe.

Swap-AB (``config.swap_ab``)
    the kernel itself is operand-agnostic: the host passes A = weight [N, K/2], B = activations
    [M, K/2] with the scale roles swapped and C as the transposed (column-major) view of the
    [M, N] output, so decode's M = 1..32 tokens become the MMA's N side (tile_n 8..32) and the
    weight rows fill the 128-row MMA. ``feature_along_m`` tells the epilogue that per-feature
    vectors (alpha vector, bias) are indexed by the MMA row.

Split-K (``config.split_k = S > 1``)
    work tile (m, n, s) accumulates K tiles [s*T/S, (s+1)*T/S) (T = ceil(K/256)), stores its
    fp32 partial to a thread-major workspace (16-byte stores), fences (release, gpu scope) and
    bumps a per-tile counter with an atomic add. The split that observes S-1 (the last one)
    loads all S partials (all loads of a round issued before the first add; S is a compile-time
    constant) and sums them **in the fixed order s = 0..S-1**, applies the epilogue and resets
    the counter to 0 for the next launch. The sum order does not depend on arrival order, so
    the result is deterministic (bitwise run-to-run) and deadlock-free (nobody spins). A split
    that gets no K tile (split_k > T) contributes zeros.

Constraints (config: :func:`nvgemm.templates.sm100_w4a4.config.validate_config`; problem:
:func:`nvgemm.templates.sm100_w4a4.validity.can_implement_problem`)
    tile_m 128 (1-CTA) or 256 (2-CTA, cluster_m even); tile_n in 8..256 (< 64 only with
    tile_m 128, cluster_n 1 and a single N tile: N <= tile_n); tile_k 256; K % 32 == 0
    (16-byte TMA rows of packed FP4); output rows a multiple of 16 bytes; split_k <= the
    number of 256-wide K tiles. Ragged M/N/K tails are handled by TMA zero-fill on loads,
    TMA clipping on native stores and predicated swap-AB stores.

Gated SiLU-mul (``activation="silu_mul"``)
    needs the gate/up weight rows **interleaved** (GEMM row 2j = gate j, 2j+1 = up j; see
    :func:`nvgemm.templates.sm100_w4a4.launch.interleave_gate_up`), so a gate and its up value meet in
    one thread (adjacent accumulator columns) or in adjacent lanes (swap-AB: one shuffle). The
    output has N/2 features; alpha/bias apply per GEMM row before the activation.

Numerics: every epilogue step is fp32 and the output is rounded once; the compiler contracts
``acc*alpha + bias`` (and ``silu*up + residual``) into one ``fma.rn.f32`` -- one fp32 rounding
fewer than the emulated op's separate multiply and add (see docs/numerics.md).

Hardware numbers (target arch; ``max_active_clusters``, see
:mod:`nvgemm.templates.sm100_w4a4.occupancy`) are explicit arguments; nothing is probed at import.
One compile serves every M, N and K (they are runtime Int32s).
"""

from __future__ import annotations


import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

from nvgemm.epilogues.cute_apply import CuteEpilogue, _cute_dtype
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.templates.sm100_w4a4.config import TEMPLATE_ID, Sm100Nvfp4GemmConfig, validate_config
from nvgemm.templates.sm100_w4a4.validity import MIN_TMA_STORE_COLS, can_implement_problem
from nvgemm.templates.sm100_w4a4.epilogue import Sm100EpilogueMixin
from nvgemm.aot.abi import PointerArg, ScalarArg, StreamArg, compile_for_target, fake_args, register_template
from nvgemm.core.status import Status
from nvgemm.templates.sm100_w4a4.occupancy import aot_max_active_clusters

SF_VEC_SIZE = 16
SM100_SMEM_BYTES = 232448  # 227 KiB usable dynamic smem per CTA on sm_100
SM100_TMEM_COLS = 512


class Sm100Nvfp4GemmKernel(Sm100EpilogueMixin):
    """nvgemm's sm_100a NVFP4 block-scaled GEMM; see the module docstring for roles/pipelines.

    :param config: tile / cluster / swap / split-K / PDL / prefetch knobs (validated).
    :param epilogue: the epilogue spec (alpha kind, bias, activation, residual, out dtype).
    :param max_active_clusters: clusters resident at once on the target (GPC-aware; see
        :mod:`nvgemm.templates.sm100_w4a4.occupancy`); sizes the persistent grid. Explicit, never probed.
    :param bias_dtype / residual_dtype: element types of those operands (torch dtypes).
    """

    def __init__(
        self,
        config: Sm100Nvfp4GemmConfig,
        epilogue: EpilogueSpec,
        max_active_clusters: int,
        bias_dtype=None,
        residual_dtype=None,
    ):
        validate_config(config).raise_if_failed("sm100 nvfp4 config")
        if max_active_clusters < 1:
            raise ValueError(f"nvgemm_cutedsl: max_active_clusters must be >= 1, got {max_active_clusters}")
        self.max_active_clusters = int(max_active_clusters)
        self.gated = epilogue.gated
        self.config = config
        self.spec = epilogue
        self.epi = CuteEpilogue(epilogue)
        self.feature_along_m = config.swap_ab
        if epilogue.out_quant and not (config.swap_ab and config.tile_m == 128):
            raise ValueError(f"nvgemm_cutedsl: the fused NVFP4 requant epilogue (out_quant) is implemented for "
                             f"1-CTA swap-AB tiles only; {config.name()} is not one")
        self.c_dtype = self.epi.cast.cute_dtype
        self.bias_dtype = _cute_dtype(bias_dtype or epilogue.out_dtype)
        self.residual_dtype = _cute_dtype(residual_dtype or epilogue.out_dtype)

        self.acc_dtype = cutlass.Float32
        self.a_dtype = cutlass.Float4E2M1FN
        self.b_dtype = cutlass.Float4E2M1FN
        self.sf_dtype = cutlass.Float8E4M3FN
        self.sf_vec_size = SF_VEC_SIZE
        self.use_2cta = config.use_2cta
        self.cta_group = tcgen05.CtaGroup.TWO if self.use_2cta else tcgen05.CtaGroup.ONE
        self.cluster_shape_mn = (config.cluster_m, config.cluster_n)
        self.mma_tiler_mn = (config.tile_m, config.tile_n)
        self.split_k = config.split_k
        self.pdl = config.pdl
        self.l2_prefetch = config.l2_prefetch

        if not config.swap_ab and min(config.tile_n, 32) // (2 if self.gated else 1) < MIN_TMA_STORE_COLS:
            raise ValueError(
                f"nvgemm_cutedsl: {config.name()} with {epilogue.activation} writes output sub-tiles narrower than "
                f"{MIN_TMA_STORE_COLS} columns (the TMA-store epilogue's minimum; gated native tiles need tile_n >= 16)"
            )

        self.epilog_warp_id = (0, 1, 2, 3)
        self.mma_warp_id = 4
        self.tma_warp_id = 5
        self.threads_per_cta = 32 * 6
        self.num_epi_threads = 32 * len(self.epilog_warp_id)
        self.epilog_sync_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_epi_threads)
        self.tmem_alloc_barrier = pipeline.NamedBarrier(barrier_id=2, num_threads=32 * 5)
        self.smem_capacity = SM100_SMEM_BYTES
        self.num_tmem_alloc_cols = SM100_TMEM_COLS

    # ------------------------------------------------------------------ static setup

    def _make_tiled_mmas(self):
        mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype, self.b_dtype, OperandMajorMode.K, OperandMajorMode.K,
            self.sf_dtype, self.sf_vec_size, self.cta_group, self.mma_tiler_mn,
        )
        # SFB is always loaded / copied as whole 128-row atoms; narrow or 192-wide N tiles
        # address a column offset inside them.
        mma_sfb = sm100_utils.make_blockscaled_trivial_tiled_mma(
            self.a_dtype, self.b_dtype, OperandMajorMode.K, OperandMajorMode.K,
            self.sf_dtype, self.sf_vec_size, tcgen05.CtaGroup.ONE, self.mma_tiler_mn_sfb,
        )
        return mma, mma_sfb

    def _setup_attributes(self):
        """Values derived from dtypes and the config: MMA/tile shapes, stages, smem layouts."""
        self.mma_tiler_mn_sfb = (
            self.mma_tiler_mn[0] // (2 if self.use_2cta else 1),
            cute.round_up(self.mma_tiler_mn[1], 128),
        )
        tiled_mma, tiled_mma_sfb = self._make_tiled_mmas()
        mma_inst_k = cute.size(tiled_mma.shape_mnk, mode=[2])
        self.mma_k_blocks = 4  # 4 x 64 = tile_k 256
        tile_k = mma_inst_k * self.mma_k_blocks
        self.mma_tiler = (*self.mma_tiler_mn, tile_k)
        self.mma_tiler_sfb = (*self.mma_tiler_mn_sfb, tile_k)
        v = cute.size(tiled_mma.thr_id.shape)
        self.cta_tile_shape_mnk = (self.mma_tiler[0] // v, self.mma_tiler[1], tile_k)

        self.cluster_layout_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma.thr_id.shape,)
        )
        self.cluster_layout_sfb_vmnk = cute.tiled_divide(
            cute.make_layout((*self.cluster_shape_mn, 1)), (tiled_mma_sfb.thr_id.shape,)
        )
        self.num_mcast_ctas_a = cute.size(self.cluster_layout_vmnk.shape[2])
        self.num_mcast_ctas_b = cute.size(self.cluster_layout_vmnk.shape[1])
        self.is_a_mcast = self.num_mcast_ctas_a > 1
        self.is_b_mcast = self.num_mcast_ctas_b > 1

        # Epilogue sub-tile (128 rows: one per epilogue thread, x epi_n columns per TMEM load),
        # store path and C smem stages.
        self._setup_epilogue_attributes()

        self.num_acc_stage = 1 if self.cta_tile_shape_mnk[1] == 256 else 2
        self.num_ab_stage = self._compute_ab_stages(tiled_mma)

        self.a_smem_layout_staged = sm100_utils.make_smem_layout_a(
            tiled_mma, self.mma_tiler, self.a_dtype, self.num_ab_stage
        )
        self.b_smem_layout_staged = sm100_utils.make_smem_layout_b(
            tiled_mma, self.mma_tiler, self.b_dtype, self.num_ab_stage
        )
        self.sfa_smem_layout_staged = blockscaled_utils.make_smem_layout_sfa(
            tiled_mma, self.mma_tiler, self.sf_vec_size, self.num_ab_stage
        )
        self.sfb_smem_layout_staged = blockscaled_utils.make_smem_layout_sfb(
            tiled_mma, self.mma_tiler, self.sf_vec_size, self.num_ab_stage
        )

        sf_atom_mn = 32
        self.num_sfa_tmem_cols = (self.cta_tile_shape_mnk[0] // sf_atom_mn) * self.mma_k_blocks
        self.num_sfb_tmem_cols = (self.mma_tiler_mn_sfb[1] // sf_atom_mn) * self.mma_k_blocks
        self.num_acc_tmem_cols = self.cta_tile_shape_mnk[1] * self.num_acc_stage
        total = self.num_acc_tmem_cols + self.num_sfa_tmem_cols + self.num_sfb_tmem_cols
        assert total <= SM100_TMEM_COLS, f"TMEM over-subscribed: {total} columns"

    def _compute_ab_stages(self, tiled_mma) -> int:
        one = (
            cute.size_in_bytes(self.a_dtype, sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, self.a_dtype, 1))
            + cute.size_in_bytes(self.b_dtype, sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, self.b_dtype, 1))
            + cute.size_in_bytes(
                self.sf_dtype, blockscaled_utils.make_smem_layout_sfa(tiled_mma, self.mma_tiler, self.sf_vec_size, 1)
            )
            + cute.size_in_bytes(
                self.sf_dtype, blockscaled_utils.make_smem_layout_sfb(tiled_mma, self.mma_tiler, self.sf_vec_size, 1)
            )
        )
        reserved = 2048 + self._c_smem_bytes()  # barriers, TMEM pointer, split-K flag, slack; C stages
        return max(2, min(12, (self.smem_capacity - reserved) // one))

    # ------------------------------------------------------------------ host entry

    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        c_ptr: cute.Pointer,
        alpha_ptr: cute.Pointer,
        bias_ptr: cute.Pointer,
        residual_ptr: cute.Pointer,
        workspace_ptr: cute.Pointer,
        counter_ptr: cute.Pointer,
        m: cutlass.Int32,
        n: cutlass.Int32,
        k: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        """Host side: tensors from raw pointers + runtime (m, n, k), TMA atoms, smem, grid, launch.

        ``m, n`` are the MMA problem's sizes (swap-AB: m = layer N, n = tokens); ``c_ptr`` and
        ``residual_ptr`` address [m, n] row-major, or column-major when ``swap_ab`` (the
        transposed view of a row-major [tokens, N] output). Unused pointers may be null.
        """
        self._host_launch(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, alpha_ptr, bias_ptr, residual_ptr, workspace_ptr,
                          counter_ptr, m, n, k, stream)

    @cute.jit
    def _host_launch(self, a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, alpha_ptr, bias_ptr, residual_ptr, workspace_ptr,
                     counter_ptr, m, n, k, stream, mTiles=None, a_rows=None, fin=None, nxt=None):
        """The body of :meth:`__call__` (traced inline). A grouped variant passes its work list
        ``mTiles`` and the row count ``a_rows`` of its stacked A operand, ``fin``, the tensors of a
        finalize it runs after its tiles (:meth:`_tile_done`), and ``nxt`` = (A pointer, SFA pointer, rows,
        stacked rows, K) of the next GEMM's weights, which its TMA warp L2-prefetches after its own loads
        (:meth:`_prefetch_next`); the dense kernel passes none (see the work hooks below)."""
        if cutlass.const_expr(fin is None):
            fin = (None, None, None, None, None, None)
        self._setup_attributes()
        tiled_mma, tiled_mma_sfb = self._make_tiled_mmas()

        # (M, K, L) / (N, K, L), K-major; K is a multiple of 32 (16-byte TMA rows).
        kk = cute.assume(k, divby=32)
        mA = cute.make_tensor(a_ptr, cute.make_ordered_layout((m if a_rows is None else a_rows, kk, 1),
                                                              order=(1, 0, 2)))
        mB = cute.make_tensor(b_ptr, cute.make_ordered_layout((n, kk, 1), order=(1, 0, 2)))
        c_order = (0, 1, 2) if self.config.swap_ab else (1, 0, 2)
        # 16-byte output rows (the launcher checks N * out_bytes % 16 == 0, and allocates C,
        # alpha, bias and the residual 16-byte aligned): TMA stores of C, vector loads of the
        # residual row and of alpha/bias.
        c_div = 16 * 8 // self.c_dtype.width
        # gated: the output has half the GEMM's features (rows when swap-AB, else columns)
        m_out = m
        n_out = n
        if cutlass.const_expr(self.gated):
            if cutlass.const_expr(self.config.swap_ab):
                m_out = m // 2
            else:
                n_out = n // 2
        if cutlass.const_expr(self.spec.out_quant):
            pass  # packed-code output: the launcher checks I % 16 == 0 (8-byte rows of codes)
        elif cutlass.const_expr(self.config.swap_ab):
            m_out = cute.assume(m_out, divby=c_div)
        else:
            n_out = cute.assume(n_out, divby=c_div)
        feat = m if self.feature_along_m else n
        if cutlass.const_expr(self.spec.out_quant):
            # fused requant (swap-AB, see epilogue._store_requant): c_ptr = packed codes [tokens, m/4]
            # bytes (col-major view (m/4, tokens)), residual_ptr = the 128x4-swizzled e4m3 scales of the
            # [tokens, m/32] matrix (1-D bytes, zero-allocated; a (bytes, 1, 1) view so the epilogue's
            # residual partitions still trace; never read); the next layer's input_scale follows the
            # alpha values in alpha_ptr (index 0 / 1 / feat for alpha none / scalar / vector)
            mC = cute.make_tensor(c_ptr, cute.make_ordered_layout((m // 4, n, 1), order=c_order))
            kb4 = (m // 32 + 3) // 4
            mR = cute.make_tensor(residual_ptr, cute.make_layout((self._sf_atoms(n) * 512 * kb4, 1, 1)))
            mAlpha = cute.make_tensor(alpha_ptr, cute.make_layout(feat + 1))
        else:
            mC = cute.make_tensor(c_ptr, cute.make_ordered_layout((m_out, n_out, 1), order=c_order))
            mR = cute.make_tensor(residual_ptr, cute.make_ordered_layout((m_out, n_out, 1), order=c_order))
            mAlpha = cute.make_tensor(alpha_ptr, cute.make_layout(feat))
        mBias = cute.make_tensor(bias_ptr, cute.make_layout(feat))
        mSFA = cute.make_tensor(sfa_ptr, blockscaled_utils.tile_atom_to_shape_SF(mA.shape, self.sf_vec_size))
        mSFB = cute.make_tensor(sfb_ptr, blockscaled_utils.tile_atom_to_shape_SF(self._sfb_shape(mB.shape, n, kk),
                                                                                 self.sf_vec_size))

        atom_thr_size = cute.size(tiled_mma.thr_id.shape)
        a_smem_layout = cute.slice_(self.a_smem_layout_staged, (None, None, None, 0))
        b_smem_layout = cute.slice_(self.b_smem_layout_staged, (None, None, None, 0))
        sfa_smem_layout = cute.slice_(self.sfa_smem_layout_staged, (None, None, None, 0))
        sfb_smem_layout = cute.slice_(self.sfb_smem_layout_staged, (None, None, None, 0))
        tma_atom_a, tma_a, tma_atom_sfa, tma_sfa = self._a_atoms(mA, mSFA, a_smem_layout, sfa_smem_layout, tiled_mma)
        tma_atom_b, tma_b = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_B(self.cluster_shape_mn, tiled_mma.thr_id),
            mB, b_smem_layout, self.mma_tiler, tiled_mma, self.cluster_layout_vmnk.shape,
        )
        tma_atom_sfb, tma_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            sm100_utils.cluster_shape_to_tma_atom_SFB(self.cluster_shape_mn, tiled_mma.thr_id),
            mSFB, sfb_smem_layout, self.mma_tiler_sfb, tiled_mma_sfb, self.cluster_layout_sfb_vmnk.shape,
            internal_type=cutlass.Int16,
        )
        if cutlass.const_expr(self.cta_tile_shape_mnk[1] == 192):
            tma_sfb = self._sfb_view_for_n192(tma_sfb)
        # prefetch-only TMA atoms over the next GEMM's weights: the same box as A / SFA (128 rows x tile_k)
        nxt_atoms = (None, None, None, None, None)
        if cutlass.const_expr(nxt is not None):
            na_ptr, nsfa_ptr, n_m, n_rows, n_k = nxt
            nkk = cute.assume(n_k, divby=32)
            mNA = cute.make_tensor(na_ptr, cute.make_ordered_layout((n_rows, nkk, 1), order=(1, 0, 2)))
            mNSFA = cute.make_tensor(nsfa_ptr, blockscaled_utils.tile_atom_to_shape_SF(mNA.shape, self.sf_vec_size))
            nxt_atoms = (*self._a_atoms(mNA, mNSFA, a_smem_layout, sfa_smem_layout, tiled_mma), n_m)

        self.num_tma_load_bytes = (
            cute.size_in_bytes(self.a_dtype, a_smem_layout)
            + cute.size_in_bytes(self.b_dtype, b_smem_layout)
            + cute.size_in_bytes(self.sf_dtype, sfa_smem_layout)
            + cute.size_in_bytes(self.sf_dtype, sfb_smem_layout)
        ) * atom_thr_size

        # Persistent grid over (m cta-tiles, n tiles, k splits).
        num_tiles_m = cute.ceil_div(m, self.cta_tile_shape_mnk[0])
        num_tiles_m = cute.round_up(num_tiles_m, self.cluster_shape_mn[0])
        num_tiles_n = cute.ceil_div(n, self.cta_tile_shape_mnk[1])
        num_tiles_n = cute.round_up(num_tiles_n, self.cluster_shape_mn[1])
        sched_params = utils.PersistentTileSchedulerParams(
            (num_tiles_m, num_tiles_n, self.split_k), (*self.cluster_shape_mn, 1)
        )
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched_params, self.max_active_clusters)

        # Split-K workspace, thread-major: element e of 16-byte vector j of epilogue thread t in
        # sub-tile st of split s of tile T sits at e + 4t + 512j + 128*epi_n*st + 128*tile_n*(s + S*T).
        cta_m, cta_n = self.cta_tile_shape_mnk[0], self.cta_tile_shape_mnk[1]
        mWs = cute.make_tensor(workspace_ptr, cute.make_layout(
            ((4, self.epi_n // 4), self.num_epi_threads, self.subtile_cnt, self.split_k, num_tiles_m * num_tiles_n),
            stride=((1, 4 * self.num_epi_threads), 4, cta_m * self.epi_n, cta_m * cta_n, cta_m * cta_n * self.split_k),
        ))
        mCnt = cute.make_tensor(counter_ptr, cute.make_layout(num_tiles_m * num_tiles_n))

        # TMA store of C (native tiles): one (128, out_w) sub-tile per bulk store.
        tma_atom_c = None
        tma_c = mC
        c_smem_elems = 16
        if cutlass.const_expr(self.use_tma_store):
            c_smem_layout = cute.slice_(self.c_smem_layout_staged, (None, None, 0))
            tma_atom_c, tma_c = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mC, c_smem_layout, (self.epi_tile[0], self.out_w)
            )
            c_smem_elems = self._c_smem_elems()

        @cute.struct
        class SharedStorage:
            ab_full_mbar: cute.struct.MemRange[cutlass.Int64, self.num_ab_stage]
            ab_empty_mbar: cute.struct.MemRange[cutlass.Int64, self.num_ab_stage]
            acc_full_mbar: cute.struct.MemRange[cutlass.Int64, self.num_acc_stage]
            acc_empty_mbar: cute.struct.MemRange[cutlass.Int64, self.num_acc_stage]
            tmem_dealloc_mbar: cutlass.Int64
            tmem_holding_buf: cutlass.Int32
            splitk_flag: cutlass.Int32
            sA: cute.struct.Align[
                cute.struct.MemRange[self.a_dtype, cute.cosize(self.a_smem_layout_staged.outer)], 1024
            ]
            sB: cute.struct.Align[
                cute.struct.MemRange[self.b_dtype, cute.cosize(self.b_smem_layout_staged.outer)], 1024
            ]
            sSFA: cute.struct.Align[
                cute.struct.MemRange[self.sf_dtype, cute.cosize(self.sfa_smem_layout_staged)], 1024
            ]
            sSFB: cute.struct.Align[
                cute.struct.MemRange[self.sf_dtype, cute.cosize(self.sfb_smem_layout_staged)], 1024
            ]
            sC: cute.struct.Align[cute.struct.MemRange[self.c_dtype, c_smem_elems], 1024]

        self.shared_storage = SharedStorage
        smem_bytes = SharedStorage.size_in_bytes()
        if cutlass.const_expr(smem_bytes > self.smem_capacity):
            raise ValueError(f"nvgemm_cutedsl: {self.config.name()} needs {smem_bytes} bytes of shared memory, "
                             f"over the {self.smem_capacity} available")

        self.kernel(
            tiled_mma, tiled_mma_sfb,
            tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_sfa, tma_sfa, tma_atom_sfb, tma_sfb,
            mC, mR, mAlpha, mBias, mWs, mCnt, tma_atom_c, tma_c, self.c_smem_layout_staged, m, n,
            self.cluster_layout_vmnk, self.cluster_layout_sfb_vmnk,
            self.a_smem_layout_staged, self.b_smem_layout_staged,
            self.sfa_smem_layout_staged, self.sfb_smem_layout_staged,
            sched_params, num_tiles_n, mTiles, *fin, *nxt_atoms,
        ).launch(
            grid=grid,
            block=[self.threads_per_cta, 1, 1],
            cluster=(*self.cluster_shape_mn, 1),
            stream=stream,
            min_blocks_per_mp=1,
            use_pdl=self.pdl,
        )

    @cute.jit
    def _sfb_view_for_n192(self, tma_sfb: cute.Tensor) -> cute.Tensor:
        """tile_n 192: SFB is loaded as 256-row blocks; re-stride the N-rest mode so that N
        tile j starts at row 192*j (odd tiles then skip 64 rows = 2 TMEM columns)."""
        s0 = tma_sfb.stride[0][1]
        rest = cute.ceil_div(tma_sfb.shape[0][1], 4)
        shape = ((tma_sfb.shape[0][0], ((2, 2), rest)), tma_sfb.shape[1], tma_sfb.shape[2])
        stride = ((tma_sfb.stride[0][0], ((s0, s0), 3 * s0)), tma_sfb.stride[1], tma_sfb.stride[2])
        return cute.make_tensor(tma_sfb.iterator, cute.make_layout(shape, stride=stride))

    # ------------------------------------------------------------------ device kernel

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tiled_mma_sfb: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        mC_mnl: cute.Tensor,
        mR_mnl: cute.Tensor,
        mAlpha: cute.Tensor,
        mBias: cute.Tensor,
        mWs: cute.Tensor,
        mCnt: cute.Tensor,
        tma_atom_c: cute.CopyAtom,
        mC_tma: cute.Tensor,
        c_smem_layout_staged,
        m_gemm: cutlass.Int32,
        n_gemm: cutlass.Int32,
        cluster_layout_vmnk: cute.Layout,
        cluster_layout_sfb_vmnk: cute.Layout,
        a_smem_layout_staged: cute.ComposedLayout,
        b_smem_layout_staged: cute.ComposedLayout,
        sfa_smem_layout_staged: cute.Layout,
        sfb_smem_layout_staged: cute.Layout,
        sched_params: utils.PersistentTileSchedulerParams,
        num_tiles_n: cutlass.Int32,
        mTiles: cute.Tensor,
        mFinal: cute.Tensor,
        mShared: cute.Tensor,
        mResid: cute.Tensor,
        mYRows: cute.Tensor,
        mWts: cute.Tensor,
        mFlags: cute.Tensor,
        tma_atom_na,
        mNA_mkl,
        tma_atom_nsfa,
        mNSFA_mkl,
        next_m,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        use_2cta = cute.size(tiled_mma.thr_id.shape) == 2
        v_size = cute.size(tiled_mma.thr_id.shape)

        if warp_idx == self.tma_warp_id:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_sfa)
            cpasync.prefetch_descriptor(tma_atom_sfb)
            if cutlass.const_expr(tma_atom_na is not None):
                cpasync.prefetch_descriptor(tma_atom_na)
                cpasync.prefetch_descriptor(tma_atom_nsfa)

        bidx, _, _ = cute.arch.block_idx()
        mma_tile_coord_v = bidx % v_size
        is_leader_cta = mma_tile_coord_v == 0
        cta_rank_in_cluster = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        blk_vmnk = cluster_layout_vmnk.get_flat_coord(cta_rank_in_cluster)
        blk_sfb_vmnk = cluster_layout_sfb_vmnk.get_flat_coord(cta_rank_in_cluster)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        ab_pipeline = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_full_mbar.data_ptr(),
            num_stages=self.num_ab_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.num_mcast_ctas_a + self.num_mcast_ctas_b - 1
            ),
            tx_count=self.num_tma_load_bytes,
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        acc_pipeline = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_full_mbar.data_ptr(),
            num_stages=self.num_acc_stage,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, self.num_epi_threads * (2 if use_2cta else 1)
            ),
            cta_layout_vmnk=cluster_layout_vmnk,
            defer_sync=True,
        )
        tmem = utils.TmemAllocator(
            storage.tmem_holding_buf.ptr,
            barrier_for_retrieve=self.tmem_alloc_barrier,
            allocator_warp_id=self.epilog_warp_id[0],
            is_two_cta=use_2cta,
            two_cta_tmem_dealloc_mbar_ptr=storage.tmem_dealloc_mbar.ptr,
        )
        pipeline_init_arrive(cluster_shape_mn=self.cluster_shape_mn, is_relaxed=True)

        sA = storage.sA.get_tensor(a_smem_layout_staged.outer, swizzle=a_smem_layout_staged.inner)
        sB = storage.sB.get_tensor(b_smem_layout_staged.outer, swizzle=b_smem_layout_staged.inner)
        sSFA = storage.sSFA.get_tensor(sfa_smem_layout_staged)
        sSFB = storage.sSFB.get_tensor(sfb_smem_layout_staged)

        # (bM, bK, RestM, RestK, RestL) etc.
        gA = cute.local_tile(mA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB_nkl, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gSFA = cute.local_tile(mSFA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gSFB = cute.local_tile(mSFB_nkl, cute.slice_(self.mma_tiler_sfb, (0, None, None)), (None, None, None))
        k_tile_total = cute.size(gA, mode=[3])

        thr_mma = tiled_mma.get_slice(mma_tile_coord_v)
        thr_mma_sfb = tiled_mma_sfb.get_slice(mma_tile_coord_v)
        tCgA = thr_mma.partition_A(gA)
        tCgB = thr_mma.partition_B(gB)
        tCgSFA = thr_mma.partition_A(gSFA)
        tCgSFB = thr_mma_sfb.partition_B(gSFB)

        a_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, 0, None, 0)).shape)
        b_cta_layout = cute.make_layout(cute.slice_(cluster_layout_vmnk, (0, None, 0, 0)).shape)
        sfb_cta_layout = cute.make_layout(cute.slice_(cluster_layout_sfb_vmnk, (0, None, 0, 0)).shape)
        tAsA, tAgA = cpasync.tma_partition(
            tma_atom_a, blk_vmnk[2], a_cta_layout, cute.group_modes(sA, 0, 3), cute.group_modes(tCgA, 0, 3)
        )
        tBsB, tBgB = cpasync.tma_partition(
            tma_atom_b, blk_vmnk[1], b_cta_layout, cute.group_modes(sB, 0, 3), cute.group_modes(tCgB, 0, 3)
        )
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom_sfa, blk_vmnk[2], a_cta_layout, cute.group_modes(sSFA, 0, 3), cute.group_modes(tCgSFA, 0, 3)
        )
        tAsSFA = cute.filter_zeros(tAsSFA)
        tAgSFA = cute.filter_zeros(tAgSFA)
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom_sfb, blk_sfb_vmnk[1], sfb_cta_layout, cute.group_modes(sSFB, 0, 3),
            cute.group_modes(tCgSFB, 0, 3),
        )
        tBsSFB = cute.filter_zeros(tBsSFB)
        tBgSFB = cute.filter_zeros(tBgSFB)

        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        tCtAcc_fake = tiled_mma.make_fragment_C(cute.append(acc_shape, self.num_acc_stage))

        pipeline_init_wait(cluster_shape_mn=self.cluster_shape_mn)
        work = self._work(mTiles, m_gemm, (mFinal, mShared, mResid, mYRows, mWts, mFlags))
        if cutlass.const_expr(tma_atom_na is not None):
            # the next GEMM's weights, partitioned like A / SFA: (TMA box, row tile, K tile, L)
            gNA = cute.local_tile(mNA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
            gNSFA = cute.local_tile(mNSFA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
            _sNA, tNgA = cpasync.tma_partition(
                tma_atom_na, blk_vmnk[2], a_cta_layout, cute.group_modes(sA, 0, 3),
                cute.group_modes(thr_mma.partition_A(gNA), 0, 3))
            _sNSFA, tNgSFA = cpasync.tma_partition(
                tma_atom_nsfa, blk_vmnk[2], a_cta_layout, cute.group_modes(sSFA, 0, 3),
                cute.group_modes(thr_mma.partition_A(gNSFA), 0, 3))
            work.set_next(tma_atom_na, tNgA, tma_atom_nsfa, cute.filter_zeros(tNgSFA), (next_m + 127) // 128,
                          cute.size(gNA, mode=[3]))

        if warp_idx == self.tma_warp_id:
            self._tma_warp(
                ab_pipeline, sched_params, k_tile_total,
                tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB,
                tma_atom_sfa, tAgSFA, tAsSFA, tma_atom_sfb, tBgSFB, tBsSFB,
                cluster_layout_vmnk, cluster_layout_sfb_vmnk, blk_vmnk, blk_sfb_vmnk, v_size, work,
            )
        if warp_idx == self.mma_warp_id:
            self._mma_warp(
                tiled_mma, tmem, ab_pipeline, acc_pipeline, sched_params, k_tile_total,
                tCrA, tCrB, tCtAcc_fake, sSFA, sSFB, sfa_smem_layout_staged, sfb_smem_layout_staged,
                is_leader_cta, v_size, work,
            )
        if warp_idx < self.mma_warp_id:
            sC = None
            if cutlass.const_expr(self.use_tma_store):
                sC = self._c_smem_tensor(storage, c_smem_layout_staged)
            self._epilogue_warps(
                thr_mma, tmem, acc_pipeline, sched_params, tCtAcc_fake,
                mC_mnl, mR_mnl, mAlpha, mBias, mWs, mCnt, tma_atom_c, mC_tma, sC, storage,
                tidx, use_2cta, v_size, num_tiles_n, m_gemm, n_gemm, k_tile_total, work,
            )

    # ------------------------------------------------------------------ roles

    @cute.jit
    def _k_range(self, split_idx: cutlass.Int32, k_tile_total: cutlass.Int32):
        """K tiles [begin, end) of split ``split_idx``: an even partition, never empty when
        k_tile_total >= split_k (the host checks that)."""
        begin = k_tile_total * split_idx // self.split_k
        end = k_tile_total * (split_idx + 1) // self.split_k
        return begin, end - begin

    @cute.jit
    def _tma_warp(
        self, ab_pipeline, sched_params, k_tile_total,
        tma_atom_a, tAgA, tAsA, tma_atom_b, tBgB, tBsB,
        tma_atom_sfa, tAgSFA, tAsSFA, tma_atom_sfb, tBgSFB, tBsSFB,
        cluster_layout_vmnk, cluster_layout_sfb_vmnk, blk_vmnk, blk_sfb_vmnk, v_size, work,
    ):
        a_mask = None
        b_mask = None
        sfa_mask = None
        sfb_mask = None
        if cutlass.const_expr(self.is_a_mcast or self.is_b_mcast or self.use_2cta):
            a_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, blk_vmnk, mcast_mode=2)
            b_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, blk_vmnk, mcast_mode=1)
            sfa_mask = cpasync.create_tma_multicast_mask(cluster_layout_vmnk, blk_vmnk, mcast_mode=2)
            sfb_mask = cpasync.create_tma_multicast_mask(cluster_layout_sfb_vmnk, blk_sfb_vmnk, mcast_mode=1)

        tile_sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work_tile = tile_sched.initial_work_tile_info()

        prod_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_ab_stage)
        # stages of the first work tile whose A / SFA (weight) copies were issued before the PDL wait
        pre = cutlass.Int32(0)
        if cutlass.const_expr(self.pdl):
            # Weights (and their scales) are never written by a predecessor. Dense: warm L2 with the
            # first K tiles of the first work tile, then wait for the activations. Grouped, only where
            # the work list is final before the wait (``work_before_wait``; otherwise the expert of a
            # tile is the predecessor's output): acquire the first stages and issue their weight and
            # weight-scale TMA loads into the smem ring, then wait; the stages' activation loads follow
            # in the main loop (the stage's barrier expects the whole stage's bytes, so the MMA warp
            # sees the stage full only once both halves landed).
            if cutlass.const_expr(self.work_before_wait):
                if work_tile.is_valid_tile:
                    c0 = work_tile.tile_idx
                    m0 = self._a_tile(c0[0] // v_size, c0, work)
                    kb0, kc0 = self._tile_k_range(c0, k_tile_total, work)
                    pre = cutlass.min(kc0, self.num_ab_stage)
                    early_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                               self.num_ab_stage)
                    for i in cutlass.range(0, pre, 1, unroll=1):
                        ab_pipeline.producer_acquire(early_state)
                        bar = ab_pipeline.producer_get_barrier(early_state)
                        cute.copy(tma_atom_a, tAgA[(None, m0, kb0 + i, 0)], tAsA[(None, early_state.index)],
                                  tma_bar_ptr=bar, mcast_mask=a_mask)
                        cute.copy(tma_atom_sfa, tAgSFA[(None, m0, kb0 + i, 0)], tAsSFA[(None, early_state.index)],
                                  tma_bar_ptr=bar, mcast_mask=sfa_mask)
                        early_state.advance()
            elif cutlass.const_expr(work is None) and work_tile.is_valid_tile:
                c0 = work_tile.tile_idx
                kb0, kc0 = self._k_range(c0[2], k_tile_total)
                for i in cutlass.range(0, cutlass.min(kc0, self.num_ab_stage), 1, unroll=1):
                    # one lane issues (a prefetch is per thread: a whole warp would request each box 32 times)
                    with cute.arch.elect_one():
                        if cutlass.const_expr(self.config.swap_ab):
                            cute.prefetch(tma_atom_a, tAgA[(None, c0[0] // v_size, kb0 + i, 0)])
                            cute.prefetch(tma_atom_sfa, tAgSFA[(None, c0[0] // v_size, kb0 + i, 0)])
                        else:
                            cute.prefetch(tma_atom_b, tBgB[(None, c0[1], kb0 + i, 0)])
                            cute.prefetch(tma_atom_sfb, tBgSFB[(None, self._sfb_slice_n(c0[1]), kb0 + i, 0)])
            cute.arch.griddepcontrol_wait()

        while work_tile.is_valid_tile:
            coord = work_tile.tile_idx
            mma_m = self._a_tile(coord[0] // v_size, coord, work)
            mma_n = coord[1]
            k_begin, k_cnt = self._tile_k_range(coord, k_tile_total, work)
            tAgA_s = tAgA[(None, mma_m, None, 0)]
            tBgB_s = tBgB[(None, mma_n, None, 0)]
            tAgSFA_s = tAgSFA[(None, mma_m, None, 0)]
            tBgSFB_s = tBgSFB[(None, self._sfb_slice_n(mma_n), None, 0)]

            prod_state.reset_count()
            peek = cutlass.Boolean(1)
            if prod_state.count < k_cnt:
                peek = ab_pipeline.producer_try_acquire(prod_state)
            for _kt in cutlass.range(0, k_cnt, 1, unroll=1):
                kt = k_begin + prod_state.count
                if cutlass.const_expr(self.l2_prefetch):
                    if prod_state.count + self.num_ab_stage < k_cnt:
                        kf = kt + self.num_ab_stage
                        with cute.arch.elect_one():  # one request per box, not one per lane
                            cute.prefetch(tma_atom_a, tAgA_s[(None, kf)])
                            cute.prefetch(tma_atom_b, tBgB_s[(None, kf)])
                            cute.prefetch(tma_atom_sfa, tAgSFA_s[(None, kf)])
                            cute.prefetch(tma_atom_sfb, tBgSFB_s[(None, kf)])
                if cutlass.const_expr(self.work_before_wait):
                    if prod_state.count >= pre:  # else acquired, weights in flight: the activations only
                        ab_pipeline.producer_acquire(prod_state, peek)
                else:
                    ab_pipeline.producer_acquire(prod_state, peek)
                bar = ab_pipeline.producer_get_barrier(prod_state)
                if cutlass.const_expr(self.work_before_wait):
                    if prod_state.count >= pre:
                        cute.copy(tma_atom_a, tAgA_s[(None, kt)], tAsA[(None, prod_state.index)], tma_bar_ptr=bar,
                                  mcast_mask=a_mask)
                        cute.copy(tma_atom_sfa, tAgSFA_s[(None, kt)], tAsSFA[(None, prod_state.index)],
                                  tma_bar_ptr=bar, mcast_mask=sfa_mask)
                else:
                    cute.copy(tma_atom_a, tAgA_s[(None, kt)], tAsA[(None, prod_state.index)], tma_bar_ptr=bar,
                              mcast_mask=a_mask)
                cute.copy(tma_atom_b, tBgB_s[(None, kt)], tBsB[(None, prod_state.index)], tma_bar_ptr=bar, mcast_mask=b_mask)
                if cutlass.const_expr(not self.work_before_wait):
                    cute.copy(tma_atom_sfa, tAgSFA_s[(None, kt)], tAsSFA[(None, prod_state.index)], tma_bar_ptr=bar,
                              mcast_mask=sfa_mask)
                cute.copy(tma_atom_sfb, tBgSFB_s[(None, kt)], tBsSFB[(None, prod_state.index)], tma_bar_ptr=bar,
                          mcast_mask=sfb_mask)
                prod_state.advance()
                peek = cutlass.Boolean(1)
                if prod_state.count < k_cnt:
                    peek = ab_pipeline.producer_try_acquire(prod_state)
            tile_sched.advance_to_next_work()
            work_tile = tile_sched.get_current_work()
            if cutlass.const_expr(self.work_before_wait):
                pre = cutlass.Int32(0)  # the early weight stages were the first work tile's only

        self._prefetch_next(sched_params, work, v_size)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        ab_pipeline.producer_tail(prod_state)

    # ------------------------------------------------------------------ work hooks (dense: identity)
    # A grouped variant (nvgemm.templates.sm100_moe) overrides these to read a device work list;
    # the dense kernel's traced code is unchanged by them.

    #: N tiles narrower than an SFB atom read their scales at a TMEM column offset of a shared atom
    #: (dense); False: every N tile owns a whole 128-row SFB atom (grouped: one atom per work slot).
    sfb_col_offsets = True

    #: The work list may be read before ``griddepcontrol.wait`` (a grouped kernel whose routing was
    #: written by a grid that completed before its predecessor's wait); dense: no work list.
    work_before_wait = False

    def _work(self, mTiles, m_gemm, fin):
        """Per-kernel work-list context handed to the roles (None: a dense GEMM)."""
        return None

    def _prefetch_next(self, sched_params, work, v_size):
        """TMA warp, after its last load is issued, before ``launch_dependents``: L2 prefetches of the next
        GEMM's weights (a grouped variant's; dense: nothing, no code)."""

    def _tile_done(self, coord, work, mC, mCnt, sFlag, tidx, m_gemm, num_tiles_n):
        """After the epilogue threads stored work tile ``coord`` (the split-K reduction's CTA only):
        a grouped variant's cross-tile step (dense: nothing, no code)."""

    def _a_tile(self, mma_m, coord, work):
        """Index of the A (weight) MMA tile of work tile ``coord`` (dense: its M coordinate)."""
        return mma_m

    def _tile_k_range(self, coord, k_tile_total, work):
        """(first K tile, K tile count) of work tile ``coord``."""
        return self._k_range(coord[2], k_tile_total)

    def _tile_alpha(self, mAlpha, alpha_s, coord, work):
        """(alpha tensor, scalar alpha) of work tile ``coord``."""
        return mAlpha, alpha_s

    def _sfb_shape(self, b_shape, n, kk):
        """(rows, K, L) of the SFB tensor (dense: B's shape)."""
        return b_shape

    def _sf_atoms(self, n):
        """128-row scale atoms of the fused-requant output for ``n`` token rows."""
        return (n + 127) // 128

    @cute.jit
    def _sfb_slice_n(self, mma_n: cutlass.Int32) -> cutlass.Int32:
        """Index of the 128-row SFB block (atom) that holds N tile ``mma_n``."""
        r = mma_n
        if cutlass.const_expr(self.cta_tile_shape_mnk[1] < 128):
            r = mma_n // (128 // self.cta_tile_shape_mnk[1])
        return r

    @cute.jit
    def _mma_warp(
        self, tiled_mma, tmem, ab_pipeline, acc_pipeline, sched_params, k_tile_total,
        tCrA, tCrB, tCtAcc_fake, sSFA, sSFB, sfa_smem_layout_staged, sfb_smem_layout_staged,
        is_leader_cta, v_size, work,
    ):
        if cutlass.const_expr(self.pdl and work is not None):
            cute.arch.griddepcontrol_wait()  # the work list (each tile's K range) comes from the predecessor
        tmem.wait_for_alloc()
        acc_tmem_ptr = tmem.retrieve_ptr(self.acc_dtype)
        tCtAcc_base = cute.make_tensor(acc_tmem_ptr, tCtAcc_fake.layout)

        sfa_tmem_ptr = cute.recast_ptr(acc_tmem_ptr + self.num_acc_tmem_cols, dtype=self.sf_dtype)
        tCtSFA_layout = blockscaled_utils.make_tmem_layout_sfa(
            tiled_mma, self.mma_tiler, self.sf_vec_size, cute.slice_(sfa_smem_layout_staged, (None, None, None, 0))
        )
        tCtSFA = cute.make_tensor(sfa_tmem_ptr, tCtSFA_layout)
        sfb_col0 = self.num_acc_tmem_cols + self.num_sfa_tmem_cols
        sfb_tmem_ptr = cute.recast_ptr(acc_tmem_ptr + sfb_col0, dtype=self.sf_dtype)
        tCtSFB_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma, self.mma_tiler, self.sf_vec_size, cute.slice_(sfb_smem_layout_staged, (None, None, None, 0))
        )
        tCtSFB = cute.make_tensor(sfb_tmem_ptr, tCtSFB_layout)

        copy_s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_partition(sSFA, tCtSFA)
        copy_s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_partition(sSFB, tCtSFB)

        tile_sched = utils.StaticPersistentTileScheduler.create(
            sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
        )
        work_tile = tile_sched.initial_work_tile_info()
        cons_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.num_ab_stage)
        acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.num_acc_stage)

        while work_tile.is_valid_tile:
            coord = work_tile.tile_idx
            mma_n = coord[1]
            _k_begin, k_cnt = self._tile_k_range(coord, k_tile_total, work)
            tCtAcc = tCtAcc_base[(None, None, None, acc_state.index)]

            cons_state.reset_count()
            peek = cutlass.Boolean(1)
            if cons_state.count < k_cnt and is_leader_cta:
                peek = ab_pipeline.consumer_try_wait(cons_state)
            if is_leader_cta:
                acc_pipeline.producer_acquire(acc_state)

            # Narrow (<128) and 192-wide N tiles read their scales at a column offset of the
            # 128-row (256-row for 192) SFB block: 32 rows per TMEM column.
            tCtSFB_mma = tCtSFB
            if cutlass.const_expr(self.sfb_col_offsets and self.cta_tile_shape_mnk[1] in (32, 64, 192)):
                off = cutlass.Int32(0)
                if cutlass.const_expr(self.cta_tile_shape_mnk[1] == 192):
                    off = (mma_n % 2) * 2
                else:
                    per = 128 // self.cta_tile_shape_mnk[1]
                    off = (mma_n % per) * (self.cta_tile_shape_mnk[1] // 32)
                tCtSFB_mma = cute.make_tensor(
                    cute.recast_ptr(acc_tmem_ptr + sfb_col0 + off, dtype=self.sf_dtype), tCtSFB_layout
                )

            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            for kt in cutlass.range(0, k_cnt, 1, unroll=1):
                if is_leader_cta:
                    ab_pipeline.consumer_wait(cons_state, peek)
                    st = (None, None, None, None, cons_state.index)
                    cute.copy(copy_s2t_sfa, tCsSFA_s2t[st], tCtSFA_s2t)
                    cute.copy(copy_s2t_sfb, tCsSFB_s2t[st], tCtSFB_s2t)
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, kt != 0)
                    blk = (None, None, None, cons_state.index)
                    cute.gemm(tiled_mma, tCtAcc, [tCrA[blk], tCtSFA], [tCrB[blk], tCtSFB_mma], tCtAcc)
                    ab_pipeline.consumer_release(cons_state)
                cons_state.advance()
                peek = cutlass.Boolean(1)
                if cons_state.count < k_cnt:
                    if is_leader_cta:
                        peek = ab_pipeline.consumer_try_wait(cons_state)
            if is_leader_cta:
                acc_pipeline.producer_commit(acc_state)
            acc_state.advance()
            tile_sched.advance_to_next_work()
            work_tile = tile_sched.get_current_work()

        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        acc_pipeline.producer_tail(acc_state)

    def _a_atoms(self, mA, mSFA, a_smem_layout, sfa_smem_layout, tiled_mma):
        """(atom, tensor) TMA pairs of an A-side weight operand and its scales (this GEMM's, or the next GEMM's
        for L2 prefetches only: the same 128-row x tile_k box)."""
        op = sm100_utils.cluster_shape_to_tma_atom_A(self.cluster_shape_mn, tiled_mma.thr_id)
        shape = self.cluster_layout_vmnk.shape
        atom_a, tma_a = cute.nvgpu.make_tiled_tma_atom_A(op, mA, a_smem_layout, self.mma_tiler, tiled_mma, shape)
        atom_sfa, tma_sfa = cute.nvgpu.make_tiled_tma_atom_A(op, mSFA, sfa_smem_layout, self.mma_tiler, tiled_mma,
                                                             shape, internal_type=cutlass.Int16)
        return atom_a, tma_a, atom_sfa, tma_sfa

    def _s2t_partition(self, sSF: cute.Tensor, tSF: cute.Tensor):
        """tcgen05.cp (4x32x128b, broadcast to the 4 lane quadrants) of one scale stage."""
        tCsSF = cute.filter_zeros(sSF)
        tCtSF = cute.filter_zeros(tSF)
        atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(self.cta_group), self.sf_dtype)
        tiled_copy = tcgen05.make_s2t_copy(atom, tCtSF)
        thr = tiled_copy.get_slice(0)
        src = tcgen05.get_s2t_smem_desc_tensor(tiled_copy, thr.partition_S(tCsSF))
        dst = thr.partition_D(tCtSF)
        return tiled_copy, src, dst



# ---------------------------------------------------------------------- template (kernels cache)

_CUTE_DTYPE_NAME = {"bfloat16": "BFloat16", "float16": "Float16", "float32": "Float32"}


def _dtype_name(dt) -> str:
    return _CUTE_DTYPE_NAME[str(dt).replace("torch.", "")]


def max_active_clusters_for(spec) -> int:
    """The persistent grid's cluster count baked into a kernel: ``spec.hw.max_active_clusters``
    when the caller measured it (the runtime's driver query), else the arch's guaranteed value
    (:func:`nvgemm.templates.sm100_w4a4.occupancy.aot_max_active_clusters`)."""
    if spec.hw.max_active_clusters:
        return spec.hw.max_active_clusters
    return aot_max_active_clusters(spec.arch, spec.hw.sm_count, spec.config.cluster_m * spec.config.cluster_n)


class Sm100Nvfp4GemmTemplate:
    """:class:`nvgemm.aot.abi.KernelTemplate` of :class:`Sm100Nvfp4GemmKernel`.

    C ABI (in order): pointers ``a, b, sfa, sfb, c, alpha, bias, residual, workspace,
    counters``, int32 ``m, n, k`` (the MMA problem; swap-AB: m = N, n = tokens), stream.
    Bias and residual are in the output dtype; unused pointers may be 0; every pointer is
    16-byte aligned (the launcher allocates or copies to make it so).
    """

    template_id = TEMPLATE_ID
    config_type = Sm100Nvfp4GemmConfig
    archs = ("sm_100a", "sm_100f", "sm_103a")

    def can_implement(self, spec) -> "Status":
        """Problem-independent checks of a compile spec (config, operand formats, arch)."""
        st = validate_config(spec.config)
        if not st:
            return st
        if spec.a_format != "nvfp4" or spec.b_format != "nvfp4":
            return Status.fail(f"sm100 NVFP4 GEMM needs nvfp4 x nvfp4 operands, got {spec.a_format} x {spec.b_format}")
        if spec.a_major != "k" or spec.b_major != "k":
            return Status.fail(f"packed FP4 operands must be K-major, got a_major={spec.a_major} b_major={spec.b_major}")
        if spec.arch not in self.archs:
            return Status.fail(f"sm100 NVFP4 GEMM targets {self.archs}, not {spec.arch}")
        return Status.success()

    @staticmethod
    def can_implement_problem(config, *, m: int, n: int, k: int, out_bytes: int, activation: str = "none",
                              arch: str | None = None) -> "Status":
        """The problem-level rule (:func:`nvgemm.templates.sm100_w4a4.validity.can_implement_problem`):
        shapes, alignment, narrow tiles, split_k <= K tiles."""
        return can_implement_problem(config, m=m, n=n, k=k, out_bytes=out_bytes, activation=activation, arch=arch)

    def abi(self, spec):
        out = _dtype_name(spec.epilogue.out_dtype)
        return (
            PointerArg("a_ptr", "Float4E2M1FN", assumed_align=16),
            PointerArg("b_ptr", "Float4E2M1FN", assumed_align=16),
            PointerArg("sfa_ptr", "Float8E4M3FN", assumed_align=16),
            PointerArg("sfb_ptr", "Float8E4M3FN", assumed_align=16),
            # out_quant: c_ptr = packed FP4 codes, residual_ptr = swizzled e4m3 scales (bytes)
            PointerArg("c_ptr", "Uint8" if spec.epilogue.out_quant else out, assumed_align=16),
            PointerArg("alpha_ptr", "Float32", assumed_align=16),  # vector loads of alpha / bias /
            PointerArg("bias_ptr", out, assumed_align=16),  # residual rows: the launcher aligns
            PointerArg("residual_ptr", "Uint8" if spec.epilogue.out_quant else out, assumed_align=16),
            PointerArg("workspace_ptr", "Float32", assumed_align=16),
            PointerArg("counter_ptr", "Int32", assumed_align=4),
            ScalarArg("m", "int32"),
            ScalarArg("n", "int32"),
            ScalarArg("k", "int32"),
            StreamArg("stream"),
        )

    def make_kernel(self, spec) -> Sm100Nvfp4GemmKernel:
        self.can_implement(spec).raise_if_failed(spec.name())
        return Sm100Nvfp4GemmKernel(spec.config, spec.epilogue, max_active_clusters_for(spec))

    def compile(self, spec, *, keep_ptx: bool = False):
        return compile_for_target(self.make_kernel(spec), fake_args(self.abi(spec)), spec,
                                  "--keep-ptx" if keep_ptx else "")


def compile_sm100_nvfp4_gemm(spec, *, keep_ptx: bool = False):
    """Compile one kernel for ``spec.arch`` without a GPU (``.__ptx__`` holds the PTX when
    ``keep_ptx``); refuses, with the reason, a spec the template cannot implement."""
    return TEMPLATE.compile(spec, keep_ptx=keep_ptx)


def _register():
    return register_template(Sm100Nvfp4GemmTemplate(), replace=True)


TEMPLATE = _register()
