"""sm_120a / sm_121a grouped W4A4 MoE kernel (CuTeDSL): the sm120 swap-AB decode kernel over a work list.

    out[j * tile_n + t, f] = epilogue_e( sum_k E2M1(W_e[f, k]) sw_e[f, k/16] E2M1(X[j, t, k]) sx[j, t, k/16] )

for every work slot ``j = (e, p0, cnt)`` (``cnt > 0``) and token row ``t < tile_n`` of the slot.
The main loop is :meth:`nvgemm.templates.sm120_w4a4.kernel.Sm120Nvfp4GemmKernel.main_loop` (cp.async
ring, ``ldmatrix`` fragments, ``mma.sync m16n8k64 .kind::mxf4nvf4.block_scale``), its split-K reduce
and plain epilogue the dense kernel's; the grouped kernel only changes where the operands are:

* grid = (row blocks of one expert, split_k, work slots); CTA ``(bx, bs, j)`` reads slot ``j`` of
  the work list after ``griddepcontrol.wait`` (PDL: the predecessor writes the list, so no weight is
  prefetched before it), and a slot with ``cnt == 0`` (past the routing's tiles) does nothing;
* **weights**: rows ``e * rows_padded + ..`` of the stacked operand ``[E * rows_padded, K / 2]`` and
  of its 2-D 128x4-swizzled scales (``rows`` valid rows per expert: the dense kernel's row clamp and
  zero fill work per expert);
* **activations**: slot ``j``'s ``tile_n`` rows of ``[slots * tile_n, K / 2]``; their scales are one
  128-row swizzled atom per slot (:meth:`Sm120MoeKernel.x_scale_offset`);
* **alpha**: the expert's, ``alpha[e * stride ..]`` with ``stride`` = 1 (scalar) or ``rows``
  (vector), plus 1 when the fused requant's next input scale follows.

GEMM1 (``out_quant``, gated): the **fused SwiGLU + NVFP4 requant** epilogue of the dense kernel
(:meth:`~nvgemm.templates.sm120_w4a4.kernel.Sm120Nvfp4GemmKernel.store_requant`), with the scale bytes
in slot ``j``'s own 128-row atom (:meth:`Sm120MoeKernel.requant_scale_offset`). In the m16n8 C layout
lane ``(g, q)`` holds rows ``g``, ``g + 8`` of a row tile x tokens ``2q``, ``2q + 1`` of a token
group; a warp's gate row tile ``t`` and its up row tile ``t + I/16`` give 16 gated features of 8
tokens = one NVFP4 block of GEMM2's input per token. Per token: ``h = round_x(silu(alpha g) * alpha u)``
(the epilogue order; rounded to the activation dtype), block amax = max over the lane's two rows,
then ``shfl.bfly`` 4, 8, 16 (the 8 lanes of one ``q``); ``sf = e4m3(min(amax / (6 gs), 448))``,
``S = float(sf) gs``, code = ``e2m1(h / S)`` (true division; +0 for a zero ``h`` or block: one
rounding, the ``quantize_activation`` convention); an even-``g`` lane takes its neighbour's code
(``shfl.bfly 4``: feature ``g + 1``) and stores the byte (even feature in the low nibble) at
``codes[token, 8 t + g / 2 + 4 (row half)]``; lane ``g = 0`` stores ``sf`` into slot ``j``'s
128x4-swizzled atom (row = the token's row in the slot, K block ``t``). Every row of a non-empty
slot is written (rows past ``cnt`` carry zero codes and scales), so GEMM2 reads no stale byte.

GEMM2: ``y = acc * alpha2[e]`` in fp32 ``[slots * tile_n, H]`` (the dense epilogue); the finalize
(weighted top-k sum in slot order) is the shared Triton / torch one.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from nvgemm.aot.abi import ScalarArg, StreamArg, SymDim, TensorArg, compile_for_target, fake_args, register_template
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.core.status import Status
from nvgemm.templates.common.grouped_moe import w4a4_moe_spec_status
from nvgemm.templates.sm120_moe.config import MOE_ARCHS, MOE_FAMILY, TEMPLATE_ID, Sm120MoeConfig, validate_moe_config
from nvgemm.templates.sm120_w4a4.config import ROW_TILE
from nvgemm.templates.sm120_w4a4.kernel import Sm120Nvfp4GemmKernel
from nvgemm.templates.sm90_w4a16.common import pinned_i32



class Sm120MoeKernel(Sm120Nvfp4GemmKernel):
    """The grouped decode kernel (see the module docstring)."""

    wait_in_main_loop = False  # the kernel waits before it reads the work list

    def __init__(self, config: Sm120MoeConfig, epilogue: EpilogueSpec):
        validate_moe_config(config).raise_if_failed("sm120 moe config")
        super().__init__(config.dense(), epilogue)
        self.moe_cfg = config
        self.requant = epilogue.out_quant
        if self.requant and not self.gated:
            raise ValueError("the fused NVFP4 requant of the grouped sm120 kernel follows silu_mul")

    # ----------------------------------------------------------------------------- host
    @cute.jit
    def __call__(self, mX: cute.Tensor, mXS: cute.Tensor, mW: cute.Tensor, mWS: cute.Tensor, mAlpha: cute.Tensor,
                 mTiles: cute.Tensor, mOut: cute.Tensor, mSF: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor,
                 rows: Int32, rows_padded: Int32, stream: cuda.CUstream):
        slots = mX.shape[0] // self.tile_m
        n_out = rows // 2 if self.gated else rows
        grid_n = (n_out + self.feat_per_cta - 1) // self.feat_per_cta
        self.kernel(mX, mXS, mW, mWS, mAlpha, mTiles, mOut, mSF, mWork, mCount, rows, rows_padded).launch(
            grid=(grid_n, self.split_k, slots), block=(self.threads, 1, 1), stream=stream, use_pdl=self.pdl)

    # ----------------------------------------------------------------------------- hooks
    @cute.jit
    def x_scale_offset(self, xr: Int32, kb_tiles: Int32) -> Int32:
        """Token row ``xr`` = row ``xr % tile_n`` of slot ``xr // tile_n``'s own 128-row atom."""
        r = xr % self.tile_m
        return (xr // self.tile_m) * kb_tiles * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4

    @cute.jit
    def requant_scale_offset(self, tok: Int32, t: Int32, kb4: Int32) -> Int32:
        """GEMM1's requant scale byte of token row ``tok`` = row ``tok % tile_n`` of slot ``tok // tile_n``'s
        own 128-row atom (GEMM2's B scale layout), K block ``t``."""
        r = tok % self.tile_m
        return ((tok // self.tile_m) * kb4 + t // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + t % 4

    # ----------------------------------------------------------------------------- kernel
    @cute.kernel
    def kernel(self, mX: cute.Tensor, mXS: cute.Tensor, mW: cute.Tensor, mWS: cute.Tensor, mAlpha: cute.Tensor,
               mTiles: cute.Tensor, mOut: cute.Tensor, mSF: cute.Tensor, mWork: cute.Tensor, mCount: cute.Tensor,
               rows: Int32, rows_padded: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        tidx = pinned_i32(tidx)  # see the dense kernel
        bx, bs, bm = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        g = lane // 4
        q = lane % 4
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        e = mTiles[bm * 4]
        cnt = mTiles[bm * 4 + 2]

        m = mX.shape[0]
        k = mX.shape[1] * 2
        n = rows
        n_tiles = (n + ROW_TILE - 1) // ROW_TILE
        n_out = n // 2 if self.gated else n
        n_pad = n_tiles * ROW_TILE
        m0 = bm * self.tile_m
        st_lo, n_it = self.split_range(k, bs)
        n_it = cutlass.select_(cnt > 0, n_it, Int32(0))

        ring, flag = self.shared_buffers()
        acc = cute.make_rmem_tensor((self.RT * self.MG * 4,), Float32)
        acc.fill(0.0)
        self.main_loop(mX, mXS, mW, mWS, acc, ring, tidx, bx, warp, lane, m, m0, n, k, st_lo, n_it, e * rows_padded)

        stride = 1
        if cutlass.const_expr(self.epi.alpha == "vector"):
            stride = n
        if cutlass.const_expr(self.requant):
            stride = stride + 1
        mAlphaE = cute.make_tensor(mAlpha.iterator + e * stride, mAlpha.layout)
        if cnt > 0:
            self.finish(acc, mAlphaE, mAlphaE, mSF, mOut, mWork, mCount, bx, bs, bm, warp, g, q, m, m0, n_tiles, n_out,
                        n_pad, flag, tidx, bm * cute.arch.grid_dim()[0] + bx)


# ---------------------------------------------------------------------------------------------
# registry contract
# ---------------------------------------------------------------------------------------------


def abi_args(spec) -> tuple:
    """C ABI, in order (:meth:`nvgemm.templates.sm120_moe.launch.Sm120MoeGemmArgs.abi_values`):

        mX      uint8 [slots * tile_n, K/2]   per-slot packed activations
        mXS     uint8 1-D: one 128-row 128x4-swizzled scale atom per slot
        mW      uint8 [E * rows_padded, K/2]  stacked packed weights (GEMM1: [gate | up] per expert)
        mWS     uint8 1-D: the 2-D 128x4 swizzle of the stack's [E * rows_padded, K/16] scales
        mAlpha  fp32 [E * stride]: per expert alpha (1 or rows values) [+ next input scale]
        mTiles  int32 [4 * slots]: (expert, first permuted pair, pairs, 0)
        mOut    out_quant: uint8 [slots * tile_n, I/2] packed codes; else fp32 [slots * tile_n, rows]
        mSF     out_quant: uint8 1-D per-slot scale atoms of the codes; else never read
        mWork   fp32, mCount int32 (split-K partials and tile counters; else never read)
        rows, rows_padded int32 (weight rows per expert, and per expert in the stack); stream
    """
    q = spec.epilogue.out_quant
    vec = {"shape": (SymDim(),), "stride": (1,), "assumed_align": 4}
    flat = {"shape": (SymDim(512),), "stride": (1,), "assumed_align": 16}
    packed = {"shape": (SymDim(), SymDim(16)), "stride": (SymDim(16, 64), 1), "assumed_align": 16}
    out = TensorArg("mOut", "Uint8", **packed) if q else \
        TensorArg("mOut", "Float32", shape=(SymDim(), SymDim(4)), stride=(SymDim(4, 64), 1), assumed_align=16)
    return (
        TensorArg("mX", "Uint8", **packed),
        TensorArg("mXS", "Uint8", **flat),
        TensorArg("mW", "Uint8", **packed),
        TensorArg("mWS", "Uint8", **flat),
        TensorArg("mAlpha", "Float32", **vec),
        TensorArg("mTiles", "Int32", shape=(SymDim(4),), stride=(1,), assumed_align=16),
        out,
        TensorArg("mSF", "Uint8", **flat),
        TensorArg("mWork", "Float32", **vec),
        TensorArg("mCount", "Int32", **vec),
        ScalarArg("rows", "int32"),
        ScalarArg("rows_padded", "int32"),
        StreamArg("stream"),
    )


class Sm120MoeTemplate:
    """Registry entry of the grouped sm120 kernel (``template_id = "sm120_moe_nvfp4"``)."""

    template_id = TEMPLATE_ID
    config_type = Sm120MoeConfig
    archs = MOE_ARCHS
    family = MOE_FAMILY

    def can_implement(self, spec) -> Status:
        st = validate_moe_config(spec.config)
        if not st:
            return st
        st = w4a4_moe_spec_status("sm120", spec, self.archs)
        if not st:
            return st
        epi = spec.epilogue
        if epi.gated != epi.out_quant:
            return Status.fail("gated GEMM1 of the grouped kernel writes GEMM2's NVFP4 input (silu_mul with "
                               "out_quant=True); GEMM2 is plain (activation none, fp32 out)")
        if epi.gated and spec.config.dense().row_tiles % 2:
            return Status.fail(f"silu_mul needs an even number of row tiles per warp, got "
                               f"{spec.config.dense().row_tiles}")
        if not epi.gated and (epi.activation != "none" or epi.out_dtype.itemsize != 4):
            return Status.fail("GEMM2 of the grouped kernel writes fp32 without an activation")
        return Status.success()

    def abi(self, spec):
        return abi_args(spec)

    def make_kernel(self, spec) -> Sm120MoeKernel:
        self.can_implement(spec).raise_if_failed(spec.name())
        return Sm120MoeKernel(spec.config, spec.epilogue)

    def compile(self, spec, *, keep_ptx: bool = False):
        return compile_for_target(self.make_kernel(spec), fake_args(self.abi(spec)), spec,
                                  "--keep-ptx" if keep_ptx else "")


TEMPLATE = register_template(Sm120MoeTemplate(), replace=True)

__all__ = ["Sm120MoeKernel", "Sm120MoeTemplate", "TEMPLATE", "TEMPLATE_ID", "abi_args"]
