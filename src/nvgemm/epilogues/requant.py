"""Fused SwiGLU + NVFP4 requant epilogue: the lane-level model of what the sm_100a swap-AB kernel's
epilogue warps do, written in torch so it runs on CPU and is checked byte for byte against
``quantize_nvfp4`` of the unfused output (``tests/cpu/test_fused_requant.py``).

Ownership (swap-AB tile, gate/up interleaved at load: GEMM row ``2j`` = gate_j, ``2j+1`` = up_j):
epilogue warp ``w`` of a 128-row tile holds GEMM rows ``32w .. 32w+31`` (lane = row), register
``i`` = one token. So for a fixed register, the 32 lanes of a warp hold gate/up of 16 consecutive
gated features of one token -- exactly one NVFP4 block of the down projection's input:

1. lane ``2j+1`` sends ``up`` to lane ``2j`` (``shfl.bfly 1``); even lanes form
   ``h = round_out_dtype(silu(g)*u)`` (the epilogue order of :mod:`nvgemm.core.epilogue`);
2. block amax over the 16 even lanes: ``shfl.bfly`` 2, 4, 8, 16 (odd lanes carry 0);
3. ``sf = e4m3(min(amax / (6*gs), 448))``, ``S = float(sf)*gs``, ``q = e2m1(h / S)`` (true division,
   0 for an all-zero block and for ``h == -0`` too: every zero is code 0, while the hardware cvt keeps a
   zero's sign, so the kernel selects +0 itself) -- the :func:`nvgemm.core.formats.quantize_activation` convention;
4. lane ``4i`` gets lane ``4i+2``'s code (``shfl.bfly 2``) and stores byte ``code_lo | code_hi<<4`` at
   ``packed[token, 8*block + i]``; lane 0 stores ``sf`` at ``blocked_offset(token, block)``.

Tokens >= M and blocks beyond I/16 are never written; the output buffers are zero-allocated, so the
swizzled layout's padding rows / columns stay zero (the layout contract in ``nvfp4_format.md``).
"""

from __future__ import annotations

import torch

from nvgemm.core.formats import E2M1_MAX, E4M3_MAX, blocked_numel, blocked_offset, e2m1_encode, fp8_e4m3_rne

WARP = 32
BLOCK = 16
# the butterfly offsets of step 2; a kernel mutation test swaps these (tests/cpu/test_fused_requant.py)
AMAX_BFLY = (2, 4, 8, 16)
PAIR_BFLY = 2


def _bfly(v: torch.Tensor, offset: int) -> torch.Tensor:
    """``shfl.sync.bfly`` over the last (lane) dimension of size 32."""
    lane = torch.arange(WARP, device=v.device)
    return v[..., lane ^ offset]


def requant_lanes(gate: torch.Tensor, up: torch.Tensor, input_scale: torch.Tensor, round_dtype: torch.dtype,
                  **mut):
    """Steps 1-4 for warps whose lane ``2j`` holds ``gate[..., j]`` and lane ``2j+1`` ``up[..., j]``
    (fp32 [..., 16], post alpha/bias); see :func:`requant_warp`."""
    lanes = torch.zeros(*gate.shape[:-1], WARP, dtype=torch.float32, device=gate.device)
    lanes[..., 0::2] = gate.float()
    lanes[..., 1::2] = up.float()
    return requant_warp(lanes, input_scale, round_dtype, **mut)


def requant_warp(lanes: torch.Tensor, input_scale: torch.Tensor, round_dtype: torch.dtype,
                 amax_bfly=AMAX_BFLY, pair_bfly: int = PAIR_BFLY):
    """Steps 1-4 on what the 32 lanes of warps hold for one register: ``lanes`` fp32 [..., 32]
    (even lane = gate, odd lane = up). Returns (bytes uint8 [..., 8]: the bytes stored by lanes
    0, 4, .., 28, sf float8_e4m3fn [...]: the scale stored by lane 0)."""
    up_l = _bfly(lanes, 1)
    even = (torch.arange(WARP, device=lanes.device) % 2) == 0
    h = (lanes * torch.sigmoid(lanes)) * up_l
    h = torch.where(even, h.to(round_dtype).float(), torch.zeros_like(h))
    amax = h.abs()
    for off in amax_bfly:
        amax = torch.maximum(amax, _bfly(amax, off))
    gs = input_scale.float().reshape(())
    sf = fp8_e4m3_rne((amax / (E2M1_MAX * gs)).clamp(max=E4M3_MAX))
    step = sf.float() * gs
    q = torch.where(step == 0, torch.zeros_like(h), h / torch.where(step == 0, torch.ones_like(step), step))
    code = e2m1_encode(q)
    hi = _bfly(code, pair_bfly)
    byte = (code & 0xF) | ((hi & 0xF) << 4)
    return byte[..., 0::4], sf[..., 0]


def fused_requant_reference(gated_in: torch.Tensor, input_scale: torch.Tensor, round_dtype: torch.dtype,
                            scale_index=blocked_offset, **mut):
    """The fused epilogue on the post-alpha/bias accumulator ``gated_in`` fp32 [M, 2I] in the
    checkpoint order ``[gate | up]``: returns (packed uint8 [M, I/2], 128x4-swizzled e4m3 scales of
    the [M, I/16] matrix, padding zero). ``scale_index`` / ``mut`` exist for mutation tests."""
    if gated_in.dim() != 2 or gated_in.shape[1] % (2 * BLOCK):
        raise ValueError(f"fused requant: expected [M, 2I] with I % 16 == 0, got {tuple(gated_in.shape)}")
    m, n2 = gated_in.shape
    i = n2 // 2
    kb = i // BLOCK
    gate = gated_in[:, :i].reshape(m, kb, BLOCK)
    up = gated_in[:, i:].reshape(m, kb, BLOCK)
    byte, sf = requant_lanes(gate, up, input_scale, round_dtype, **mut)
    packed = torch.zeros(m, i // 2, dtype=torch.uint8, device=gated_in.device)
    packed.copy_(byte.reshape(m, i // 2))
    scales = torch.zeros(blocked_numel(m, kb), dtype=torch.uint8, device=gated_in.device)
    r = torch.arange(m, device=gated_in.device).unsqueeze(1).expand(m, kb)
    c = torch.arange(kb, device=gated_in.device).unsqueeze(0).expand(m, kb)
    scales[scale_index(r, c, kb).reshape(-1)] = sf.view(torch.uint8).reshape(-1)
    return packed, scales.view(torch.float8_e4m3fn)
