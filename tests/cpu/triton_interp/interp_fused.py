"""Fused Triton quantizers (RMSNorm, add+RMSNorm, SiLU-mul) under the interpreter.

Each kernel returns (with ``return_y=True``) the value it quantized, ``y``. The checks:

1. ``y`` equals the unfused torch reference (``nvgemm.templates.triton.reference``) except where
   the fp32 math legitimately differs — the order of the sum of squares in RMSNorm and the
   ulp-level accuracy of rsqrt/exp — and then by at most one ulp of x's dtype, on at most 1% of
   the elements (a few-fp32-ulp difference changes a bf16/fp16 rounding with probability
   ~2**-14 per element).  TOLERANCES below.
2. packed codes and scale bytes (swizzle padding included) are *byte-identical* to
   ``quantize_activation(y)``; rows whose ``y`` equals the reference are byte-identical to the
   reference chain itself.
3. the new residual of add+RMSNorm is exactly ``dtype(x + residual)``.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from nvgemm.core.formats import quantize_activation, to_blocked
from nvgemm.templates.triton import reference as ref
from nvgemm.templates.triton.fused import (
    add_rmsnorm_quantize_nvfp4_triton,
    rmsnorm_quantize_nvfp4_triton,
    silu_mul_quantize_nvfp4_triton,
)

assert os.environ.get("TRITON_INTERPRET") == "1"

# One ulp relative to the value, per dtype (normal range), plus the mismatch-rate cap of check 1.
TOLERANCES = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
MAX_MISMATCH_FRACTION = 0.01


def check_y(y: torch.Tensor, y_ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Check 1; returns the mask of rows where y equals the reference exactly."""
    y_ref = y_ref.float()
    diff = (y - y_ref).abs()
    bound = TOLERANCES[dtype] * y_ref.abs() + 2.0**-24  # one dtype ulp (or less) + subnormal slack
    assert bool((diff <= bound).all()), f"max |y - y_ref| {diff.max()} exceeds one ulp of {dtype}"
    frac = float((diff > 0).float().mean())
    assert frac <= MAX_MISMATCH_FRACTION, f"{frac:.4f} of y differs from the reference"
    return (diff == 0).all(dim=1)


def check_bytes(p, s, y, swizzle, gs, ref_p, ref_s, same_rows):
    """Check 2."""
    qp, qs = quantize_activation(y, gs)
    qs = to_blocked(qs).reshape(-1) if swizzle else qs
    assert torch.equal(p, qp), "packed codes differ from quantize_activation(y)"
    assert torch.equal(s.view(torch.uint8), qs.view(torch.uint8)), "scale bytes differ from quantize_activation(y)"
    assert torch.equal(p[same_rows], ref_p[same_rows]), "codes differ from the unfused reference"
    if bool(same_rows.all()):
        assert torch.equal(s.view(torch.uint8), ref_s.view(torch.uint8))


RMS_CASES = [  # (m, k, dtype, weight dtype, config)
    (1, 64, torch.bfloat16, "x", None),
    (3, 48, torch.float16, "x", None),
    (130, 272, torch.bfloat16, "x", None),
    (4, 80, torch.bfloat16, "fp32", None),
    (5, 1024, torch.bfloat16, "x", (128, 256, 4)),  # two passes over K (4 chunks each)
    (3, 272, torch.float16, "x", (128, 128, 4)),  # two passes, ragged last chunk, padded K/16
]


def _rms_inputs(m, k, dtype, wdt):
    x = (torch.randn(m, k) * torch.exp2(torch.randint(-3, 4, (m, 1)).float())).to(dtype)
    x[0, :16] = 0  # an all-zero block (after the norm too)
    w = (torch.rand(k) * 1.5 + 0.25).to(dtype if wdt == "x" else torch.float32)
    return x, w


@pytest.mark.parametrize("swizzle", [True, False], ids=["swz", "linear"])
@pytest.mark.parametrize("m,k,dtype,wdt,config", RMS_CASES, ids=[f"m{c[0]}-k{c[1]}-{c[3]}-{c[4]}" for c in RMS_CASES])
def test_rmsnorm_quantize(m, k, dtype, wdt, config, swizzle, seed):
    x, w = _rms_inputs(m, k, dtype, wdt)
    gs = torch.tensor(0.004)
    eps = 1e-5
    p, s, y = rmsnorm_quantize_nvfp4_triton(x, w, gs, eps, swizzle, config=config, return_y=True)
    same = check_y(y, ref.rmsnorm_ref(x, w, eps), dtype)
    rp, rs = ref.rmsnorm_quantize_ref(x, w, gs, eps, swizzle)
    check_bytes(p, s, y, swizzle, gs, rp, rs, same)


