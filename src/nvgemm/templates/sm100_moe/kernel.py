"""sm_100a grouped W4A4 MoE kernel (CuTeDSL): the swap-AB tcgen05 decode kernel over a work list.

    out[j * tile_n + t, f] = epilogue_e( sum_k E2M1(W_e[f, k]) SFA_e[f, k/16] E2M1(X[j, t, k]) SFB[j, t, k/16] )

for every work slot ``j = (e, p0, cnt)`` (``cnt > 0``) and token row ``t < tile_n`` of the slot.
Everything is :class:`~nvgemm.templates.sm100_w4a4.kernel.Sm100Nvfp4GemmKernel` (its warp roles,
pipelines, split-K and epilogues, swap-AB with ``m`` = weight rows per expert, ``n`` = slots x
tile_n); the grouped kernel only overrides its work hooks:

* **A tile** (weights, scales): row tile ``e * ceil(m / 128) + i`` of the stacked operand
  ``[E * rows_padded, K / 2]`` -- one TMA descriptor for all experts, no tensormap updates;
* **K range**: a slot with ``cnt == 0`` (past the routing's tiles) gets no K tiles: no loads, no
  MMAs, its (never read) outputs are written as the epilogue of zero;
* **SFB**: one 128-row atom per slot (``[slots * 128, K / 16]`` swizzled; the slot's tokens are
  rows 0..tile_n-1 of atom ``j``), read at TMEM column offset 0 whatever ``tile_n``;
* **alpha**: the expert's, ``alpha[e * stride + ...]`` with ``stride`` = 1 (scalar) or ``m``
  (vector: per GEMM row), plus 1 when the fused requant's next input scale follows (``out_quant``:
  GEMM1 writes GEMM2's packed FP4 codes and its per-slot SFB atoms directly);
* **PDL**: every warp that reads the work list waits (``griddepcontrol.wait``) first -- GEMM1's
  work list is written by its predecessor (the prep) -- except with ``config.early_weights`` (GEMM2):
  the TMA warp reads its first work slot, acquires the first ``min(K tiles, stages)`` smem stages and
  issues their weight and weight-scale TMA loads, then waits; the same stages' activation loads (GEMM1's
  output) follow in the main loop, so a stage's barrier -- which expects the whole stage's bytes --
  completes only once both halves landed.
  Why GEMM2 may read the work list before its wait (PTX ISA ``griddepcontrol``; CUDA programming
  guide, "Programmatic Dependent Launch"): the list was written by the prep grid, GEMM1's
  prerequisite. ``griddepcontrol.wait`` in GEMM1 returns only once the prep grid has *completed* and
  its memory operations are performed. Every CTA of GEMM1 passes a wait before it can signal: the TMA
  warp waits unconditionally before its first load, the MMA warp before it reads the work list, the
  epilogue warps before they touch global memory, and each warp's ``launch_dependents`` comes after
  its own wait in program order; a CTA that exits has run those waits too. GEMM2 (launched with the
  programmatic-serialization attribute) is scheduled only once every CTA of GEMM1 has signalled or
  exited -- so only after the prep grid completed. A grid that starts after a grid completed reads
  what it wrote, as any stream-ordered launch does; the ISA's wording ("made visible to the current
  grid") names the waiting grid, and this is the one step beyond it: that completion of a grid is
  global, not per observer. What stays behind the wait: GEMM1's output (GEMM2's activations and
  their scale atoms), alpha, the split-K workspace / counters, the finalize's inputs and every store.
  The weights and their scales are constants of the model (no grid of the stream writes them).
  (GEMM1 cannot do the same: its work list comes from its own prerequisite.) The emulator records
  every global access before a warp's wait (:mod:`nvgemm.emulator.ptx.pdl`); the MoE emulator tests
  allow exactly the weights, their scales and (GEMM2) the work list there;
* **L2 prefetch of GEMM2's weights** (``config.prefetch_next``, GEMM1): at decode the layer is launch-bound
  and GEMM2 would start streaming its weights from DRAM only once it runs. GEMM1 is handed GEMM2's stacked
  weights ``[E * H_p, I/2]`` and their 2-D swizzled scales, and builds prefetch-only TMA atoms over them --
  made exactly like its own A / SFA atoms (GEMM2's A box, 128 rows x 256 K, has GEMM1's A box's shape), so a
  prefetched box is a box GEMM2's TMA warp loads. After its last own weight load is issued (GEMM1's stream
  first) and before its ``launch_dependents``, the TMA warp walks its work tiles again: work unit
  ``u = row tile * split_k + split`` of the ``U = ceil(2I / 128) * split_k`` units of slot ``(e, p0, cnt)``
  issues ``cp.async.bulk.prefetch.tensor`` of GEMM2 row tiles ``j = u, u + U, ...`` (< ceil(H / 128)) of
  expert ``e``, every K tile, weights and scales, from one elected lane. Only the expert's first slot
  prefetches (slots are grouped by expert, so that is ``j == 0`` or slot ``j - 1`` holds another expert),
  an empty slot (``cnt == 0``) nothing: every routed expert's GEMM2 weights are prefetched exactly once.
  All of it is after ``griddepcontrol.wait`` (the expert comes from the work list, GEMM1's predecessor's
  output). A prefetch is a hint: GEMM2's numbers do not depend on it;
* **fused finalize** (``config.finalize``, GEMM2): ``y`` (fp32 ``[slots * tile_n, H]``) is scratch; after a
  work tile's rows are stored (by the split-K reduction's CTA; an empty slot's tile too) the epilogue
  threads arrive at the row tile's counter (after the split-K counters); the CTA that arrives last -- all
  work slots of the row tile are stored -- computes ``out[t, f] = round(sum_s w[t, s] * y[y_rows[t, s],
  f] (+ shared_out[t, f]) (+ residual[t, f]))`` for every token and the tile's 128 features: fp32, slots
  in order 0..K-1, empty slots (``y_rows = -1``) skipped, ``mul.rn`` / ``add.rn`` (no contraction), one
  rounding into the epilogue's ``out_dtype`` -- the finalize kernel's numbers bit for bit in whichever
  order the CTAs arrive, without a launch of its own.

Numerics are the dense kernel's: fp32 TMEM accumulation in K order, the split-K sum in split order,
one rounding per output (:mod:`nvgemm.templates.sm100_w4a4.epilogue`).
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import torch

from nvgemm.core.epilogue import EpilogueSpec

from nvgemm.aot.abi import PointerArg, ScalarArg, StreamArg, compile_for_target, fake_args, register_template
from nvgemm.templates.sm100_w4a4.kernel import Sm100Nvfp4GemmKernel, _dtype_name, max_active_clusters_for
from nvgemm.templates.sm90_w4a16.common import fadd_rn, fmul_rn
from nvgemm.core.status import Status
from nvgemm.templates.common.grouped_moe import w4a4_moe_spec_status
from nvgemm.templates.sm100_moe.config import MOE_ARCHS, MOE_FAMILY, Sm100MoeConfig, validate_moe_config

TEMPLATE_ID = "sm100_moe_nvfp4"


class _Work:
    """The work-list context of one kernel (traced values): the tiles tensor and A tiles per expert."""

    def __init__(self, tiles, tiles_per_expert, m_gemm, fin):
        self.tiles = tiles
        self.tiles_per_expert = tiles_per_expert
        self.m_gemm = m_gemm
        self.final, self.shared, self.resid, self.y_rows, self.wts, self.flags = fin
        self.next = None

    def set_next(self, tma_atom_a, tAgA, tma_atom_sfa, tAgSFA, tiles_per_expert, k_tiles):
        """GEMM2's weights as GEMM1 prefetches them (``prefetch_next``): prefetch-only TMA atoms and their
        partitions (box, row tile, K tile, L), GEMM2's row tiles per expert and K tiles."""
        self.next = (tma_atom_a, tAgA, tma_atom_sfa, tAgSFA, tiles_per_expert, k_tiles)


