"""sm_90a grouped W4A16 MoE kernel (CuTeDSL): the ``mma`` decode kernel over a work list.

    out[p, f] = epilogue_e( alpha_e * sum_k X[rows[p], k] * E2M1[q_e[f, k]] * s_e[f, k // 16] )

for every permuted pair row ``p`` of every work tile ``(e, p0, cnt)`` (``p0 <= p < p0 + cnt``).
The inner loop -- cp.async ring of weight vectors, scale words and activation rows, the exact
register decode, ``mma.sync.m16n8k16`` with the weight as the 16-row A operand and 8 pairs per MMA
N -- is :class:`~nvgemm.templates.sm90_w4a16.mma.Sm90W4A16MmaKernel`'s, unchanged. What differs:

* grid = (row blocks, split_k, work-list slots); a CTA reads its tile ``(e, p0, cnt)`` from the
  work list (after ``griddepcontrol.wait`` with PDL: the list comes from the routing) and exits at
  once when ``cnt == 0`` (slots past the routing's tiles);
* the weight and scale row pointers start at expert ``e``'s first row tile of the stacked operand
  (``e x tiles per expert``; tiles per expert = weight rows / 16, from the output width);
* each thread's activation row is ``rows[p0 + r]`` (``r`` its tile row, clamped to ``cnt - 1``:
  rows past the tile are never stored) -- GEMM1 gathers token rows of ``x``, GEMM2 reads the
  permuted intermediate (identity table);
* alpha is the expert's: ``alpha[e]`` (scalar spec) or ``alpha[e * rows + row]`` (vector spec);
* split-K partials live at ``[split][permuted row][rows]`` (the output's row count), one counter per
  (work slot, row block); the last CTA sums in split order (deterministic) and runs the epilogue;
* **early weights** (``config.early_weights``, GEMM2): the CTA reads its work slot (the work list, or
  the ids with ``direct``) and the row table (the identity) and issues the cp.async copies of the ring's
  first weight and scale stages *before* ``griddepcontrol.wait``; the activation rows (GEMM1's output),
  alpha, the split-K workspace / counters, the finalize's inputs and every store come after it (an
  empty work slot waits before it arrives). Why the routing may be read early (PTX ISA
  ``griddepcontrol``; CUDA programming guide, "Programmatic Dependent Launch"): it was written by
  GEMM1's prerequisite (the prep, or the router with ``direct``; the identity table is filled before
  GEMM1's launch). GEMM1's CTAs each wait unconditionally before anything else, and a wait returns only
  once the prerequisite grid has *completed*; a CTA signals (``launch_dependents``) only after its
  wait in program order, or exits after it. GEMM2 is scheduled only once every CTA of GEMM1 has
  signalled or exited, i.e. after that grid completed; a grid that starts after a grid completed reads
  what it wrote, as any stream-ordered launch does (the ISA names visibility to the waiting grid; the
  step beyond it is that completion is global). The weights and scales are constants of the model.
  GEMM1 cannot do the same: its routing is its own prerequisite's output;
* **direct** (``config.direct``, one token): no work list -- work slot ``j`` is routed pair ``j``, expert
  ``ids[j]`` (passed as ``mYRows``; -1: an empty slot), one row at permuted row ``j``; GEMM1's row table is
  all zeros (the one token), GEMM2's the identity, the finalize's row of pair ``j`` is ``j``. The call
  then needs no prep launch;
* **fused finalize** (``config.finalize``, GEMM2): once a CTA's fp32 rows ``y`` are stored (after the
  split-K reduction; a CTA of an empty work slot at once), it arrives at its row block's counter
  (after the split-K counters); the CTA that arrives last -- all work slots of the block are done --
  computes ``out[t, f] = round(sum_s w[t, s] * y[y_rows[t, s], f] (+ shared_out[t, f]) (+ residual[t,
  f]))`` for every token and the block's features: fp32, slots in order 0..K-1, empty slots
  (``y_rows = -1``) skipped, ``mul.rn`` / ``add.rn`` (no contraction), one rounding -- the finalize
  kernel's numbers bit for bit, in whichever order the CTAs arrive, without a launch of its own.

Constraints (:func:`~.config.validate_moe_config`, :func:`~.config.moe_shape_problem`): K % 32 == 0,
weight rows per expert % 16 == 0, ``silu_mul``: I % 16 == 0 and an even number of row tiles per warp.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import Float32, Int32, Int64

from nvgemm.core.epilogue import EpilogueSpec

from nvgemm.aot.abi import CompileSpec, StreamArg, TensorArg, SymDim, compile_for_target, fake_args, register_template
from nvgemm.templates.sm90_w4a16.common import (X_FORMATS, cp_async_wait, fadd_rn, fmul_rn, ld_global_cg_f32,
                                                 operand_args, splitk_arrive, st_global_f32)
from nvgemm.templates.sm90_w4a16.mma import Sm90W4A16MmaKernel
from nvgemm.core.status import Status
from nvgemm.templates.sm90_moe.config import MOE_ARCHS, MOE_FAMILY, Sm90MoeConfig, validate_moe_config


#: Slots of one token the fused finalize loads at once (top-k up to 8 in one round trip).
FIN_SLOTS = 8


class Sm90MoeMmaKernel(Sm90W4A16MmaKernel):
    """The grouped decode kernel (see the module docstring)."""

    def __init__(self, config: Sm90MoeConfig, epilogue: EpilogueSpec, x_format: str = "bf16"):
        validate_moe_config(config).raise_if_failed("sm90 moe config")
        super().__init__(config.dense(), epilogue, x_format)
        self.moe_cfg = config
        self.finalize = config.finalize
        self.direct = config.direct
        self.early_weights = config.early_weights
        self.final_dtype = cutlass.BFloat16 if x_format == "bf16" else cutlass.Float16

    # ----------------------------------------------------------------------------- host
    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        mRows: cute.Tensor,
        mTiles: cute.Tensor,
        mW: cute.Tensor,
        mS: cute.Tensor,
        mAlpha: cute.Tensor,
        mOut: cute.Tensor,
        mWork: cute.Tensor,
        mCount: cute.Tensor,
        mFinal: cute.Tensor,
        mShared: cute.Tensor,
        mResid: cute.Tensor,
        mYRows: cute.Tensor,
        mWts: cute.Tensor,
        mFlags: cute.Tensor,
        stream: cuda.CUstream,
    ):
        n_out = mOut.shape[1]
        grid_n = (n_out + self.feat_per_cta - 1) // self.feat_per_cta
        slots = mTiles.shape[0] // 4
        self.kernel(mX, mRows, mTiles, mW, mS, mAlpha, mOut, mWork, mCount, mFinal, mShared, mResid, mYRows, mWts,
                    mFlags).launch(
            grid=(grid_n, self.split_k, slots), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )

    # ----------------------------------------------------------------------------- kernel
    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mRows: cute.Tensor,
        mTiles: cute.Tensor,
        mW: cute.Tensor,
        mS: cute.Tensor,
        mAlpha: cute.Tensor,
        mOut: cute.Tensor,
        mWork: cute.Tensor,
        mCount: cute.Tensor,
        mFinal: cute.Tensor,
        mShared: cute.Tensor,
        mResid: cute.Tensor,
        mYRows: cute.Tensor,
        mWts: cute.Tensor,
        mFlags: cute.Tensor,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bx, bs, bt = cute.arch.block_idx()
        if cutlass.const_expr(self.pdl and not self.early_weights):
            cute.arch.griddepcontrol_wait()  # the work list is written by the routing's prep step
        e, p0, cnt = self.work_slot(mTiles, mYRows, bt)
        ring, flag, policy, acc = self.cta_state()
        if cnt > 0:
            self.tile_body(mX, mRows, mW, mS, mAlpha, mOut, mWork, mCount, tidx, bx, bs, bt, e, p0, cnt, ring, flag,
                           policy, acc, mFinal, mShared, mResid, mYRows, mWts, mFlags)
        if cutlass.const_expr(self.pdl and self.early_weights):
            if cnt == 0:  # an empty work slot waits too (before the finalize, and before it may signal)
                cute.arch.griddepcontrol_wait()
        if cutlass.const_expr(self.finalize):
            if (cnt == 0) & (bs == 0):  # an empty work slot has no rows: it arrives at once (once)
                if cutlass.const_expr(self.pdl):
                    cute.arch.griddepcontrol_launch_dependents()
                self.finalize_arrive(mOut, mCount, mFinal, mShared, mResid, mYRows, mWts, mFlags, tidx, bx, flag)

    @cute.jit
    def work_slot(self, mTiles: cute.Tensor, mYRows: cute.Tensor, bt: Int32):
        """(expert, first permuted row, rows) of work slot ``bt``: the work list's, or with ``direct`` (one
        token) pair ``bt`` itself -- expert ``ids[bt]`` (``mYRows`` holds the ids), one row, none for -1."""
        if cutlass.const_expr(self.direct):
            n_pairs = mYRows.shape[0]
            eid = cutlass.select_(bt < n_pairs, mYRows[cutlass.min(bt, n_pairs - 1)], Int32(-1))
            return cutlass.max(eid, Int32(0)), bt, cutlass.select_(eid >= 0, Int32(1), Int32(0))
        return mTiles[bt * 4], mTiles[bt * 4 + 1], mTiles[bt * 4 + 2]

    @cute.jit
    def finalize_arrive(self, mY: cute.Tensor, mCount: cute.Tensor, mFinal: cute.Tensor, mShared: cute.Tensor,
                        mResid: cute.Tensor, mYRows: cute.Tensor, mWts: cute.Tensor, mFlags: cute.Tensor,
                        tidx: Int32, bx: Int32, flag: Int32):
        """This work slot's rows of row block ``bx`` are stored: arrive at the block's finalize counter
        (after the split-K counters); the last of the grid's work slots runs the finalize of the block."""
        grid_n = cute.arch.grid_dim()[0]
        slots = cute.arch.grid_dim()[2]
        base = Int32(0)
        if cutlass.const_expr(self.split_k > 1):
            base = slots * grid_n
        if splitk_arrive(mCount, base + bx, slots, flag, tidx) == 1:
            self.finalize_block(mY, mFinal, mShared, mResid, mYRows, mWts, mFlags, tidx, bx)

    @cute.jit
    def finalize_block(self, mY: cute.Tensor, mFinal: cute.Tensor, mShared: cute.Tensor, mResid: cute.Tensor,
                       mYRows: cute.Tensor, mWts: cute.Tensor, mFlags: cute.Tensor, tidx: Int32, bx: Int32):
        """The top-k finalize of row block ``bx``'s features for every token (the module docstring)."""
        n_out = mY.shape[1]
        m_tok = mFinal.shape[0]
        top_k = mYRows.shape[0] // m_tok
        has_shared = mFlags[0]
        has_resid = mFlags[1]
        f0 = bx * self.feat_per_cta
        ybase = mY.iterator.toint()
        total = m_tok * self.feat_per_cta
        n_iter = (total + self.threads - 1) // self.threads
        for it in cutlass.range(n_iter):
            idx = it * self.threads + tidx
            t = idx // self.feat_per_cta
            f = f0 + idx % self.feat_per_cta
            if (t < m_tok) & (f < n_out):
                acc = Float32(0.0)
                # slots in chunks of FIN_SLOTS: the chunk's row and weight loads, then its y loads, are in
                # flight together (two L2 round trips per chunk); the sums stay in slot order
                for s0 in cutlass.range(0, top_k, FIN_SLOTS):
                    rs, ws = [], []
                    for j in cutlass.range_constexpr(FIN_SLOTS):
                        s = cutlass.min(s0 + j, top_k - 1)
                        r = mYRows[t * top_k + s]
                        if cutlass.const_expr(self.direct):  # the ids: pair t * K + s is row t * K + s of y
                            r = cutlass.select_(r >= 0, t * top_k + s, Int32(-1))
                        rs.append(cutlass.select_(s0 + j < top_k, r, Int32(-1)))
                        ws.append(mWts[t * top_k + s])
                    ys = [ld_global_cg_f32(ybase + (Int64(cutlass.max(rs[j], 0)) * Int64(n_out) + Int64(f)) * 4)
                          for j in range(FIN_SLOTS)]
                    for j in cutlass.range_constexpr(FIN_SLOTS):
                        acc = cutlass.select_(rs[j] >= 0, fadd_rn(acc, fmul_rn(ws[j], ys[j])), acc)
                if has_shared != 0:
                    acc = fadd_rn(acc, mShared[t, f].to(Float32))
                if has_resid != 0:
                    acc = fadd_rn(acc, mResid[t, f].to(Float32))
                mFinal[t, f] = acc.to(self.final_dtype)

    @cute.jit
    def tile_body(self, mX: cute.Tensor, mRows: cute.Tensor, mW: cute.Tensor, mS: cute.Tensor, mAlpha: cute.Tensor,
                  mOut: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor, tidx: Int32, bx: Int32, bs: Int32,
                  bt: Int32, e: Int32, p0: Int32, cnt: Int32, ring: Int32, flag: Int32, policy: Int64,
                  acc: cute.Tensor, mFinal: cute.Tensor, mShared: cute.Tensor, mResid: cute.Tensor,
                  mYRows: cute.Tensor, mWts: cute.Tensor, mFlags: cute.Tensor):
        RT, MG = self.RT, self.MG
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        q = lane % 4

        k = mX.shape[1]
        n_out = mOut.shape[1]
        rows_e = n_out * 2 if cutlass.const_expr(self.gated) else n_out
        n_tiles = (rows_e + 15) // 16  # row tiles per expert
        n_chunks = mW.shape[1] // 512
        n_pad = n_tiles * 16
        m_all = mOut.shape[0]
        m = p0 + cnt

        st_lo, n_it = self.split_range(n_chunks, bs)
        gw, gs, sw_off, ss_off = self.weight_lanes(mW, mS, bx, warp, lane, n_tiles, e * n_tiles)
        # this thread's activation row: the source row of its tile row (clamped to the tile's rows)
        xp, pk, xd, x_lds = self.x_lanes(mX, tidx, g, q, lambda tr: mRows[p0 + cutlass.min(tr, cnt - 1)])

        # without ``early_weights`` the PDL wait came first (the work list): no second wait in the prologue;
        # with it the ring's first weight and scale stages are issued, then the wait, then the activations
        self.pipeline(ring, n_it, st_lo, gw, gs, sw_off, ss_off, k, xp, xd, pk, x_lds, acc, policy,
                      self.pdl and self.early_weights)

        # the expert's alpha: alpha[e] (scalar spec) or alpha[e * rows + row] (vector spec)
        a_off = e * n_pad if cutlass.const_expr(self.epi.alpha == "vector") else e
        mAlphaE = cute.make_tensor(mAlpha.iterator + a_off, mAlpha.layout)
        cp_async_wait(0)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(self.split_k == 1):
            self.store_fragments(acc, mAlphaE, mAlphaE, mOut, mOut, bx, warp, g, q, m, p0, n_tiles, n_out, False,
                                 mWork, m_all, n_pad)
            if cutlass.const_expr(self.finalize):
                self.finalize_arrive(mOut, mCount, mFinal, mShared, mResid, mYRows, mWts, mFlags, tidx, bx, flag)
        else:
            for rt in cutlass.range_constexpr(RT):
                t = self.tile_of(bx, warp, rt, n_tiles)
                for mg in cutlass.range_constexpr(MG):
                    for i in cutlass.range_constexpr(4):
                        tok = p0 + mg * 8 + 2 * q + i % 2
                        row = t * 16 + g + 8 * (i // 2)
                        if (tok < m) & (t < n_tiles):
                            addr = mWork.iterator.toint() + (Int64(bs * m_all + tok) * Int64(n_pad) + Int64(row)) * 4
                            st_global_f32(addr, acc[(rt * MG + mg) * 4 + i])
            tile_index = bt * cute.arch.grid_dim()[0] + bx
            if splitk_arrive(mCount, tile_index, self.split_k, flag, tidx) == 1:
                self.store_fragments(acc, mAlphaE, mAlphaE, mOut, mOut, bx, warp, g, q, m, p0, n_tiles, n_out, True,
                                     mWork, m_all, n_pad)
                if cutlass.const_expr(self.finalize):
                    self.finalize_arrive(mOut, mCount, mFinal, mShared, mResid, mYRows, mWts, mFlags, tidx, bx,
                                         flag)


class Sm90MoeMmaTemplate:
    """Registry entry of the grouped MoE kernel (``template_id = "sm90_moe_mma"``).

    C ABI, in order (:meth:`nvgemm.templates.sm90_moe.launch.MoeGemmArgs.abi_values`):

        mX     [rows_x, K] bf16 | fp16   activation source rows (x, or the permuted intermediate)
        mRows  int32 [P]                 source row of each permuted pair row
        mTiles int32 [4 T]               work list: (expert, first row, rows, 0) per slot
        mW     uint8 [E tiles, chunks 512]  stacked prepared weights (:mod:`nvgemm.templates.sm90_w4a16.operand`)
        mS     uint8 [E tiles, chunks 64]   stacked re-encoded scales
        mAlpha fp32 [E] | [E rows]
        mOut   [P, N_out] output dtype   (GEMM1: the activation dtype; GEMM2: fp32)
        mWork  fp32, mCount int32        split-K partials / counters (any such tensor without split-K); with
                                         ``finalize`` the row blocks' finalize counters follow the split-K ones
        mFinal [M, H] activation dtype   the finalize's output (``finalize``; else any such tensor, e.g. mX)
        mShared, mResid [M, H] activation dtype  shared_out / residual (any such tensor when absent)
        mYRows int32 [M * K]             permuted row of pair (t, s), -1 = empty slot (``direct``: the ids)
        mWts   fp32 [M * K]              top-k weights
        mFlags int32 [2]                 (shared_out given, residual given)
        stream
    """

    template_id = "sm90_moe_mma"
    config_type = Sm90MoeConfig
    archs = MOE_ARCHS
    family = MOE_FAMILY

    def can_implement(self, spec: CompileSpec) -> Status:
        c = spec.config
        st = validate_moe_config(c)
        if not st:
            return st
        if spec.arch not in MOE_ARCHS:
            return Status.fail(f"arch {spec.arch} is not one of {MOE_ARCHS}")
        if spec.a_format not in X_FORMATS:
            return Status.fail(f"a_format (activations) must be bf16 or fp16, got {spec.a_format}")
        if spec.b_format != "nvfp4" or spec.a_major != "k" or spec.b_major != "k":
            return Status.fail("weights must be nvfp4, both operands K-major")
        if spec.epilogue.alpha not in ("scalar", "vector"):
            return Status.fail("the grouped kernel needs a per-expert alpha (scalar) or per-row alpha (vector)")
        if spec.epilogue.bias or spec.epilogue.residual:
            return Status.fail("the grouped kernel has no bias / residual (the finalize step adds shared_out and "
                               "residual)")
        if c.finalize and (spec.epilogue.gated or spec.epilogue.activation != "none"
                           or spec.epilogue.out_dtype != torch.float32):
            return Status.fail("finalize is GEMM2's: no activation, fp32 rows y (the finalize rounds once)")
        if spec.epilogue.gated and c.row_tiles % 2:
            return Status.fail(f"silu_mul needs an even number of row tiles per warp (gate + up), got {c.row_tiles}")
        return Status.success()

    def abi(self, spec: CompileSpec):
        a = operand_args(spec)  # the dense kernels' arguments, plus the work list (rows, tile count)
        xdt = X_FORMATS[spec.a_format]
        fin = {"shape": (SymDim(), SymDim()), "stride": (SymDim(1, 64), 1), "assumed_align": 2}
        vec = {"shape": (SymDim(),), "stride": (1,), "assumed_align": 4}
        return (
            a["mX"],
            TensorArg("mRows", "Int32", shape=(SymDim(),), stride=(1,), assumed_align=4),
            TensorArg("mTiles", "Int32", shape=(SymDim(4),), stride=(1,), assumed_align=16),
            a["mW"], a["mS"], a["mAlpha"], a["mOut"], a["mWork"], a["mCount"],
            TensorArg("mFinal", xdt, **fin), TensorArg("mShared", xdt, **fin), TensorArg("mResid", xdt, **fin),
            TensorArg("mYRows", "Int32", **vec), TensorArg("mWts", "Float32", **vec),
            TensorArg("mFlags", "Int32", **vec),
            StreamArg("stream"),
        )

    def compile(self, spec: CompileSpec, *, keep_ptx: bool = False):
        self.can_implement(spec).raise_if_failed(spec.name())
        kernel = Sm90MoeMmaKernel(spec.config, spec.epilogue, spec.a_format)
        return compile_for_target(kernel, fake_args(self.abi(spec)), spec, "--keep-ptx" if keep_ptx else "")


TEMPLATE = register_template(Sm90MoeMmaTemplate(), replace=True)

__all__ = ["Sm90MoeMmaKernel", "Sm90MoeMmaTemplate", "TEMPLATE"]