ADD_CASES = [(1, 64, torch.bfloat16, None), (3, 48, torch.float16, None), (130, 272, torch.bfloat16, None),
             (5, 272, torch.bfloat16, (128, 128, 4))]


@pytest.mark.parametrize("m,k,dtype,config", ADD_CASES, ids=[f"m{c[0]}-k{c[1]}-{c[3]}" for c in ADD_CASES])
def test_add_rmsnorm_quantize(m, k, dtype, config, seed):
    x, w = _rms_inputs(m, k, dtype, "x")
    residual = (torch.randn(m, k) * 4).to(dtype)
    residual[0, :16] = -x[0, :16]  # x + residual = 0 exactly: a zero block after the add
    gs = torch.tensor(0.01)
    p, s, r, y = add_rmsnorm_quantize_nvfp4_triton(x, residual, w, gs, 1e-6, True, config=config, return_y=True)
    y_ref, r_ref = ref.add_rmsnorm_ref(x, residual, w, 1e-6)
    assert r.dtype == dtype and torch.equal(r, r_ref), "new residual must be exactly dtype(x + residual)"
    same = check_y(y, y_ref, dtype)
    rp, rs, _ = ref.add_rmsnorm_quantize_ref(x, residual, w, gs, 1e-6, True)
    check_bytes(p, s, y, True, gs, rp, rs, same)


SILU_CASES = [  # (m, k = 2I, dtype, config, swizzle)
    (1, 64, torch.bfloat16, None, True), (5, 96, torch.bfloat16, None, True), (5, 96, torch.bfloat16, None, False),
    (130, 64, torch.float16, None, True), (9, 160, torch.bfloat16, (4, 16, 4), False),
]


@pytest.mark.parametrize("m,k,dtype,config,swizzle", SILU_CASES,
                         ids=[f"m{c[0]}-k{c[1]}-{c[3]}-{'swz' if c[4] else 'linear'}" for c in SILU_CASES])
def test_silu_mul_quantize(m, k, dtype, config, swizzle, seed):
    x = (torch.randn(m, k) * 3).to(dtype)
    i = k // 2
    x[0, :8] = torch.tensor([-100.0, -30.0, -10.0, 0.0, -0.0, 10.0, 30.0, 80.0]).to(dtype)  # silu tails
    x[-1, i:i + 16] = 0  # up = 0 for a whole block -> scale 0
    gs = torch.tensor(0.002)
    p, s, y = silu_mul_quantize_nvfp4_triton(x, gs, swizzle, config=config, return_y=True)
    same = check_y(y, ref.silu_mul_ref(x), dtype)
    rp, rs = ref.silu_mul_quantize_ref(x, gs, swizzle)
    check_bytes(p, s, y, swizzle, gs, rp, rs, same)


@settings(max_examples=6, deadline=None, derandomize=True, database=None)
@given(m=st.integers(1, 20), kb=st.integers(1, 12), fp16=st.booleans(), log2_scale=st.integers(-8, 8),
       s=st.integers(0, 2**31 - 1))
def test_rmsnorm_hypothesis(m, kb, fp16, log2_scale, s):
    dtype = torch.float16 if fp16 else torch.bfloat16
    g = torch.Generator().manual_seed(s)
    x = (torch.randn(m, kb * 16, generator=g) * 2.0**log2_scale).to(dtype)
    w = (torch.rand(kb * 16, generator=g) + 0.5).to(dtype)
    gs = torch.tensor(0.003)
    p, s_, y = rmsnorm_quantize_nvfp4_triton(x, w, gs, 1e-6, True, return_y=True)
    same = check_y(y, ref.rmsnorm_ref(x, w, 1e-6), dtype)
    rp, rs = ref.rmsnorm_quantize_ref(x, w, gs, 1e-6, True)
    check_bytes(p, s_, y, True, gs, rp, rs, same)


def test_errors_name_the_problem():
    gs = torch.tensor(1.0)
    x = torch.randn(2, 48).bfloat16()
    with pytest.raises(ValueError, match="weight must have shape"):
        rmsnorm_quantize_nvfp4_triton(x, torch.ones(32).bfloat16(), gs)
    with pytest.raises(TypeError, match="weight must be"):
        rmsnorm_quantize_nvfp4_triton(x, torch.ones(48).half(), gs)
    with pytest.raises(ValueError, match="residual must match"):
        add_rmsnorm_quantize_nvfp4_triton(x, torch.ones(2, 48).half(), torch.ones(48).bfloat16(), gs)
    with pytest.raises(ValueError, match="multiple of 16"):
        silu_mul_quantize_nvfp4_triton(x, gs)  # I = 24
