"""sm_90a NVFP4 weight-only (W4A16) WGMMA kernel: tens to hundreds of tokens per CTA, in CuTeDSL.

    out[m, f] = epilogue( alpha * sum_k x[m, k] * E2M1[q[f, k]] * s[f, k // 16] )

Swap-AB on the warpgroup MMA: ``wgmma.mma_async.m64nNk16`` with the **decoded weights as the
register A operand** (64 weight rows per warpgroup and row block, M of the MMA) and the CTA's
``tile_m`` tokens as N, read by the tensor cores from shared memory (the B operand), fp32
accumulators in registers.

A operand, no shared-memory round trip: the register A fragment of ``m64nNk16`` is, per warp, the
``mma.m16n8k16`` A fragment of its 16 rows, which is exactly what one 32-bit word of a lane's
16-byte weight vector decodes to (:mod:`.operand`, the ``mma`` family's decode): 4 rotations and
4 masks / masked XORs give ``E2M1 * 2**-126`` (fp16: ``2**-14``) pairs, one packed multiply each by
the lane's re-encoded block scales makes them ``E2M1 * s * 2**-7``, exact; the epilogue restores
2**7 in fp32. Warp ``w`` of warpgroup ``wg`` owns, in row block ``b``, the 16-row tile
``4 (wg R + b) + w`` of the CTA (``silu_mul``: block 0 gate rows, block 1 the matching up rows).

B operand: the activation tile of each 64-deep chunk, ``tile_m`` rows of 128 bytes, K-major with
the 128-byte swizzle (1024-byte atoms of 8 rows; 16-byte unit ``j`` of row ``r`` stored at unit
``j ^ (r % 8)``), one descriptor per chunk, ``+ 32`` bytes per 16-deep k-step. The weight operand
fixes the K order inside a chunk: in k-step ``s``, lane ``(g, q)`` holds K = 16 q + 4 s + {0, 1}
(MMA k = 2q, 2q+1) and 16 q + 4 s + {2, 3} (MMA k = 2q + 8, 2q + 9), so the pair of activations
at K = 2P (P = 8 q + 2 s + v) is stored at MMA k-slot pair ``8 s + 4 v + q`` of the row
(:func:`x_slot_offset`); each pair is copied with a 4-byte ``cp.async`` (lane = P, so a warp
reads one 128-byte row segment), zero-filled past K; rows past M re-read row M - 1 (their
results are never stored).

Pipeline: a CTA-wide ring of ``stages`` shared-memory stages of ``tile_k`` = 64 x 2 or 4 chunks
(weights: each lane's own 16-byte vectors, ``cp.async.cg`` with an L2 evict-first policy; its
scale words; the swizzled activation chunks), ``stages - 2`` stages in flight ahead of the math:
iteration ``it`` waits for stage ``it`` (``cp.async.wait_group stages - 3``, ``fence.proxy.async``
so the tensor cores see the copies, one CTA barrier), refills the slot of stage ``it - 2`` --
whose WGMMAs completed during iteration ``it - 1`` -- and computes. Per 16-deep k-step a
warpgroup decodes its A registers, fences (``wgmma.fence``), issues one WGMMA per row block,
commits, and waits until only that group is pending (``wgmma.wait_group 1``): the decode of k-step
s + 1 runs while the tensor cores work on k-step s, and at most two k-steps of A registers are
live. With PDL the prologue's weight copies are issued before ``griddepcontrol.wait``.

Grid: one dimension of CTAs over the output tiles in M-fastest order (the M tiles of one row
block are adjacent in launch order, so they run side by side and the weights come from DRAM
once). With ``split_k > 1`` only the tiles of the last, partial wave on the target's SMs (every
tile when there are fewer tiles than SMs; :func:`~.config.wgmma_tail_tiles`) are split: they come
after the whole tiles, ``split_k`` adjacent CTAs each computing a share of the K stages
(:func:`~.config.wgmma_cta_role`; the kernel recovers the tail from its grid size), and their fp32
partials are reduced in-kernel as in the ``mma`` family (the last CTA of the tile sums them in
split order: deterministic). So a tensor-bound grid does not idle SMs in its last wave and the
full waves pay no partial traffic. The epilogue is the ``mma`` family's
(:meth:`~.common.Sm90KernelBase.finish`): the accumulator fragment is the ``m16n8`` C layout per 16
rows and 8 tokens.

Constraints (:func:`~.config.validate_config`, :func:`~.config.shape_problem`): tile_m one of
16 .. 256 (the WGMMA's N), 4 or 8 warps, tile_n = 64 x (1 or 2) row blocks x warpgroups, at most
128 accumulator registers per thread, tile_k 128 | 256, 3..6 stages, K % 32 == 0, ``silu_mul``
with two row blocks per warpgroup, bf16/fp16 activations.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import warpgroup

from nvgemm.core.epilogue import EpilogueSpec

from nvgemm.aot.abi import register_template
from nvgemm.templates.sm90_w4a16.common import (
    Sm90KernelBase,
    Sm90TemplateBase,
    cp_async_commit,
    cp_async_small4,
    cp_async_wait,
    cta_barrier,
    evict_first_policy,
    fence_proxy_async_smem,
    fence_regs,
    lds_v4,
    scale_pair,
    smem_desc_sw128,
    wgmma_rs,
)
from nvgemm.templates.sm90_w4a16.config import (
    SWIZZLE_ATOM,
    Sm90W4A16Config,
    wgmma_cta_role,
    wgmma_stage_bytes,
    wgmma_tail_tiles,
)
from nvgemm.templates.sm90_w4a16.operand import SCHEMES, x_slot_offset


def _select(c, a, b):
    """``a if c else b`` on DSL integers (the config module's role arithmetic)."""
    return cutlass.select_(c, Int32(a), Int32(b))


def _get(acc, i0: int, n: int) -> list:
    """``acc[i0 : i0 + n]`` as a list of values (plain Python: unrolled while tracing)."""
    return [acc[i0 + i] for i in range(n)]


def _put(acc, i0: int, vals: list) -> None:
    for i, v in enumerate(vals):
        acc[i0 + i] = v


class Sm90W4A16WgmmaKernel(Sm90KernelBase):
    """Register-A WGMMA kernel (see the module docstring)."""

    def __init__(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str = "bf16", sm_count: int = 132):
        self.init_common(config, epilogue, x_format, "wgmma")
        self.sm_count = sm_count  # the split tail is the last partial wave on this many SMs
        c = config
        self.W, self.RT, self.U, self.MG, self.D = c.num_warps, c.row_tiles, c.chunks_per_stage, c.m_groups, c.stages
        self.G = c.num_warps // 4
        self.pdl = c.pdl
        if self.gated and self.RT % 2:
            raise ValueError("silu_mul needs two row blocks per warpgroup")
        sb = wgmma_stage_bytes(c)
        self.off_s = sb["weights"]
        self.off_x = sb["weights"] + sb["scales"] + sb["pad"]
        self.stage_bytes = sum(sb.values())
        self.ring_bytes = self.D * self.stage_bytes
        self.chunk_x_bytes = c.tile_m * 128
        self.rows_per_thread = c.tile_m // c.num_warps  # activation rows each thread copies per chunk
        self.x_period = max(1, 8 // c.num_warps)  # rows r = warp + W i repeat r % 8 every x_period
        sch = SCHEMES[x_format]
        self.s_shift, self.s_add = sch.scale_shift, sch.scale_add

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
        m = mX.shape[0]
        n_out = mOut.shape[1]
        grid_n = (n_out + self.feat_per_cta - 1) // self.feat_per_cta
        grid_m = (m + self.tile_m - 1) // self.tile_m
        tiles = grid_n * grid_m
        ctas = tiles
        if cutlass.const_expr(self.split_k > 1):  # the tail tiles run split_k CTAs each
            tail = wgmma_tail_tiles(tiles, self.split_k, self.sm_count, _select)
            ctas = tiles + tail * (self.split_k - 1)
        self.kernel(mX, mW, mS, mAlpha, mBias, mRes, mOut, mWork, mCount).launch(
            grid=(ctas, 1, 1), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )

    # ----------------------------------------------------------------------------- device helpers
    @cute.jit
    def tile_of(self, bx: Int32, warp: Int32, rt: int, n_tiles: Int32):
        """Global 16-row tile of this warp's row block ``rt`` (warp ``w`` of warpgroup ``wg``)."""
        wg = warp // 4
        w = warp % 4
        if cutlass.const_expr(self.gated):
            h = self.RT // 2
            t = bx * (self.G * 4 * h) + wg * (4 * h) + (rt % h) * 4 + w
            if cutlass.const_expr(rt >= h):
                t = t + n_tiles // 2
            return t
        else:
            return bx * (self.G * 4 * self.RT) + wg * (4 * self.RT) + rt * 4 + w

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
    ):
        RT, U, MG, D, W, S = self.RT, self.U, self.MG, self.D, self.W, self.split_k
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        q = lane % 4

        m = mX.shape[0]
        k = mX.shape[1]
        n_tiles = mW.shape[0]
        n_out = mOut.shape[1]
        n_chunks = mW.shape[1] // 512
        n_pad = n_tiles * 16

        # this CTA's output tile (M-fastest order) and K range: whole tiles first, then the split tail
        tile, bs, is_tail, bm, bx = self.role(cta, m, n_out)
        m0 = bm * self.tile_m
        n_stage = n_chunks // U
        st_lo, n_it = Int32(0), n_stage
        if cutlass.const_expr(S > 1):
            sp_lo, sp_n = self.split_range(n_chunks, bs)
            st_lo = cutlass.select_(is_tail, sp_lo, Int32(0))
            n_it = cutlass.select_(is_tail, sp_n, n_stage)
        gw, gs, sw_off, ss_off = self.weight_lanes(mW, mS, bx, warp, lane, n_tiles)
        # activations: this thread copies pair P = lane of rows warp + W i; the destination of row
        # warp + W i is xd[i % x_period] + 128 W (i - i % x_period)
        x_rs = Int64(mX.stride[0]) * 2
        xs = []  # this lane's pair in each of its rows (rows past M: row M - 1)
        for i in cutlass.range_constexpr(self.rows_per_thread):
            tok = cutlass.min(m0 + warp + W * i, m - 1)
            xs.append(mX.iterator.toint() + Int64(tok) * x_rs + Int64(lane * 4))
        xd = []
        for j in cutlass.range_constexpr(self.x_period):
            xd.append(self.off_x + x_slot_offset(warp + W * j, lane))
        k_last = k - 2 - 2 * lane  # last in-range pair start of this lane, relative to the chunk start

        smem = cutlass.memory.SmemAllocator()
        ring_t = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(self.ring_bytes), SWIZZLE_ATOM)
        flag_t = smem.allocate_tensor(cutlass.Int32, cute.make_layout(4), 16)
        ring = ring_t.iterator.toint()
        policy = evict_first_policy()

        acc = cute.make_rmem_tensor((RT * MG * 4,), Float32)
        acc.fill(0.0)
        # opaque from here on: no constant zeros rematerialised into the accumulator registers (on a
        # path that skips the loop), which would make ptxas serialise the WGMMAs (C7515)
        _put(acc, 0, fence_regs(_get(acc, 0, RT * MG * 4)))

        # ---- prologue: weights of stages 0..D-3 first (they do not depend on the previous kernel)
        for j in cutlass.range_constexpr(D - 2):
            if j < n_it:
                self.produce_weights(ring + j * self.stage_bytes, st_lo + j, gw, gs, sw_off, ss_off, policy)
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        for j in cutlass.range_constexpr(D - 2):
            if j < n_it:
                self.copy_x(ring + j * self.stage_bytes, st_lo + j, xs, k_last, xd)
            cp_async_commit()

        # ---- main loop
        for it in cutlass.range(n_it, unroll=1):
            cp_async_wait(D - 3)
            fence_proxy_async_smem()
            cta_barrier()
            nxt = it + (D - 2)
            if nxt < n_it:
                sbase_n = ring + (nxt % D) * self.stage_bytes
                self.produce_weights(sbase_n, st_lo + nxt, gw, gs, sw_off, ss_off, policy)
                self.copy_x(sbase_n, st_lo + nxt, xs, k_last, xd)
            cp_async_commit()

            base = ring + (it % D) * self.stage_bytes
            # pin the accumulators (an empty asm that takes and returns them) so register allocation
            # keeps them in place across the loop: a copy between a WGMMA and its wait makes ptxas
            # serialise the WGMMAs (C7515)
            _put(acc, 0, fence_regs(_get(acc, 0, RT * MG * 4)))
            sw = self.scale_words(base, ss_off)
            for u in cutlass.range_constexpr(U):
                wv = []
                sp = []
                for rt in cutlass.range_constexpr(RT):
                    wv.append(lds_v4(base + sw_off + (rt * U + u) * 512))
                    sp.append(scale_pair(sw[rt][u // 2], u % 2, self.s_shift, self.s_add))
                desc = smem_desc_sw128(base + self.off_x + u * self.chunk_x_bytes)
                for s in cutlass.range_constexpr(4):
                    a = [self.a_fragment(wv[rt][s], sp[rt]) for rt in range(RT)]
                    warpgroup.fence()
                    for rt in cutlass.range_constexpr(RT):
                        i0 = rt * MG * 4
                        d = wgmma_rs(_get(acc, i0, MG * 4), a[rt], desc + 2 * s, self.tile_m, self.x_is_bf16)
                        _put(acc, i0, d)
                    warpgroup.commit_group()
                    warpgroup.wait_group(1)
        warpgroup.wait_group(0)
        _put(acc, 0, fence_regs(_get(acc, 0, RT * MG * 4)))
        # ---- epilogue (split-K: partials, and the last CTA of the tile sums them)
        # the role again from the block index: nothing of it stays live across the main loop
        tile, bs, is_tail, bm, bx = self.role(cute.arch.block_idx()[0], m, n_out)
        self.finish(acc, mAlpha, mBias, mRes, mOut, mWork, mCount, bx, bs, bm, warp, g, q, m, bm * self.tile_m,
                    n_tiles, n_out, n_pad, flag_t.iterator.toint(), tidx, tile, is_tail)

    @cute.jit
    def role(self, cta: Int32, m: Int32, n_out: Int32):
        """(tile, split part, split?, M tile, row block) of CTA ``cta`` (:func:`~.config.wgmma_cta_role`;
        the tail size from the grid: ``(grid - tiles) / (split_k - 1)``)."""
        grid_m = (m + self.tile_m - 1) // self.tile_m
        tiles = grid_m * ((n_out + self.feat_per_cta - 1) // self.feat_per_cta)
        tail = Int32(0)
        if cutlass.const_expr(self.split_k > 1):
            tail = (cute.arch.grid_dim()[0] - tiles) // (self.split_k - 1)
        tile, part, is_tail = wgmma_cta_role(cta, tiles, tail, self.split_k, _select)
        return tile, part, is_tail, tile % grid_m, tile // grid_m

    @cute.jit
    def copy_x(self, sbase: Int32, st: Int32, xs: list, k_last: Int32, xd: list):
        """cp.async this thread's activation pairs of global stage ``st`` -- pair ``lane`` of every
        chunk in each of its rows (``xs``: the pair's address in row ``warp + W i``, rows past M
        clamped to M - 1) -- into the stage's swizzled chunk tiles (:func:`~.operand.x_slot_offset`);
        zero-filled past K, where the address stays at the row's last in-range pair."""
        W, P = self.W, self.x_period
        for u in cutlass.range_constexpr(self.U):
            kc = st * self.cfg.tile_k + u * 64  # K of the chunk's first element
            nbytes = cutlass.select_(kc <= k_last, Int32(4), Int32(0))
            koff = Int64(cutlass.min(kc, k_last)) * 2
            dst_u = sbase + u * self.chunk_x_bytes
            for i in cutlass.range_constexpr(self.rows_per_thread):
                cp_async_small4(dst_u + xd[i % P] + 128 * W * (i - i % P), xs[i] + koff, nbytes)


class Sm90W4A16WgmmaTemplate(Sm90TemplateBase):
    """Registry entry of the WGMMA family (``template_id = "sm90_w4a16_wgmma"``); same C ABI as mma."""

    template_id = "sm90_w4a16_wgmma"
    family = "wgmma"
    kernel_class = Sm90W4A16WgmmaKernel

    def gated_problem(self, c: Sm90W4A16Config) -> str | None:
        if c.row_tiles % 2:
            return f"silu_mul needs two row blocks per warpgroup (gate + up), got {c.row_tiles}"
        return None

    def kernel_kwargs(self, spec) -> dict:
        return {"sm_count": spec.hw.sm_count}  # sm_90a only (its arch is checked by can_implement)


TEMPLATE = register_template(Sm90W4A16WgmmaTemplate(), replace=True)

__all__ = ["Sm90W4A16WgmmaKernel", "Sm90W4A16WgmmaTemplate", "TEMPLATE"]
