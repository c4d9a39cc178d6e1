"""Triton W4A16 fallback GEMM (and its W4A4 quantize-dequantize mode) vs the emulated op.

Reference: ``nvgemm.ops.linear.nvfp4_linear_emulated`` (dequantize + fp32 matmul + ``epilogue_ref``).
Both sides multiply identical, exactly representable operands (x or its NVFP4 quantize-dequantize,
and E2M1*sf weights; every product is exact in fp32), so the accumulators differ only by fp32
summation order: |acc - acc_ref| <= 2 * K * 2**-24 * sum_k |a_k w_k| (the standard gamma_K bound
for each side). ``error_bound`` pushes that through alpha, the activation (|silu'|, |gelu_tanh'| <=
1.13; silu_mul's product rule), adds a few fp32 ulps for exp/tanh implementations and one ulp of the
output dtype for the final rounding (values within the accumulation error of a rounding boundary
may round either way).
"""

from __future__ import annotations

import os

import pytest
import torch

from nvgemm.core.formats import dequantize, from_blocked, quantize_activation, quantize_weight, to_blocked
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.templates.triton.gemm_w4a16 import nvfp4_linear_triton
from nvfp4_cases import error_bound

assert os.environ.get("TRITON_INTERPRET") == "1"

CASES = [  # m, n, k, activation, x dtype, out dtype, w4a4, vector alpha, bias, residual, config
    (1, 48, 64, "none", torch.bfloat16, torch.bfloat16, False, False, False, False, None),
    (3, 80, 48, "silu", torch.float16, torch.float16, True, False, True, False, None),
    (17, 64, 272, "silu_mul", torch.bfloat16, torch.bfloat16, True, True, True, True, None),
    (5, 40, 128, "gelu_tanh", torch.bfloat16, torch.float32, False, True, True, True, None),
    (33, 96, 160, "none", torch.float16, torch.bfloat16, True, True, False, True, None),
    (2, 96, 80, "silu_mul", torch.float16, torch.float32, False, False, False, False, None),
    (20, 72, 176, "silu_mul", torch.bfloat16, torch.bfloat16, True, True, True, True, (16, 32, 64, 4, 1)),
    (18, 40, 96, "gelu_tanh", torch.float16, torch.float16, False, False, True, False, (16, 16, 32, 4, 1)),
]


def _id(c):
    return f"m{c[0]}-n{c[1]}-k{c[2]}-{c[3]}-{'w4a4' if c[6] else 'w4a16'}{'-vec' if c[7] else ''}" \
           f"{'-bias' if c[8] else ''}{'-res' if c[9] else ''}{'-tiled' if c[10] else ''}"


@pytest.mark.parametrize("m,n,k,activation,xdt,odt,w4a4,vec,has_bias,has_res,config", CASES, ids=[_id(c) for c in CASES])
def test_gemm_matches_emulated(m, n, k, activation, xdt, odt, w4a4, vec, has_bias, has_res, config, seed):
    q = quantize_weight(torch.randn(n, k) * 0.05)
    q.packed[0, :8] = 0  # an all-zero weight segment
    ws = to_blocked(q.scale)
    ws2 = q.global_scale * (torch.linspace(0.5, 2.0, n) if vec else torch.tensor(1.0))
    x = (torch.randn(m, k) * 2).to(xdt)
    x[0, :16] = 0  # an all-zero activation block (scale 0 in W4A4)
    input_scale = torch.tensor(float(x.float().abs().max()) / 2688) if w4a4 else None
    n_out = n // 2 if activation == "silu_mul" else n
    bias = (torch.randn(n) * 0.5).to(xdt) if has_bias else None
    residual = torch.randn(m, n_out).to(xdt) if has_res else None
    out = nvfp4_linear_triton(x, q.packed, ws.view(torch.uint8), ws2, input_scale, bias, residual, activation, odt,
                              config=config)
    assert out.dtype == odt and out.shape == (m, n_out)
    ref32 = nvfp4_linear_emulated(x, q.packed, ws, ws2, input_scale, bias, residual, activation, torch.float32)
    bound = error_bound(x, q, ws2, input_scale, bias, activation, odt, ref32)
    err = (out.double() - ref32.double()).abs()
    worst = int((err - bound).argmax())
    assert bool((err <= bound).all()), (
        f"|out - ref| = {err.flatten()[worst]:.3e} > bound {bound.flatten()[worst]:.3e} at {worst} "
        f"(ref {ref32.flatten()[worst]:.4e})"
    )
    if odt != torch.float32:  # one rounding, the reference's: most outputs equal the rounded reference
        same = (out == ref32.to(odt)).float().mean()
        assert same >= 0.9, f"only {same:.3f} of outputs equal the rounded reference"


def test_batched_input_and_float8_scales(seed):
    q = quantize_weight(torch.randn(32, 64))
    ws = to_blocked(q.scale)  # float8_e4m3fn view
    x = torch.randn(2, 3, 64).bfloat16()
    out = nvfp4_linear_triton(x, q.packed, ws, q.global_scale)
    ref = nvfp4_linear_emulated(x, q.packed, ws, q.global_scale, None, None, None, "none", None)
    assert out.shape == (2, 3, 32)
    ref32 = nvfp4_linear_emulated(x, q.packed, ws, q.global_scale, None, None, None, "none", torch.float32)
    bound = error_bound(x, q, q.global_scale, None, None, "none", torch.bfloat16, ref32)
    assert bool(((out.double() - ref32.double()).abs() <= bound).all())
    assert (out == ref).float().mean() >= 0.9


def test_w4a4_is_w4a16_on_the_dequantized_activation(seed):
    """The W4A4 mode equals the weight-only kernel run on quantize-dequantize(x) with alpha folded."""
    q = quantize_weight(torch.randn(48, 96))
    ws = to_blocked(q.scale)
    x = torch.randn(4, 96).bfloat16()
    gs = torch.tensor(float(x.float().abs().max()) / 2688)
    qx, sx = quantize_activation(x, gs)
    x_dq = dequantize(qx, sx, dtype=torch.bfloat16)
    assert torch.equal(x_dq.float(), dequantize(qx, sx)), "E2M1 * e4m3 must be exact in bf16"
    a = nvfp4_linear_triton(x, q.packed, ws, q.global_scale, gs, out_dtype=torch.float32)
    b = nvfp4_linear_triton(x_dq, q.packed, ws, gs * q.global_scale, None, out_dtype=torch.float32)
    assert torch.equal(a, b)
    assert torch.equal(from_blocked(ws, 48, 6), q.scale)


def test_errors_name_the_problem():
    q = quantize_weight(torch.randn(32, 64))
    ws = to_blocked(q.scale)
    with pytest.raises(ValueError, match="K=48"):
        nvfp4_linear_triton(torch.randn(2, 48).bfloat16(), q.packed, ws, q.global_scale)
    with pytest.raises(ValueError, match="weight_scale must be the 128x4-swizzled"):
        nvfp4_linear_triton(torch.randn(2, 64).bfloat16(), q.packed, q.scale.reshape(-1), q.global_scale)
