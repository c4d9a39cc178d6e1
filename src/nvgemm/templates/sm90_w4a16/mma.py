"""NVFP4 weight-only (W4A16) decode kernel on the tensor cores ("mma" family), in CuTeDSL, for
sm_80 / sm_86 / sm_89 (Ampere, Ada), sm_90a (Hopper) and sm_120a / sm_121a (GeForce / workstation
Blackwell, DGX Spark): one source; the target arch changes two instructions
(:class:`~.config.ArchCaps`: no PDL before sm_90, and the bf16 scale multiply as an exact
``fma.rn.bf16x2`` with a -0 addend where ``mul.bf16x2`` does not exist).

    out[m, f] = epilogue( alpha * sum_k x[m, k] * E2M1[q[f, k]] * s[f, k // 16] )

For decode batches (M of 1..32 per CTA) the GEMM is a stream over the weight (0.5625 bytes per
element). This kernel keeps that stream deep and decodes it at about two issued instructions per
weight element, independent of M up to 8 tokens.

Tensor cores, swap-AB: ``mma.sync.aligned.m16n8k16`` with the **weight as the 16-row A operand**
and 8 tokens as N, fp32 accumulators. Each lane's 16-byte weight vector (rows g, g + 8, scale
block q of a 64-element chunk; :mod:`.operand`) holds exactly its A fragments for the chunk's four
k-steps, so the decode is register-only: per 32-bit word 4 rotations + 4 masks / masked XORs give the
four bf16x2 / f16x2 A registers ``E2M1 * 2**-126`` (fp16: ``2**-14``), and one packed multiply
each by the lane's two block scales (re-encoded bytes -> ``s * 2**119`` / ``s * 2**7`` pairs, one
shift-add per chunk) makes them ``E2M1 * s * 2**-7`` -- exact (<= 6 significant bits, normal
except for e4m3-subnormal scales in fp16). The B fragments are the matching four activation
values per k-step, read from shared memory as they were copied (no conversion). The epilogue
restores 2**7 in fp32.

Work decomposition: a CTA owns ``tile_n`` weight rows (``num_warps`` warps x ``row_tiles``
16-row tiles each; for ``silu_mul`` a warp's first half of row tiles are gate rows and the second
half the matching up rows) and ``tile_m`` tokens (all M rows of a tile in one CTA: the weights
are read once per M tile), over its share of K: ``split_k`` CTAs split the K range in whole
pipeline stages. grid = (row blocks, split_k, M tiles).

Pipeline: a CTA-wide ring of ``stages`` shared-memory stages, each ``tile_k`` (= 64 x 2 or 4
chunks) deep: the weight vectors (16-byte ``cp.async.cg`` with an L2 **evict-first** policy; each
lane copies and later reads only its own vectors), the lanes' scale words (4/8-byte ``cp.async``,
evict-first) and the ``tile_m x tile_k`` activation tile (16-byte ``cp.async.ca``, zero-filled
past M and K; rows padded by 16 bytes so the 16-byte fragment loads are conflict-free). The
prologue issues ``stages - 1`` stages; each iteration waits for the oldest (``cp.async.wait_group
stages - 2`` + one CTA barrier), refills the slot just freed, and computes. With PDL the weight
and scale copies of the prologue are issued **before** ``griddepcontrol.wait`` (weights do not
depend on the previous kernel; the activations do -- the host synchronises once after preparing
a weight, so no predecessor is still writing it), and ``launch_dependents`` follows the main loop.

Split-K (``split_k > 1``): every CTA stores its fp32 partial tile to the workspace, fences, and
bumps its tile's counter; the CTA that brings it to ``split_k`` sums the partials in split order
(deterministic, independent of arrival), runs the epilogue and puts the counter back to zero, so
the counters need no per-call fill and a CUDA graph can replay the call.

Constraints (:func:`~.config.validate_config`, :func:`~.config.shape_problem`): K % 32 == 0 (the
prepared weight pads K to a multiple of 256 with zero codes), ``silu_mul`` needs N/2 % 16 == 0
and an even number of row tiles per warp, bf16/fp16 activations.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from nvgemm.core.epilogue import EpilogueSpec

from nvgemm.aot.abi import register_template
from nvgemm.templates.sm90_w4a16.common import (
    Sm90KernelBase,
    Sm90TemplateBase,
    cp_async_commit,
    cp_async_wait,
    cp_async_zfill,
    cta_barrier,
    evict_first_policy,
    lds_v4,
    mma_16816,
    pinned_i32,
    pinned_i64,
    scale_pair,
)
from nvgemm.templates.sm90_w4a16.config import CHUNK, MMA_ARCHS, Sm90W4A16Config, mma_stage_bytes
from nvgemm.templates.sm90_w4a16.operand import SCHEMES


class Sm90W4A16MmaKernel(Sm90KernelBase):
    """The decode kernel (see the module docstring)."""

    def __init__(self, config: Sm90W4A16Config, epilogue: EpilogueSpec, x_format: str = "bf16",
                 arch: str = "sm_90a"):
        self.init_common(config, epilogue, x_format, "mma", arch)
        c = config
        self.W, self.RT, self.U, self.MG, self.D = c.num_warps, c.row_tiles, c.chunks_per_stage, c.m_groups, c.stages
        self.pdl = c.pdl
        if self.gated and self.RT % 2:
            raise ValueError("silu_mul needs an even number of row tiles per warp")
        sb = mma_stage_bytes(c)
        self.off_s = sb["weights"]
        self.off_x = sb["weights"] + sb["scales"]
        self.stage_bytes = sum(sb.values())
        self.x_row = 2 * c.tile_k + 16  # bytes per token row of the staged activation tile
        self.ring_bytes = self.D * self.stage_bytes
        sch = SCHEMES[x_format]
        self.s_shift, self.s_add = sch.scale_shift, sch.scale_add
        # 16-byte activation pieces of a stage: each thread copies pieces of one token row at a fixed
        # stride, so one row pointer + immediate offsets address them all
        per_row = c.tile_k // 8
        self.x_pieces = c.tile_m * per_row
        if self.x_pieces >= self.threads:
            self.x_tpr = self.threads // c.tile_m  # threads per token row (powers of two: divides per_row)
            self.x_per_thread = per_row // self.x_tpr
        else:  # fewer pieces than threads: one piece each, thread t copying piece t % x_pieces (the
            # duplicates write the same bytes, so no thread needs a branch around its copy)
            self.x_tpr = per_row
            self.x_per_thread = 1
        assert self.x_tpr * self.x_per_thread == per_row and self.x_tpr * c.tile_m >= min(self.threads, self.x_pieces)

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
        self.kernel(mX, mW, mS, mAlpha, mBias, mRes, mOut, mWork, mCount).launch(
            grid=(grid_n, self.split_k, grid_m), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl
        )

    # ----------------------------------------------------------------------------- device helpers
    @cute.jit
    def tile_of(self, bx: Int32, warp: Int32, rt: int, n_tiles: Int32):
        """Global 16-row tile index of this warp's row tile ``rt``."""
        if cutlass.const_expr(self.gated):
            h = self.RT // 2
            t = bx * (self.W * h) + warp * h + (rt % h)
            if cutlass.const_expr(rt >= h):
                t = t + n_tiles // 2
            return t
        else:
            return bx * (self.W * self.RT) + warp * self.RT + rt

    @cute.jit
    def produce_x(self, sbase: Int32, st: Int32, k: Int32, xp: Int64, xd: Int32, pk: Int32):
        """cp.async this thread's 16-byte pieces of the stage's tile_m x tile_k activation tile:
        ``x_per_thread`` pieces of one token row, ``x_tpr`` pieces apart, addressed from one row
        address with immediate offsets (``xp``: the row's address, rows past M read row M - 1 --
        their outputs are never stored; ``xd``: the first piece's shared-memory offset; ``pk``: its
        K offset in the stage). Pieces past K copy 0 source bytes (zero-filled, nothing read: the
        prepared weight has zero codes there, but memory past K is not data)."""
        k0 = st * self.cfg.tile_k + pk
        rem = k - k0  # K elements left from this thread's first piece
        src = xp + Int64(k0) * 2
        step = self.x_tpr * 16
        for i in cutlass.range_constexpr(self.x_per_thread):
            ok = rem >= 8 + i * self.x_tpr * 8
            cp_async_zfill(sbase + xd + i * step, src + i * step, cutlass.select_(ok, Int32(16), Int32(0)))

    @cute.jit
    def x_lanes(self, mX: cute.Tensor, tidx: Int32, g: Int32, q: Int32, row_of):
        """Loop invariants of this thread's activation copies and fragment loads: the address of its
        token row ``row_of(tr)`` (``tr``: its row of the stage's tile), its first piece's K offset and
        shared-memory offset, and the lane's B-fragment offset in a stage."""
        xt = tidx % self.x_pieces if cutlass.const_expr(self.x_pieces < self.threads) else tidx
        tr = xt // self.x_tpr
        xp = pinned_i64(mX.iterator.toint() + Int64(row_of(tr)) * (Int64(mX.stride[0]) * 2))
        pk = pinned_i32((xt % self.x_tpr) * 8)
        xd = pinned_i32(self.off_x + tr * self.x_row + (xt % self.x_tpr) * 16)
        return xp, pk, xd, self.off_x + g * self.x_row + q * 32

    @cute.jit
    def cta_state(self):
        """The CTA's shared-memory ring and split-K flag word, the evict-first policy and the zeroed
        fp32 accumulators: ``(ring address, flag address, policy, acc)``."""
        smem = cutlass.memory.SmemAllocator()
        ring_t = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(self.ring_bytes), 128)
        flag_t = smem.allocate_tensor(cutlass.Int32, cute.make_layout(4), 16)
        acc = cute.make_rmem_tensor((self.RT * self.MG * 4,), Float32)
        acc.fill(0.0)
        return ring_t.iterator.toint(), flag_t.iterator.toint(), evict_first_policy(), acc

    @cute.jit
    def compute_stage(self, base: Int32, sw_off: Int32, ss_off: Int32, x_lds: Int32, acc: cute.Tensor):
        """The MMAs of the ring stage at ``base``: per chunk, the B fragments (token 8 mg + g, the 16
        activations of block q: 32 bytes), then per row tile the lane's weight vector decoded into
        the four A registers of each k-step and one ``mma.sync`` per group of 8 tokens into ``acc``."""
        RT, U, MG = self.RT, self.U, self.MG
        sw = self.scale_words(base, ss_off)
        for u in cutlass.range_constexpr(U):
            xb = []
            for mg in cutlass.range_constexpr(MG):
                xa = base + x_lds + mg * 8 * self.x_row + u * 128
                xb.append(lds_v4(xa) + lds_v4(xa + 16))
            for rt in cutlass.range_constexpr(RT):
                wv = lds_v4(base + sw_off + (rt * U + u) * 512)
                sp = scale_pair(sw[rt][u // 2], u % 2, self.s_shift, self.s_add)
                for s in cutlass.range_constexpr(4):
                    a = self.a_fragment(wv[s], sp)
                    for mg in cutlass.range_constexpr(MG):
                        i0 = (rt * MG + mg) * 4
                        d = mma_16816(a, (xb[mg][2 * s], xb[mg][2 * s + 1]),
                                      [acc[i0], acc[i0 + 1], acc[i0 + 2], acc[i0 + 3]], self.x_is_bf16)
                        for i in cutlass.range_constexpr(4):
                            acc[i0 + i] = d[i]

    @cute.jit
    def pipeline(self, ring: Int32, n_it: Int32, st_lo: Int32, gw: list, gs: list, sw_off: Int32, ss_off: Int32,
                 k: Int32, xp: Int64, xd: Int32, pk: Int32, x_lds: Int32, acc: cute.Tensor, policy: Int64,
                 pdl_wait: bool):
        """The ring over this CTA's ``n_it`` stages from ``st_lo``: the prologue issues the weights of
        stages 0..D-2 first (they do not depend on the previous kernel; with ``pdl_wait`` the
        ``griddepcontrol.wait`` comes next), then their activations; each iteration waits for the
        oldest stage, refills the slot just freed and computes (:meth:`compute_stage`)."""
        D = self.D
        for j in cutlass.range_constexpr(D - 1):
            if j < n_it:
                self.produce_weights(ring + j * self.stage_bytes, st_lo + j, gw, gs, sw_off, ss_off, policy)
        if cutlass.const_expr(pdl_wait):
            cute.arch.griddepcontrol_wait()
        for j in cutlass.range_constexpr(D - 1):
            if j < n_it:
                self.produce_x(ring + j * self.stage_bytes, st_lo + j, k, xp, xd, pk)
            cp_async_commit()
        for it in cutlass.range(n_it, unroll=1):
            cp_async_wait(D - 2)
            cta_barrier()
            nxt = it + (D - 1)
            if nxt < n_it:
                sbase_n = ring + (nxt % D) * self.stage_bytes
                self.produce_weights(sbase_n, st_lo + nxt, gw, gs, sw_off, ss_off, policy)
                self.produce_x(sbase_n, st_lo + nxt, k, xp, xd, pk)
            cp_async_commit()
            self.compute_stage(ring + (it % D) * self.stage_bytes, sw_off, ss_off, x_lds, acc)

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
        tidx, _, _ = cute.arch.thread_idx()
        bx, bs, bm = cute.arch.block_idx()
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
        m0 = bm * self.tile_m

        st_lo, n_it = self.split_range(n_chunks, bs)  # this split's K range, in whole stages
        gw, gs, sw_off, ss_off = self.weight_lanes(mW, mS, bx, warp, lane, n_tiles)
        # this thread's activation pieces: token row m0 + tr (clamped to M - 1), K offsets pk + i 8 tpr
        xp, pk, xd, x_lds = self.x_lanes(mX, tidx, g, q, lambda tr: cutlass.min(m0 + tr, m - 1))
        ring, flag, policy, acc = self.cta_state()

        self.pipeline(ring, n_it, st_lo, gw, gs, sw_off, ss_off, k, xp, xd, pk, x_lds, acc, policy, self.pdl)
        # ---- epilogue (split-K: partials, and the last CTA of the tile sums them)
        self.finish(acc, mAlpha, mBias, mRes, mOut, mWork, mCount, bx, bs, bm, warp, g, q, m, m0, n_tiles, n_out,
                    n_pad, flag, tidx, bm * cute.arch.grid_dim()[0] + bx)


class Sm90W4A16MmaTemplate(Sm90TemplateBase):
    """Registry entry of the decode family (``template_id = "sm90_w4a16_mma"``)."""

    template_id = "sm90_w4a16_mma"
    family = "mma"
    kernel_class = Sm90W4A16MmaKernel
    archs = MMA_ARCHS

    def gated_problem(self, c: Sm90W4A16Config) -> str | None:
        if c.row_tiles % 2:
            return f"silu_mul needs an even number of row tiles per warp (gate + up), got {c.row_tiles}"
        return None


TEMPLATE = register_template(Sm90W4A16MmaTemplate(), replace=True)

__all__ = ["CHUNK", "Sm90W4A16MmaKernel", "Sm90W4A16MmaTemplate", "TEMPLATE"]
