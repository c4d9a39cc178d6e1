"""The MoE finalize step as one Triton kernel (CUDA): ``out[t] = round(sum_s w[t, s] * y[pos[t, s]]
(+ shared_out[t]) (+ residual[t]))``, fp32, slots in order, empty slots skipped -- bit-identical to
:func:`~.launch.finalize_ref` (compiled with ``enable_fp_fusion=False`` so no multiply is contracted
into an add; one program per (token, 1024 columns), no atomics). Runs under ``TRITON_INTERPRET=1``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvgemm.templates.triton._common import f32_to_bf16_rne

_BLOCK = 1024


@triton.jit
def _finalize_kernel(y_ptr, pos_ptr, valid_ptr, w_ptr, sh_ptr, res_ptr, out_ptr, H, K: tl.constexpr,
                     HAS_SH: tl.constexpr, HAS_RES: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(K):
        ok = tl.load(valid_ptr + t * K + s) != 0
        if ok:
            p = tl.load(pos_ptr + t * K + s)
            w = tl.load(w_ptr + t * K + s)
            y = tl.load(y_ptr + p * H + cols, mask=mask, other=0.0)
            acc = acc + w * y
    if HAS_SH:
        acc = acc + tl.load(sh_ptr + t * H + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        acc = acc + tl.load(res_ptr + t * H + cols, mask=mask, other=0.0).to(tl.float32)
    if OUT_BF16:  # explicit RNE (identical on GPU and the interpreter)
        tl.store(out_ptr + t * H + cols, f32_to_bf16_rne(acc), mask=mask)
    else:
        tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def finalize_triton(y, pos, valid, weights, shared_out, residual, out_dtype, *, kernel=None):
    """:func:`~.launch.finalize_ref` in one launch; ``kernel``: the jitted kernel to launch instead of
    ``_finalize_kernel`` (the PTX emulator's stand-in)."""
    kernel = kernel or _finalize_kernel
    m, k = pos.shape
    h = y.shape[1]
    out = torch.empty((m, h), dtype=out_dtype, device=y.device)
    if m == 0:
        return out
    sh = shared_out.contiguous() if shared_out is not None else out
    res = residual.contiguous() if residual is not None else out
    grid = (m, triton.cdiv(h, _BLOCK))
    valid8 = valid.view(torch.int8) if valid.dtype == torch.bool else valid.to(torch.int8)
    w = weights if weights.dtype == torch.float32 and weights.is_contiguous() else weights.float().contiguous()
    kernel[grid](y, pos.contiguous(), valid8, w, sh, res, out, h, K=k, HAS_SH=shared_out is not None,
                 HAS_RES=residual is not None, OUT_BF16=out_dtype == torch.bfloat16, BLOCK=_BLOCK,
                 enable_fp_fusion=False)
    return out
