"""Triton grouped NVFP4 MoE (W4A16, and W4A4 by quantize-dequantize): ``nvgemm::nvfp4_moe`` on any CUDA GPU.

Four steps, all deterministic (no float atomics), no host synchronisation (CUDA-graph safe: every
buffer and grid is sized from M, top-k and the expert count alone):

1. **prep** (:func:`moe_align`, torch ops): map global expert ids through ``expert_map`` (``-1``
   and unmapped ids are dropped), stable-sort the M*top_k (token, slot) pairs by local expert, pad
   each expert's run to a multiple of ``BLOCK_M`` and label every BLOCK_M block with its expert
   (``-1`` for blocks past the end). Pairs keep (token, slot) order inside an expert.
2. **GEMM1** (:func:`moe_gemm1_kernel`): per (block, feature tile) the program gathers its pairs'
   token rows of x (times the router weight first when ``router_weight_on_input``, rounded to x's
   dtype), quantize-dequantizes them with the expert's ``w13_input_scale`` (W4A4), multiplies by the
   expert's dequantized ``w13`` (E2M1 * e4m3, the :mod:`.gemm_w4a16` tile decoder) in fp32 and applies
   ``alpha13 = input_scale[e] * weight_scale_2[e(, row)]`` and the activation (``silu_mul`` on
   ``[gate | up]`` halves, ``silu``, ``gelu_tanh``, ``relu2``, ``none``); the result is rounded to x's
   dtype (the contract's ``h``) and stored in sorted-pair order.
3. **GEMM2** (:func:`moe_gemm2_kernel`): the same for ``w2`` on h (W4A4: quantize-dequantize with
   ``w2_input_scale[e]``), ``y = acc * alpha2[e]`` in fp32 times the pair's router weight (1 when it
   went on the input), stored in fp32 at row ``token * top_k + slot``.
4. **finalize** (:func:`moe_finalize_kernel`): ``out[t] = round(sum_k y[t, k] (+ shared_out[t])
   (+ residual[t]))`` in fp32, slots in order 0..top_k-1, dropped pairs skipped, one rounding.

This is the numerics contract of ``nvgemm::nvfp4_moe`` (the emulated op), step for step; the only
freedom taken is the fp32 summation order inside each GEMM (see :mod:`.gemm_w4a16`). In the
interpreter the dots run on fp32 operands with ``input_precision="ieee"`` (same operand values).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from nvgemm.templates.triton._common import (
    cast_to_kind,
    ceil_div,
    check_device,
    dtype_kind,
    is_interpreted,
    launch_options,
    next_pow2,
    nvfp4_qdq_tile,
    round_to_kind,
)
from nvgemm.templates.triton.gemm_w4a16 import _gelu_tanh, _silu, _w_tile

__all__ = ["MOE_ACT_CODES", "moe_align", "moe_config", "nvfp4_moe_triton", "moe_gemm1_kernel", "moe_gemm2_kernel",
           "moe_finalize_kernel"]

MOE_ACT_CODES = {"none": 0, "silu": 1, "gelu_tanh": 2, "silu_mul": 3, "relu2": 4}


# --------------------------------------------------------------------------- prep (torch)


def moe_align(topk_ids: torch.Tensor, num_local_experts: int, block_m: int,
              expert_map: Optional[torch.Tensor] = None):
    """Sort and pad the (token, slot) pairs by local expert.

    Returns ``(sorted_pairs int32 [cap], block_expert int32 [cap // block_m], local_ids int32 [M*K])``:
    ``sorted_pairs[j]`` is the flat pair index ``t * K + k`` at sorted position j (``M*K`` in padding),
    ``block_expert[b]`` the local expert of block b (``-1`` past the last expert's run) and
    ``local_ids`` each pair's local expert (``-1`` when dropped). ``cap = M*K + min(E, M*K) * (block_m - 1)``
    rounded up to ``block_m`` bounds the padded length for every routing, so no host sync is needed.
    Deterministic: a stable sort and scatters to distinct positions.
    """
    dev = topk_ids.device
    p = topk_ids.numel()
    e = int(num_local_experts)
    ids = topk_ids.reshape(-1).long()
    if expert_map is not None:
        em = expert_map.to(dev).long()
        ok = (ids >= 0) & (ids < em.numel())
        ids = torch.where(ok, em[ids.clamp(0, max(em.numel() - 1, 0))], torch.full_like(ids, -1))
    ids = torch.where((ids >= 0) & (ids < e), ids, torch.full_like(ids, -1))
    cap = ceil_div(p + min(e, p) * (block_m - 1), block_m) * block_m
    key = torch.where(ids >= 0, ids, torch.full_like(ids, e))
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=e + 1)[:e]
    padded = (counts + block_m - 1) // block_m * block_m
    pend = torch.cumsum(padded, 0)
    pstart = pend - padded
    cstart = torch.cumsum(counts, 0) - counts
    skey = key[order]
    valid = skey < e
    ec = skey.clamp(max=max(e - 1, 0))
    j = torch.arange(p, device=dev)
    dest = torch.where(valid, pstart[ec] + (j - cstart[ec]), torch.full_like(j, cap))
    sorted_pairs = torch.full((cap + 1,), p, dtype=torch.int32, device=dev)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))  # dropped pairs all land in the spare slot cap
    starts = torch.arange(cap // block_m, device=dev) * block_m
    bexp = torch.searchsorted(pend, starts, right=True)
    bexp = torch.where(bexp < e, bexp, torch.full_like(bexp, -1)).to(torch.int32)
    return sorted_pairs[:cap].contiguous(), bexp, ids.to(torch.int32)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _act(y, ACTIVATION: tl.constexpr):
    if ACTIVATION == 1:
        y = _silu(y)
    elif ACTIVATION == 2:
        y = _gelu_tanh(y)
    elif ACTIVATION == 4:
        r = tl.maximum(y, 0.0)
        y = r * r
    return y


@triton.jit
def _dot_acc(a, w, acc, DOT_FP32: tl.constexpr):
    """acc += a @ w.T: fp32 IEEE operands in the interpreter, else a's dtype (w's values are exact in it)."""
    if DOT_FP32:
        acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(w.to(a.dtype)), acc)
    return acc


@triton.jit
def _alpha(ws2_ptr, ins_ptr, e, cols, N, stride_ws2e, QUANT_A: tl.constexpr, ALPHA_ROW: tl.constexpr):
    """fp32 ``input_scale[e] * weight_scale_2[e(, cols)]`` as a [1, BLOCK_N] row (or a scalar)."""
    if ALPHA_ROW:
        a = tl.load(ws2_ptr + e * stride_ws2e + cols, mask=cols < N, other=0.0)[None, :]
    else:
        a = tl.load(ws2_ptr + e)
    if QUANT_A:
        a = tl.load(ins_ptr + e) * a
    return a


@triton.jit
def moe_gemm1_kernel(
    x_ptr, tw_ptr, pairs_ptr, bexp_ptr, w_ptr, wsf_ptr, ws2_ptr, ins_ptr, h_ptr,
    P, TOPK, N, N_OUT, K, stride_xm, stride_we, stride_wn, stride_sfe, stride_ws2e, stride_hm,
    QUANT_A: tl.constexpr, ALPHA_ROW: tl.constexpr, ROUTER_ON_INPUT: tl.constexpr, ACTIVATION: tl.constexpr,
    X_KIND: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(bexp_ptr + pid_b)
    if e >= 0:
        pos = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(pairs_ptr + pos)
        valid = pair < P
        tok = (pair // TOPK).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        e64 = e.to(tl.int64)
        we_ptr = w_ptr + e64 * stride_we
        sfe_ptr = wsf_ptr + e64 * stride_sfe
        GATED: tl.constexpr = ACTIVATION == 3
        if QUANT_A:
            gs = tl.load(ins_ptr + e)
        if ROUTER_ON_INPUT:
            rw = tl.load(tw_ptr + pair, mask=valid, other=0.0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if GATED:
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + tok[:, None] * stride_xm + offs_k[None, :],
                        mask=valid[:, None] & (offs_k[None, :] < K), other=0.0)
            if ROUTER_ON_INPUT:
                a = round_to_kind(a.to(tl.float32) * rw[:, None], X_KIND)
            if QUANT_A:
                a = nvfp4_qdq_tile(a.to(tl.float32), gs, BLOCK_M, BLOCK_K)
            if DOT_FP32:
                a = a.to(tl.float32)
            else:
                a = a.to(x_ptr.dtype.element_ty)  # exact: x's dtype values, or e2m1 * e4m3
            acc = _dot_acc(a, _w_tile(we_ptr, sfe_ptr, offs_n, k0, N, K, stride_wn, BLOCK_K, BLOCK_N), acc, DOT_FP32)
            if GATED:
                wu = _w_tile(we_ptr, sfe_ptr, offs_n + N_OUT, k0, N, K, stride_wn, BLOCK_K, BLOCK_N)
                acc_up = _dot_acc(a, wu, acc_up, DOT_FP32)
        y = acc * _alpha(ws2_ptr, ins_ptr, e, offs_n, N, stride_ws2e, QUANT_A, ALPHA_ROW)
        if GATED:
            y = _silu(y) * (acc_up * _alpha(ws2_ptr, ins_ptr, e, offs_n + N_OUT, N, stride_ws2e, QUANT_A, ALPHA_ROW))
        else:
            y = _act(y, ACTIVATION)
        tl.store(h_ptr + pos.to(tl.int64)[:, None] * stride_hm + offs_n[None, :], cast_to_kind(y, X_KIND),
                 mask=valid[:, None] & (offs_n[None, :] < N_OUT))


@triton.jit
def moe_gemm2_kernel(
    h_ptr, tw_ptr, pairs_ptr, bexp_ptr, w_ptr, wsf_ptr, ws2_ptr, ins_ptr, y_ptr,
    P, N, K, stride_hm, stride_we, stride_wn, stride_sfe, stride_ym,
    QUANT_A: tl.constexpr, APPLY_WEIGHT: tl.constexpr, DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(bexp_ptr + pid_b)
    if e >= 0:
        pos = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(pairs_ptr + pos)
        valid = pair < P
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        e64 = e.to(tl.int64)
        we_ptr = w_ptr + e64 * stride_we
        sfe_ptr = wsf_ptr + e64 * stride_sfe
        if QUANT_A:
            gs = tl.load(ins_ptr + e)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(h_ptr + pos.to(tl.int64)[:, None] * stride_hm + offs_k[None, :],
                        mask=valid[:, None] & (offs_k[None, :] < K), other=0.0)
            if QUANT_A:
                a = nvfp4_qdq_tile(a.to(tl.float32), gs, BLOCK_M, BLOCK_K)
            if DOT_FP32:
                a = a.to(tl.float32)
            else:
                a = a.to(h_ptr.dtype.element_ty)
            acc = _dot_acc(a, _w_tile(we_ptr, sfe_ptr, offs_n, k0, N, K, stride_wn, BLOCK_K, BLOCK_N), acc, DOT_FP32)
        y = acc * _alpha(ws2_ptr, ins_ptr, e, offs_n, N, 0, QUANT_A, False)
        if APPLY_WEIGHT:
            y = tl.load(tw_ptr + pair, mask=valid, other=0.0)[:, None] * y
        tl.store(y_ptr + pair.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], y,
                 mask=valid[:, None] & (offs_n[None, :] < N))


@triton.jit
def moe_finalize_kernel(
    y_ptr, ids_ptr, sh_ptr, res_ptr, out_ptr,
    M, N, stride_ym, stride_sm, stride_rm, stride_om,
    TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_RESIDUAL: tl.constexpr, OUT_KIND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    r64 = rows.to(tl.int64)[:, None]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.static_range(TOPK):  # slot order, fp32
        ok = tl.load(ids_ptr + rows * TOPK + k, mask=rows < M, other=-1) >= 0
        acc += tl.load(y_ptr + (r64 * TOPK + k) * stride_ym + cols[None, :], mask=mask & ok[:, None], other=0.0)
    if HAS_SHARED:
        acc += tl.load(sh_ptr + r64 * stride_sm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        acc += tl.load(res_ptr + r64 * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + r64 * stride_om + cols[None, :], cast_to_kind(acc, OUT_KIND), mask=mask)


# --------------------------------------------------------------------------- host


def moe_config(m: int, top_k: int, num_experts: int, n_out: int, k: int, interpreted: bool):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of one grouped GEMM.

    BLOCK_M (pairs per block) follows the mean tokens per expert ``m * top_k / E`` (16 at decode,
    up to 64); each block streams its expert's weight once per BLOCK_N tile. The interpreter gets
    the largest tiles the problem allows (its cost is per program and per op).
    """
    tpe = m * top_k / max(num_experts, 1)
    block_m = 16 if tpe <= 16 else 32 if tpe <= 48 else 64
    kp = next_pow2(max(k, 16))
    if interpreted:
        return block_m, min(max(next_pow2(n_out), 16), 64), min(kp, 256), 4, 1
    return block_m, 64, min(kp, 128), 4, 3


def _scales_2d(s: torch.Tensor, e: int, name: str) -> torch.Tensor:
    """Per-expert swizzled block scales (the op's tiled ``[E, *blocked_shape]``) as raw bytes [E, S]."""
    s = s.view(torch.uint8) if s.dtype != torch.uint8 else s
    if s.dim() == 1 or (s.dim() > 2 and s.shape[0] == e):
        s = s.reshape(e, -1)
    if s.dim() != 2 or s.shape[0] != e:
        raise ValueError(f"nvgemm.nvfp4_moe[triton]: {name} must hold one swizzled scale block per expert, got "
                         f"shape {tuple(s.shape)} for {e} experts")
    return s.contiguous()


def nvfp4_moe_triton(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_scale_2: torch.Tensor,
    w13_input_scale: Optional[torch.Tensor],
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_scale_2: torch.Tensor,
    w2_input_scale: Optional[torch.Tensor],
    activation: str = "silu_mul",
    router_weight_on_input: bool = False,
    expert_map: Optional[torch.Tensor] = None,
    shared_out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    *,
    config: tuple[int, int, int, int, int] | None = None,
    kernels=None,
) -> torch.Tensor:
    """``nvgemm::nvfp4_moe`` on the Triton kernels (arguments as the op; validated by the caller).

    ``w13`` uint8 [E, R13, H/2] (gated: R13 = 2I, rows ``[gate; up]``), ``w13_scale`` one 128x4-swizzled
    e4m3 block per expert ([E, S] or flat), ``w13_scale_2`` fp32 [E] or [E, R13], input scales fp32 [E]
    or None (W4A16); ``w2`` uint8 [E, H, I/2] likewise. ``kernels``: (gemm1, gemm2, finalize) to launch
    instead of the module's (tests).
    """
    g1, g2, fin = kernels or (moe_gemm1_kernel, moe_gemm2_kernel, moe_finalize_kernel)
    dev = check_device(g1, x, topk_ids, topk_weights, w13, w2, op="nvgemm.nvfp4_moe[triton]")
    out_dtype = out_dtype or x.dtype
    m, h = x.shape
    top_k = topk_ids.shape[1]
    e, r13 = w13.shape[0], w13.shape[1]
    n_out1 = r13 // 2 if activation == "silu_mul" else r13
    i = w2.shape[2] * 2
    out = torch.empty((m, h), dtype=out_dtype, device=dev)
    if m == 0 or h == 0:
        return out
    interp = is_interpreted(g1)
    bm, bn, bk, nw, ns = config or moe_config(m, top_k, e, max(n_out1, h), max(h, i), interp)
    pairs, bexp, local = moe_align(topk_ids, e, bm, expert_map)
    p = m * top_k
    x = x.contiguous()
    tw = topk_weights.to(torch.float32).contiguous().reshape(-1)
    w13 = w13.contiguous()
    w2 = w2.contiguous()
    sf13 = _scales_2d(w13_scale, e, "w13_scale")
    sf2 = _scales_2d(w2_scale, e, "w2_scale")
    ws13 = w13_scale_2.to(dev, torch.float32).contiguous()
    ws2 = w2_scale_2.to(dev, torch.float32).reshape(e).contiguous()
    ins13 = None if w13_input_scale is None else w13_input_scale.to(dev, torch.float32).reshape(e).contiguous()
    ins2 = None if w2_input_scale is None else w2_input_scale.to(dev, torch.float32).reshape(e).contiguous()
    hbuf = torch.empty((pairs.numel(), n_out1), dtype=x.dtype, device=dev)
    ybuf = torch.empty((p, h), dtype=torch.float32, device=dev)
    nb = bexp.numel()
    opts = launch_options(False)
    g1[(nb, ceil_div(n_out1, bn))](
        x, tw, pairs, bexp, w13, sf13, ws13, ins13 if ins13 is not None else ws13, hbuf,
        p, top_k, r13, n_out1, h, x.stride(0), w13.stride(0), w13.stride(1), sf13.stride(0),
        ws13.stride(0) if ws13.dim() == 2 else 0, hbuf.stride(0),
        QUANT_A=ins13 is not None, ALPHA_ROW=ws13.dim() == 2, ROUTER_ON_INPUT=bool(router_weight_on_input),
        ACTIVATION=MOE_ACT_CODES[activation], X_KIND=dtype_kind(x.dtype), DOT_FP32=interp,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns, **opts,
    )
    g2[(nb, ceil_div(h, bn))](
        hbuf, tw, pairs, bexp, w2, sf2, ws2, ins2 if ins2 is not None else ws2, ybuf,
        p, h, i, hbuf.stride(0), w2.stride(0), w2.stride(1), sf2.stride(0), ybuf.stride(0),
        QUANT_A=ins2 is not None, APPLY_WEIGHT=not router_weight_on_input, DOT_FP32=interp,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns, **opts,
    )
    sh = None if shared_out is None else shared_out.contiguous()
    res = None if residual is None else residual.contiguous()
    fbm, fbn = (min(next_pow2(m), 64), min(next_pow2(h), 256)) if interp else (16, 128)
    fin[(ceil_div(m, fbm), ceil_div(h, fbn))](
        ybuf, local, sh if sh is not None else ybuf, res if res is not None else ybuf, out,
        m, h, ybuf.stride(0), sh.stride(0) if sh is not None else 0, res.stride(0) if res is not None else 0,
        out.stride(0),
        TOPK=top_k, HAS_SHARED=sh is not None, HAS_RESIDUAL=res is not None, OUT_KIND=dtype_kind(out_dtype),
        BLOCK_M=fbm, BLOCK_N=fbn, num_warps=4, **opts,
    )
    return out
