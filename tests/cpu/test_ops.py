"""nvgemm:: ops: opcheck, the emulated path against an independent fp64 reference, clear errors."""

from __future__ import annotations

import itertools

import pytest
import torch

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm.epilogues import EpilogueSpec, epilogue_ref
from _reference import ref_linear_fp64

from nvgemm.core.formats import blocked_numel, quantize_weight, to_blocked

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# Tolerances. The emulated op and the fp64 reference use identical quantized operands (exact in
# fp32), so they differ only by the fp32 GEMM's rounding (<= K * 2^-24 * sum|a*b|) and by the
# final cast (half an ulp of the output dtype). The bound below is rounding of the output dtype
# (2^-8 bf16 / 2^-11 fp16 relative) plus K*2^-24 relative to sum|a*b|, applied element-wise.
OUT_EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-22}


def make_layer(n, k, device, vector_alpha=False):
    w = torch.randn(n, k, device=device) * 0.1
    q = quantize_weight(w)
    ws2 = q.global_scale
    if vector_alpha:
        ws2 = ws2 * torch.linspace(0.5, 2.0, n, device=device)
    return q, ws2


CASES = list(itertools.product(["none", "silu", "gelu_tanh", "silu_mul"], [False, True], [False, True]))


@pytest.mark.parametrize("activation,has_bias,has_residual", CASES)
@pytest.mark.parametrize("w4a4", [True, False], ids=["w4a4", "w4a16"])
@pytest.mark.parametrize("device", DEVICES)
def test_emulated_matches_fp64_reference(device, w4a4, activation, has_bias, has_residual, seed):
    m, n, k = 5, 96, 64
    x = torch.randn(m, k, device=device).to(torch.bfloat16)
    q, ws2 = make_layer(n, k, device, vector_alpha=has_bias)  # exercise the vector alpha too
    ins = (x.float().abs().max() / 2688).reshape(()) if w4a4 else None
    bias = torch.randn(n, device=device).to(torch.bfloat16) if has_bias else None
    n_out = n // 2 if activation == "silu_mul" else n
    res = torch.randn(m, n_out, device=device).to(torch.bfloat16) if has_residual else None
    out = torch.ops.nvgemm.nvfp4_linear(x, q.packed, to_blocked(q.scale), ws2, ins, bias, res, activation, None)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n_out)
    want, mag = ref_linear_fp64(x, q, ws2, ins, bias, res, activation, torch.bfloat16)
    # element-wise bound: output rounding + fp32 GEMM rounding (amplified by the epilogue's
    # activation slope <= 1.1 and, for silu_mul, the up value; use the mag of both halves)
    if activation == "silu_mul":
        mag = mag[:, : n // 2] * (want.abs() + 1) + mag[:, n // 2 :] * 2
    tol = OUT_EPS[torch.bfloat16] * want.abs() + 2 * k * 2.0**-24 * 1.1 * mag + 1e-30
    err = (out.cpu().double() - want).abs()
    assert bool((err <= tol).all()), f"max err {err.max().item():.3g}, worst ratio {(err / tol).max().item():.3g}"


def test_epilogue_order_is_single_rounding():
    # acc * alpha + bias rounded once: a value exactly representable only before rounding
    acc = torch.tensor([[1.0 + 2.0**-9]])  # bf16 would round this to 1.0 if rounded early
    spec = EpilogueSpec(alpha="scalar", bias=True, out_dtype=torch.float32)
    out = epilogue_ref(acc, spec, alpha=2.0, bias=torch.tensor([-2.0]))
    assert out.item() == 2.0**-8  # (1+2^-9)*2 - 2 in fp32: no intermediate bf16 rounding


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_out_dtype_and_leading_dims(out_dtype, seed):
    x = torch.randn(2, 3, 32).to(torch.float16)
    q, ws2 = make_layer(48, 32, "cpu")
    out = torch.ops.nvgemm.nvfp4_linear(x, q.packed, to_blocked(q.scale), ws2, None, None, None, "none", out_dtype)
    assert out.shape == (2, 3, 48) and out.dtype == out_dtype
    want, _ = ref_linear_fp64(x, q, ws2, None, None, None, "none", out_dtype)
    torch.testing.assert_close(out.double(), want, rtol=OUT_EPS[out_dtype] + 1e-5, atol=1e-6)


def _args(m=3, n=64, k=32, w4a4=True):
    x = torch.randn(m, k).to(torch.bfloat16)
    q = quantize_weight(torch.randn(n, k))
    ins = torch.tensor(0.01) if w4a4 else None
    return x, q.packed, to_blocked(q.scale), q.global_scale, ins


def test_opcheck():
    x, w, s, ws2, ins = _args()
    bias = torch.randn(64).to(torch.bfloat16)
    res = torch.randn(3, 32).to(torch.bfloat16)
    for args in [
        (x, w, s.view(torch.uint8), ws2, ins, None, None, "none", None),
        (x, w, s.view(torch.uint8), ws2, None, bias, res, "silu_mul", torch.float16),
        (x, w, s.view(torch.uint8), ws2.expand(64).clone(), ins, bias, None, "gelu_tanh", None),
    ]:
        torch.library.opcheck(torch.ops.nvgemm.nvfp4_linear.default, args)
    # float8 scales: all checks but the schema-mutation one, whose CPU comparison lacks fp8 kernels
    torch.library.opcheck(torch.ops.nvgemm.nvfp4_linear.default, (x, w, s, ws2, ins, None, None, "none", None),
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    for swz in (True, False):
        torch.library.opcheck(torch.ops.nvgemm.quantize_nvfp4.default, (x, torch.tensor(0.02), swz))


def test_quantize_op_layouts(seed):
    x = torch.randn(130, 48).to(torch.bfloat16)
    gs = torch.tensor(0.003)
    p, s = torch.ops.nvgemm.quantize_nvfp4(x, gs, True)
    p2, s2 = torch.ops.nvgemm.quantize_nvfp4(x, gs, False)
    assert torch.equal(p, p2) and s.numel() == blocked_numel(130, 3)
    assert torch.equal(s.view(torch.uint8), to_blocked(s2).view(torch.uint8).reshape(-1))


@pytest.mark.parametrize(
    "mutate,exc,msg",
    [
        (lambda a: a.__setitem__(0, a[0].float()), TypeError, "x must be bfloat16 or float16"),
        (lambda a: a.__setitem__(0, a[0][:, :16]), ValueError, "x has K=16"),
        (lambda a: a.__setitem__(1, a[1].to(torch.int8)), TypeError, "weight must be packed uint8"),
        (lambda a: a.__setitem__(2, a[2].reshape(-1)[:100]), ValueError, "128x4-swizzled"),
        (lambda a: a.__setitem__(2, a[2].float()), TypeError, "weight_scale must be float8_e4m3fn"),
        (lambda a: a.__setitem__(3, a[3].double()), ValueError, "weight_scale_2 must be float32"),
        (lambda a: a.__setitem__(4, torch.ones(2)), ValueError, "input_scale must be a float32 scalar"),
        (lambda a: a.__setitem__(5, torch.ones(3)), ValueError, "bias must have shape"),
        (lambda a: a.__setitem__(6, torch.ones(3, 7)), ValueError, "residual must have shape"),
        (lambda a: a.__setitem__(7, "relu"), ValueError, "activation must be one of"),
    ],
)
def test_bad_linear_inputs(mutate, exc, msg):
    x, w, s, ws2, ins = _args()
    args = [x, w, s, ws2, ins, None, None, "none", None]
    mutate(args)
    with pytest.raises(exc, match=msg):
        torch.ops.nvgemm.nvfp4_linear(*args)


def test_bad_quantize_inputs():
    with pytest.raises(ValueError, match="multiple of 16"):
        torch.ops.nvgemm.quantize_nvfp4(torch.randn(2, 24), torch.tensor(1.0), True)
    with pytest.raises(ValueError, match="2-D"):
        torch.ops.nvgemm.quantize_nvfp4(torch.randn(2, 2, 32), torch.tensor(1.0), True)
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        torch.ops.nvgemm.quantize_nvfp4(torch.randn(2, 32).double(), torch.tensor(1.0), True)


def test_forced_backend_errors(monkeypatch):
    x, w, s, ws2, ins = _args()
    monkeypatch.setenv("NVGEMM_BACKEND", "no_such_backend")
    with pytest.raises(RuntimeError, match="not a registered backend"):
        torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, None, None, "none", None)
