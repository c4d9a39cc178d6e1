"""GEMM1's B operand of the sm100 grouped MoE path as ONE Triton launch (CUDA; runs under
``TRITON_INTERPRET=1``): the per-slot NVFP4 activations of :func:`~.launch.slot_activations`,
bit for bit.

Program ``(j, kt)`` reads work slot ``j = (e, p0, cnt)``, gathers the source token of each of its
``tile_n`` rows (``rows[p0 + t]``; rows ``t >= cnt`` load as zeros), quantizes the ``BLOCK_K``
columns ``kt`` with the expert's input scale (``nvgemm.templates.triton._common``: the quantizer of
``nvgemm.core.formats``, true divisions, RNE e4m3 / E2M1; compiled without fp contraction), and stores the packed codes at rows
``j * tile_n + t`` and the e4m3 scales into slot ``j``'s 128-row swizzled atom (rows ``t < tile_n``;
the caller zero-allocates the atoms, so rows ``tile_n..127`` stay 0); with ``kt == 0`` it also
records where each of its pairs lands (permuted pair -> slot row, for the finalize)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvgemm.templates.triton._common import nvfp4_quantize_tile

_BLOCK_K = 128


@triton.jit
def _slot_quant_kernel(x_ptr, rows_ptr, tiles_ptr, ins_ptr, q_ptr, sf_ptr, rop_ptr, K, stride_xm, P,
                       TN: tl.constexpr, BLOCK_K: tl.constexpr):
    j = tl.program_id(0)
    kt = tl.program_id(1)
    e = tl.load(tiles_ptr + j * 4)
    p0 = tl.load(tiles_ptr + j * 4 + 1)
    cnt = tl.load(tiles_ptr + j * 4 + 2)
    gs = tl.load(ins_ptr + e)
    t = tl.arange(0, TN)
    ok = t < cnt
    tok = tl.load(rows_ptr + tl.minimum(p0 + t, P - 1), mask=ok, other=0)
    cols = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + tok.to(tl.int64)[:, None] * stride_xm + cols[None, :],
                mask=ok[:, None] & (cols[None, :] < K), other=0.0).to(tl.float32)
    packed, sf = nvfp4_quantize_tile(x, gs, TN, BLOCK_K)
    r = j * TN + t
    if kt == 0:  # permuted pair p0 + t -> its row of the slot-major GEMM outputs
        tl.store(rop_ptr + p0 + t, r.to(tl.int64), mask=ok)
    pcols = kt * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    tl.store(q_ptr + r.to(tl.int64)[:, None] * (K // 2) + pcols[None, :], packed, mask=pcols[None, :] < K // 2)
    kb = (kt * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16))[None, :]
    kb_tiles = (K // 16 + 3) // 4
    tt = t[:, None]
    off = (j * kb_tiles + kb // 4).to(tl.int64) * 512 + (tt % 32) * 16 + ((tt // 32) % 4) * 4 + kb % 4
    tl.store(sf_ptr + off, sf.to(tl.uint8), mask=kb < kb_tiles * 4)


def slot_activations_triton(x: torch.Tensor, wl, input_scale: torch.Tensor, tile_n: int, *, kernel=None):
    """:func:`~.launch.slot_activations` in one launch (plus the atoms' zero fill); also returns the
    int64 [P] map permuted pair -> slot row (:func:`~.launch.slot_rows_of_pairs` is ``map[pos]``).
    ``kernel``: the jitted kernel to launch instead of ``_slot_quant_kernel`` (the PTX emulator's stand-in)."""
    kernel = kernel or _slot_quant_kernel
    k = x.shape[1]
    slots = wl.slots
    codes = torch.empty((slots * tile_n, k // 2), dtype=torch.uint8, device=x.device)
    kb_tiles = (k // 16 + 3) // 4
    atoms = torch.zeros(slots * 512 * kb_tiles, dtype=torch.uint8, device=x.device)
    xs = x if x.stride(1) == 1 else x.contiguous()
    ins = input_scale if input_scale.dtype == torch.float32 and input_scale.is_contiguous() else \
        input_scale.float().contiguous()
    rop = torch.empty(max(wl.rows.numel(), 1), dtype=torch.int64, device=x.device)
    kernel[(slots, triton.cdiv(k, _BLOCK_K))](xs, wl.rows, wl.tiles, ins, codes, atoms, rop, k,
                                              xs.stride(0), max(wl.rows.numel(), 1), TN=tile_n,
                                              BLOCK_K=_BLOCK_K, enable_fp_fusion=False)
    return codes, atoms.view(torch.float8_e4m3fn), rop
