"""Fused SwiGLU + NVFP4 requant (issue 25 item 2), CPU: the lane-level model of the sm_100a epilogue
(:mod:`nvgemm.epilogues.requant`) and the ``nvgemm::nvfp4_linear_requant`` / ``_prequant`` ops against
the unfused chain ``quantize_nvfp4(nvfp4_linear(..., "silu_mul"))``, byte for byte (no tolerance: the
contract is bit-exactness), including M tails and the zero padding of the swizzled scale layout."""

from __future__ import annotations

import pytest
import torch
from torch.library import opcheck

import nvgemm
from nvgemm.epilogues import requant as rq
from nvgemm.core.formats import blocked_numel, blocked_offset, from_blocked, quantize_weight

torch.manual_seed(0)


def _layer(n, k, vector_alpha=False):
    q = quantize_weight(torch.randn(n, k) * 0.1)
    ws2 = q.global_scale * (torch.linspace(0.5, 2.0, n) if vector_alpha else 1.0)
    return q, ws2


def _gate_up(m, i, k, dtype, bias, vector_alpha, zero_rows=()):
    q, ws2 = _layer(2 * i, k, vector_alpha)
    from nvgemm.core.formats import to_blocked

    x = (torch.randn(m, k) * 2).to(dtype)
    for r in zero_rows:
        x[r] = 0
    b = (torch.randn(2 * i) * 0.5).to(dtype) if bias else None
    return x, q.packed, to_blocked(q.scale), ws2.float(), torch.tensor(0.7 / 448), b


def _unfused(x, w, ws, ws2, ins, b, out_scale, dtype):
    h = torch.ops.nvgemm.nvfp4_linear(x, w, ws, ws2, ins, b, None, "silu_mul", dtype)
    return torch.ops.nvgemm.quantize_nvfp4(h, out_scale, True)


def _padding_mask(m, kb):
    """True at the swizzled bytes no real (row, block) maps to."""
    used = torch.zeros(blocked_numel(m, kb), dtype=torch.bool)
    r = torch.arange(m).unsqueeze(1).expand(m, kb)
    c = torch.arange(kb).unsqueeze(0).expand(m, kb)
    used[blocked_offset(r, c, kb).reshape(-1)] = True
    return ~used