#: Slots of one token the fused finalize loads at once (top-k up to 8 in one round trip).
FIN_SLOTS = 8


class Sm100MoeKernel(Sm100Nvfp4GemmKernel):
    """The grouped decode kernel (see the module docstring)."""

    sfb_col_offsets = False

    def __init__(self, config: Sm100MoeConfig, epilogue: EpilogueSpec, max_active_clusters: int):
        validate_moe_config(config).raise_if_failed("sm100 moe config")
        self.finalize = config.finalize
        self.final_dtype = None
        if config.finalize:  # the GEMM's own output is fp32 y; the finalize rounds into out_dtype
            self.final_dtype = {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16}[epilogue.out_dtype]
            epilogue = dataclasses.replace(epilogue, out_dtype=torch.float32)
        super().__init__(config.dense(), epilogue, max_active_clusters)
        self.moe_cfg = config
        self.slot_n = config.tile_n
        self.work_before_wait = config.early_weights

    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,
        b_ptr: cute.Pointer,
        sfa_ptr: cute.Pointer,
        sfb_ptr: cute.Pointer,
        c_ptr: cute.Pointer,
        alpha_ptr: cute.Pointer,
        tiles_ptr: cute.Pointer,
        residual_ptr: cute.Pointer,
        workspace_ptr: cute.Pointer,
        counter_ptr: cute.Pointer,
        final_ptr: cute.Pointer,
        shared_ptr: cute.Pointer,
        resid_ptr: cute.Pointer,
        yrows_ptr: cute.Pointer,
        wts_ptr: cute.Pointer,
        flags_ptr: cute.Pointer,
        m: cutlass.Int32,
        n: cutlass.Int32,
        k: cutlass.Int32,
        a_rows: cutlass.Int32,
        m_tok: cutlass.Int32,
        top_k: cutlass.Int32,
        next_a_ptr: cute.Pointer,
        next_sfa_ptr: cute.Pointer,
        next_m: cutlass.Int32,
        next_a_rows: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        """``m`` = weight rows per expert (unpadded), ``n`` = slots x tile_n, ``a_rows`` = rows of
        the stacked A operand (E x m padded to 128); ``m_tok`` / ``top_k``: the finalize's tokens and
        slots (``finalize``; else unused, like its pointers); ``next_*``: GEMM2's stacked weights, their
        scales, rows per expert (H) and stacked rows, which GEMM1 L2-prefetches (``prefetch_next``; K of
        GEMM2 = I = m / 2; else unused)."""
        mTiles = cute.make_tensor(tiles_ptr, cute.make_layout((n // self.slot_n) * 4))
        fin = None
        if cutlass.const_expr(self.finalize):
            rows_major = cute.make_layout((m_tok, m), stride=(m, 1))
            fin = (cute.make_tensor(final_ptr, rows_major), cute.make_tensor(shared_ptr, rows_major),
                   cute.make_tensor(resid_ptr, rows_major), cute.make_tensor(yrows_ptr, cute.make_layout(m_tok * top_k)),
                   cute.make_tensor(wts_ptr, cute.make_layout(m_tok * top_k)),
                   cute.make_tensor(flags_ptr, cute.make_layout(2)))
        nxt = None
        if cutlass.const_expr(self.moe_cfg.prefetch_next):
            nxt = (next_a_ptr, next_sfa_ptr, next_m, next_a_rows, m // 2)
        # no bias in a grouped GEMM: alpha_ptr stands in for the (never read) bias pointer
        self._host_launch(a_ptr, b_ptr, sfa_ptr, sfb_ptr, c_ptr, alpha_ptr, alpha_ptr, residual_ptr, workspace_ptr,
                          counter_ptr, m, n, k, stream, mTiles=mTiles, a_rows=a_rows, fin=fin, nxt=nxt)

    # ------------------------------------------------------------------ work hooks

    def _work(self, mTiles, m_gemm, fin):
        return _Work(mTiles, (m_gemm + 127) // 128, m_gemm, fin)

    @cute.jit
    def _tile_done(self, coord, work, mC, mCnt, sFlag, tidx, m_gemm, num_tiles_n):
        """The fused finalize's arrival (module docstring): every work slot's tile of row tile
        ``coord[0]`` arrives once; the last arrival finalizes the row tile."""
        if cutlass.const_expr(self.finalize):
            fin = (work.final, work.shared, work.resid, work.y_rows, work.wts, work.flags)
            base = cutlass.Int32(0)
            if cutlass.const_expr(self.split_k > 1):
                base = (m_gemm + 127) // 128 * num_tiles_n  # after the split-K tile counters
            idx = base + coord[0]
            cute.arch.fence_acq_rel_gpu()
            self.epilog_sync_barrier.arrive_and_wait()
            if tidx == 0:
                sFlag[0] = cute.arch.atomic_add(mCnt.iterator + idx, cutlass.Int32(1), sem="acq_rel", scope="gpu")
            self.epilog_sync_barrier.arrive_and_wait()
            if sFlag[0] == num_tiles_n - 1:
                cute.arch.fence_acq_rel_gpu()
                self._finalize_rows(coord[0], *fin, mC, tidx, m_gemm)
                if tidx == 0:
                    mCnt[idx] = cutlass.Int32(0)
            self.epilog_sync_barrier.arrive_and_wait()

    @cute.jit
    def _finalize_rows(self, mt, mFinal, mShared, mResid, mYRows, mWts, mFlags, mC, tidx, m_gemm):
        """Thread ``tidx`` finalizes feature ``128 mt + tidx`` of every token (coalesced along features)."""
        f = mt * 128 + tidx
        m_tok = mFinal.shape[0]
        top_k = cute.size(mYRows) // m_tok
        has_shared = mFlags[0]
        has_resid = mFlags[1]
        if f < m_gemm:
            for t in cutlass.range(m_tok):
                acc = cutlass.Float32(0.0)
                # slots in chunks of FIN_SLOTS: the chunk's row and weight loads, then its y loads, are in
                # flight together (two L2 round trips per chunk); the sums stay in slot order
                for s0 in cutlass.range(0, top_k, FIN_SLOTS):
                    rs, ws = [], []
                    for j in cutlass.range_constexpr(FIN_SLOTS):
                        s = cutlass.min(s0 + j, top_k - 1)
                        rs.append(cutlass.select_(s0 + j < top_k, mYRows[t * top_k + s], cutlass.Int32(-1)))
                        ws.append(mWts[t * top_k + s])
                    ys = [mC[f, cutlass.max(rs[j], 0), 0].to(cutlass.Float32) for j in range(FIN_SLOTS)]
                    for j in cutlass.range_constexpr(FIN_SLOTS):
                        acc = cutlass.select_(rs[j] >= 0, fadd_rn(acc, fmul_rn(ws[j], ys[j])), acc)
                if has_shared != 0:
                    acc = fadd_rn(acc, mShared[t, f].to(cutlass.Float32))
                if has_resid != 0:
                    acc = fadd_rn(acc, mResid[t, f].to(cutlass.Float32))
                mFinal[t, f] = acc.to(self.final_dtype)

    @cute.jit
    def _prefetch_next(self, sched_params, work, v_size):
        """``prefetch_next`` (GEMM1): L2-prefetch GEMM2's weight and weight-scale tiles of this CTA's work
        slots' experts (module docstring). Work unit ``u = row tile * split_k + split`` of ``U`` units of a
        slot takes GEMM2 row tiles ``j = u, u + U, ...`` of the slot's expert, every K tile; only the
        expert's first slot prefetches (slots are grouped by expert), empty slots nothing."""
        if cutlass.const_expr(self.moe_cfg.prefetch_next):
            tma_atom_na, tNgA, tma_atom_nsfa, tNgSFA, n_tiles, n_kt = work.next
            units = work.tiles_per_expert * self.split_k
            tile_sched = utils.StaticPersistentTileScheduler.create(
                sched_params, cute.arch.block_idx(), cute.arch.grid_dim()
            )
            work_tile = tile_sched.initial_work_tile_info()
            while work_tile.is_valid_tile:
                coord = work_tile.tile_idx
                slot = coord[1]
                e = work.tiles[slot * 4]
                first = cutlass.Int32(0)
                if work.tiles[slot * 4 + 2] > 0:
                    first = cutlass.Int32(1)
                    if slot > 0:
                        if work.tiles[(slot - 1) * 4] == e:
                            first = cutlass.Int32(0)
                if first != 0:
                    u = (coord[0] // v_size) * self.split_k + coord[2]
                    # one lane issues (a prefetch is per thread: a whole warp would request each box 32 times)
                    with cute.arch.elect_one():
                        for j in cutlass.range(u, n_tiles, units, unroll=1):
                            row_tile = e * n_tiles + j
                            for kt in cutlass.range(0, n_kt, 1, unroll=1):
                                cute.prefetch(tma_atom_na, tNgA[(None, row_tile, kt, 0)])
                                cute.prefetch(tma_atom_nsfa, tNgSFA[(None, row_tile, kt, 0)])
                tile_sched.advance_to_next_work()
                work_tile = tile_sched.get_current_work()

    def _a_tile(self, mma_m, coord, work):
        return work.tiles[coord[1] * 4] * work.tiles_per_expert + mma_m

    @cute.jit
    def _tile_k_range(self, coord, k_tile_total, work):
        k_begin, k_cnt = self._k_range(coord[2], k_tile_total)
        if work.tiles[coord[1] * 4 + 2] == 0:
            k_cnt = cutlass.Int32(0)
        return k_begin, k_cnt

    def _alpha_stride(self, m_gemm):
        s = m_gemm if self.spec.alpha == "vector" else 1
        return s + 1 if self.spec.out_quant else s

    def _tile_alpha(self, mAlpha, alpha_s, coord, work):
        e = work.tiles[coord[1] * 4]
        mAlphaE = cute.make_tensor(mAlpha.iterator + e * self._alpha_stride(work.m_gemm), mAlpha.layout)
        a = alpha_s
        if cutlass.const_expr(self.spec.alpha == "scalar"):
            a = mAlphaE[0].to(cutlass.Float32)
        return mAlphaE, a

    def _sfb_shape(self, b_shape, n, kk):
        return ((n // self.slot_n) * 128, kk, 1)

    def _sf_atoms(self, n):
        return n // self.slot_n

    @cute.jit
    def _sfb_slice_n(self, mma_n: cutlass.Int32) -> cutlass.Int32:
        return mma_n

    def _zero_sf_padding(self, cs, mS, m_size, n_size, kb4):
        """The grouped launcher allocates its per-slot scale atoms zeroed: no padding stores here."""

    def _sf_byte(self, c, b, kb4):
        slot = c // self.slot_n
        r = c % self.slot_n
        return (slot * kb4 + b // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + b % 4


class Sm100MoeTemplate:
    """Registry entry of the grouped kernel (``template_id = "sm100_moe_nvfp4"``).

    C ABI, in order (:meth:`nvgemm.templates.sm100_moe.launch.Sm100MoeGemmArgs.abi_values`):

        a        uint8 [E * rows_padded, K/2]  stacked packed E2M1 weights (gate/up interleaved for GEMM1)
        b        uint8 [slots * tile_n, K/2]   per-slot packed activations
        sfa      e4m3, the 128x4-swizzled scales of ``a`` (2-D over the stack)
        sfb      e4m3 [slots * 128 rows] 128x4-swizzled: one atom per slot
        c        output: [slots * tile_n, m or m/2] (out dtype; fp32 with ``finalize``), or packed codes
                 [slots * tile_n, m/4] (out_quant)
        alpha    fp32 [E * stride]: per expert alpha (1 or m values) [+ next input scale]
        tiles    int32 [4 * slots]: (expert, first permuted pair, pairs, 0)
        residual out_quant: uint8 [slots * 512 * ceil(m/128)] swizzled scales of the codes; else unused
        workspace fp32, counters int32 (split-K; with ``finalize`` the row tiles' finalize counters follow)
        final, shared, resid  [m_tok, m] out dtype: the finalize's output, shared_out, residual (``finalize``)
        y_rows   int32 [m_tok * top_k]: row of ``c`` per pair, -1 = empty slot; wts fp32 [m_tok * top_k]
        flags    int32 [2]: (shared_out given, residual given)
        m, n, k, a_rows, m_tok, top_k int32
        next_a   uint8 [E * H_padded, I/2]: GEMM2's stacked weights (``prefetch_next``: GEMM1 L2-prefetches
                 them; else unused); next_sfa their 128x4-swizzled scales; next_m = H, next_a_rows int32
        stream
    """

    template_id = TEMPLATE_ID
    config_type = Sm100MoeConfig
    archs = MOE_ARCHS
    family = MOE_FAMILY

    def can_implement(self, spec) -> Status:
        st = validate_moe_config(spec.config)
        if not st:
            return st
        st = w4a4_moe_spec_status("sm100", spec, self.archs)
        if not st:
            return st
        epi = spec.epilogue
        if epi.gated and not epi.out_quant:
            return Status.fail("gated GEMM1 of the grouped kernel writes GEMM2's NVFP4 input (out_quant=True)")
        if spec.config.finalize and (epi.gated or epi.out_quant or epi.activation != "none"
                                     or epi.out_dtype not in (torch.bfloat16, torch.float16)):
            return Status.fail("finalize is GEMM2's: no activation, rounding into bf16 / fp16 (y stays fp32)")
        if spec.config.prefetch_next and not (epi.gated and epi.out_quant):
            return Status.fail("prefetch_next is GEMM1's (gated, fused requant): it L2-prefetches GEMM2's weights")
        return Status.success()

    def abi(self, spec):
        out = _dtype_name(spec.epilogue.out_dtype)
        q = spec.epilogue.out_quant
        return (
            PointerArg("a_ptr", "Float4E2M1FN", assumed_align=16),
            PointerArg("b_ptr", "Float4E2M1FN", assumed_align=16),
            PointerArg("sfa_ptr", "Float8E4M3FN", assumed_align=16),
            PointerArg("sfb_ptr", "Float8E4M3FN", assumed_align=16),
            PointerArg("c_ptr", "Uint8" if q else ("Float32" if spec.config.finalize else out), assumed_align=16),
            PointerArg("alpha_ptr", "Float32", assumed_align=4),
            PointerArg("tiles_ptr", "Int32", assumed_align=16),
            PointerArg("residual_ptr", "Uint8" if q else out, assumed_align=16),
            PointerArg("workspace_ptr", "Float32", assumed_align=16),
            PointerArg("counter_ptr", "Int32", assumed_align=4),
            PointerArg("final_ptr", out, assumed_align=2),
            PointerArg("shared_ptr", out, assumed_align=2),
            PointerArg("resid_ptr", out, assumed_align=2),
            PointerArg("yrows_ptr", "Int32", assumed_align=4),
            PointerArg("wts_ptr", "Float32", assumed_align=4),
            PointerArg("flags_ptr", "Int32", assumed_align=4),
            ScalarArg("m", "int32"),
            ScalarArg("n", "int32"),
            ScalarArg("k", "int32"),
            ScalarArg("a_rows", "int32"),
            ScalarArg("m_tok", "int32"),
            ScalarArg("top_k", "int32"),
            PointerArg("next_a_ptr", "Float4E2M1FN", assumed_align=16),
            PointerArg("next_sfa_ptr", "Float8E4M3FN", assumed_align=16),
            ScalarArg("next_m", "int32"),
            ScalarArg("next_a_rows", "int32"),
            StreamArg("stream"),
        )

    def make_kernel(self, spec) -> Sm100MoeKernel:
        self.can_implement(spec).raise_if_failed(spec.name())
        return Sm100MoeKernel(spec.config, spec.epilogue, max_active_clusters_for(spec))

    def compile(self, spec, *, keep_ptx: bool = False):
        return compile_for_target(self.make_kernel(spec), fake_args(self.abi(spec)), spec,
                                  "--keep-ptx" if keep_ptx else "")


TEMPLATE = register_template(Sm100MoeTemplate(), replace=True)

__all__ = ["Sm100MoeKernel", "Sm100MoeTemplate", "TEMPLATE", "TEMPLATE_ID"]