# M: 1 (decode), 5 (tail inside a 32-row group), 130 (a second 128-row scale atom, mostly padding);
# I/16 = 1, 3, 5 (K blocks padded to 4 in the swizzled layout)
@pytest.mark.parametrize("m", [1, 5, 130])
@pytest.mark.parametrize("i", [16, 48, 80])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_requant_equals_unfused_bytes(m, i, dtype):
    bias, vec = (m % 2 == 1), (i == 48)
    x, w, ws, ws2, ins, b, = _gate_up(m, i, 64, dtype, bias, vec, zero_rows=(0,) if m > 1 else ())[:6]
    # out scale: small enough that some blocks saturate the e4m3 scale at 448
    out_scale = torch.tensor(0.02 / 2688 if i == 80 else 3.0 / 2688)
    packed, scales = torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, ws2, ins, b, out_scale, dtype)
    ref_p, ref_s = _unfused(x, w, ws, ws2, ins, b, out_scale, dtype)
    assert packed.dtype == torch.uint8 and packed.shape == (m, i // 2)
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == ref_s.shape
    assert torch.equal(packed, ref_p)
    assert torch.equal(scales.view(torch.uint8), ref_s.view(torch.uint8))
    pad = _padding_mask(m, i // 16)
    assert pad.any() and not scales.view(torch.uint8)[pad].any()
    if i == 80:
        assert (from_blocked(scales, m, i // 16).float() == 448).any()  # saturation exercised
    if m > 1 and not bias:
        assert not packed[0].any() and not from_blocked(scales, m, i // 16)[0].float().any()  # zero block


def _lane_case():
    torch.manual_seed(1)
    m, i = 37, 64
    pre = torch.randn(m, 2 * i) * torch.logspace(-2, 1, 2 * i)
    return pre, torch.tensor(1.5 / 2688)


def test_lane_model_equals_quantize_of_rounded_swiglu():
    pre, gs = _lane_case()
    packed, scales = rq.fused_requant_reference(pre, gs, torch.bfloat16)
    h = (torch.nn.functional.silu(pre[:, :64]) * pre[:, 64:]).to(torch.bfloat16)
    ref_p, ref_s = torch.ops.nvgemm.quantize_nvfp4(h, gs, True)
    assert torch.equal(packed, ref_p) and torch.equal(scales.view(torch.uint8), ref_s.view(torch.uint8))


def _wrong_swizzle(r, kb, k_blocks):  # (r // 32) % 4 and r % 32 swapped in the 512-byte atom
    return blocked_offset(r, kb, k_blocks) - (r % 32) * 16 - ((r // 32) % 4) * 4 + (r % 32) * 4 + ((r // 32) % 4) * 16


@pytest.mark.parametrize("mutation", [
    {"amax_bfly": (1, 2, 4, 8)},   # amax over the wrong lane group (odd lanes, misses lane ^ 16)
    {"amax_bfly": (2, 4, 8)},      # half a block
    {"pair_bfly": 4},              # packs the wrong neighbour into the high nibble
    {"scale_index": _wrong_swizzle},
])
def test_mutations_fail(mutation):
    """The byte comparison above catches each plausible kernel bug."""
    pre, gs = _lane_case()
    good = rq.fused_requant_reference(pre, gs, torch.bfloat16)
    bad = rq.fused_requant_reference(pre, gs, torch.bfloat16, **mutation)
    assert not (torch.equal(good[0], bad[0]) and torch.equal(good[1].view(torch.uint8), bad[1].view(torch.uint8)))


def test_gated_mlp_fused_equals_unfused_chain():
    torch.manual_seed(2)
    k, i, h = 64, 48, 32
    gu = nvgemm.NVFP4Linear.fuse([nvgemm.NVFP4Linear.from_linear(torch.nn.Linear(k, i), input_scale=2.0 / 2688)
                                  for _ in range(2)])
    gu.activation = "silu_mul"
    down = nvgemm.NVFP4Linear.from_linear(torch.nn.Linear(i, h), input_scale=0.5 / 2688)
    x = torch.randn(7, k).to(torch.bfloat16)
    res = torch.randn(7, h).to(torch.bfloat16)
    fused = nvgemm.ops.fused.gated_mlp(gu, down, x, residual=res)
    assert torch.equal(fused, down(gu(x), residual=res))
    # W4A16 down: not fusable, the plain chain
    down16 = nvgemm.NVFP4Linear.from_linear(torch.nn.Linear(i, h))
    assert torch.equal(nvgemm.ops.fused.gated_mlp(gu, down16, x), down16(gu(x)))


def test_opcheck_and_errors():
    x, w, ws, ws2, ins, b = _gate_up(3, 16, 32, torch.bfloat16, True, False)
    gs = torch.tensor(1.0 / 2688)
    # fp8 output: all checks but the schema one, whose CPU comparison lacks fp8 kernels (as in test_ops)
    opcheck(torch.ops.nvgemm.nvfp4_linear_requant.default, (x, w, ws.view(torch.uint8), ws2, ins, b, gs, torch.bfloat16),
            test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    p, s = torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, ws2, ins, None, gs)
    q, _ = _layer(8, 16)
    from nvgemm.core.formats import to_blocked

    opcheck(torch.ops.nvgemm.nvfp4_linear_prequant.default,
            (p, s.view(torch.uint8), q.packed, to_blocked(q.scale).view(torch.uint8), q.global_scale, gs, None, None,
             torch.bfloat16))
    with pytest.raises(ValueError, match="input_scale is required"):
        torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, ws2, None, None, gs)
    with pytest.raises(ValueError, match="out_input_scale"):
        torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, ws2, ins, None, torch.ones(2))
    x2, w2, ws_2, ws2_2, ins2, _ = _gate_up(3, 8, 32, torch.bfloat16, False, False)
    with pytest.raises(ValueError, match="multiple of 16"):
        torch.ops.nvgemm.nvfp4_linear_requant(x2, w2, ws_2, ws2_2, ins2, None, gs)
    with pytest.raises(ValueError, match="does not match weight"):
        torch.ops.nvgemm.nvfp4_linear_prequant(p, s, torch.zeros(8, 16, dtype=torch.uint8), to_blocked(q.scale),
                                               q.global_scale, gs, None, None, torch.bfloat16)


def test_sm100_requant_launch_arguments():
    """The launcher's buffers for the out_quant kernel (no cutlass needed): codes and swizzled scale bytes of
    the right sizes, uninitialised (the kernel writes every byte, the layout's zero padding included:
    tests/emulator/test_isa_sm100_requant.py launches onto garbage-filled buffers), alpha followed by the next
    layer's input_scale; clear errors otherwise."""
    from nvgemm.epilogues import EpilogueSpec
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C
    from nvgemm.templates.sm100_w4a4.launch import prepare_sm100_requant_args

    x, w, ws, ws2, ins, b = _gate_up(5, 48, 64, torch.bfloat16, True, True)
    gs = torch.tensor(0.125)
    epi = EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", out_quant=True)
    args = prepare_sm100_requant_args(x, w, ws, ws2, ins, b, gs, epi, C(tile_n=16, swap_ab=True))
    assert args.out.shape == (5, 24) and args.out.dtype == torch.uint8
    assert args.residual.shape == (blocked_numel(5, 3),) and args.residual.dtype == torch.uint8
    assert args.alpha.shape == (97,) and float(args.alpha[-1]) == 0.125
    assert torch.equal(args.alpha[:96], (ins * ws2)[torch.arange(96).reshape(2, 48).t().reshape(-1)])  # interleaved
    with pytest.raises(ValueError, match="1-CTA swap-AB"):
        prepare_sm100_requant_args(x, w, ws, ws2, ins, b, gs, epi, C(tile_n=64))
    with pytest.raises(ValueError, match="out_input_scale"):
        prepare_sm100_requant_args(x, w, ws, ws2, ins, b, torch.ones(2), epi, C(tile_n=16, swap_ab=True))
