"""Bad values and ambiguous layouts at the public entry points: a clear error, never a silent wrong result."""

from __future__ import annotations

import pytest
import torch
from _reference import ref_linear_fp64

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm import NVFP4Linear
from nvgemm.core.formats import blocked_shape, from_blocked, quantize_weight, to_blocked

# [128, 128]: N % 128 == 0 and K % 64 == 0, so the linear [N, K/16] scales flattened to 1-D have
# exactly the swizzled size (every Llama/Qwen layer has this property).
N, K = 128, 128


@pytest.fixture
def layer(seed):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(N, K, generator=g))
    x = torch.randn(3, K, generator=g).bfloat16()
    return q, x


# ----------------------------------------------------------------------- item 1: swizzled layout


def test_swizzled_scales_have_a_tiled_shape(layer):
    q, x = layer
    sw = to_blocked(q.scale)
    assert tuple(sw.shape) == blocked_shape(N, K // 16) == (1, 2, 32, 4, 4)
    assert torch.equal(from_blocked(sw, N, K // 16).view(torch.uint8), q.scale.view(torch.uint8))


def test_op_refuses_flattened_linear_scales(layer):
    q, x = layer
    flat = q.scale.reshape(-1)  # a flattened linear matrix: as many bytes as the swizzled layout
    with pytest.raises(ValueError, match="ambiguous"):
        torch.ops.nvgemm.nvfp4_linear(x, q.packed, flat, q.global_scale, None, None, None, "none", None)
    with pytest.raises(ValueError, match="linear \\[N, K/16\\] scales"):
        torch.ops.nvgemm.nvfp4_linear(x, q.packed, q.scale, q.global_scale, None, None, None, "none", None)
    # the tiled shape is the one accepted, and it gives the reference's values (the bytes equal the
    # 1-D layout the op took before, so this is the same data, unmistakably labelled)
    out = torch.ops.nvgemm.nvfp4_linear(x, q.packed, to_blocked(q.scale), q.global_scale, None, None, None,
                                        "none", None)
    want, mag = ref_linear_fp64(x, q, q.global_scale, None, None, None, "none", torch.bfloat16)
    tol = 2.0**-8 * want.abs() + 2 * K * 2.0**-24 * mag + 1e-30
    assert bool(((out.double() - want).abs() <= tol).all())


def test_from_tensors_refuses_flattened_linear_scales(layer):
    q, _ = layer
    with pytest.raises(ValueError, match="1-D scales are ambiguous"):
        NVFP4Linear.from_tensors(q.packed, q.scale.reshape(-1), q.global_scale)
    a = NVFP4Linear.from_tensors(q.packed, q.scale, q.global_scale)  # linear 2-D: swizzled here
    b = NVFP4Linear.from_tensors(q.packed, to_blocked(q.scale), q.global_scale)  # already tiled
    assert torch.equal(a.weight_scale.view(torch.uint8), b.weight_scale.view(torch.uint8))


# ----------------------------------------------------------------------- item 3: op value checks


def _call(x, q, ws2=None, ins=None, bias=None, residual=None):
    ws2 = q.global_scale if ws2 is None else ws2
    return torch.ops.nvgemm.nvfp4_linear(x, q.packed, to_blocked(q.scale), ws2, ins, bias, residual, "none", None)


BAD_SCALARS = [float("nan"), float("inf"), -1.0]


@pytest.mark.parametrize("v", BAD_SCALARS, ids=["nan", "inf", "negative"])
def test_bad_weight_scale_2_refused(layer, v):
    q, x = layer
    with pytest.raises(ValueError, match="weight_scale_2 holds"):
        _call(x, q, ws2=torch.tensor(v))
    vec = q.global_scale.expand(N).clone()
    vec[7] = v
    with pytest.raises(ValueError, match="weight_scale_2 holds"):
        _call(x, q, ws2=vec)
    with pytest.raises(ValueError, match="weight_scale_2 holds"):
        NVFP4Linear.from_tensors(q.packed, q.scale, torch.tensor(v))


@pytest.mark.parametrize("v", BAD_SCALARS + [0.0], ids=["nan", "inf", "negative", "zero"])
def test_bad_input_scale_refused(layer, v):
    q, x = layer
    with pytest.raises(ValueError, match="input_scale is"):
        _call(x, q, ins=torch.tensor(v))
    with pytest.raises(ValueError, match="input_scale is"):
        NVFP4Linear.from_tensors(q.packed, q.scale, q.global_scale, torch.tensor(v))


def test_zero_weight_scale_2_only_for_an_all_zero_weight(layer):
    q, x = layer
    with pytest.raises(ValueError, match="weight_scale_2 is 0 for rows whose codes are not all zero"):
        NVFP4Linear.from_tensors(q.packed, q.scale, torch.tensor(0.0))
    z = quantize_weight(torch.zeros(N, K))  # nvgemm's documented all-zero weight: global scale 0
    assert float(z.global_scale) == 0.0
    out = NVFP4Linear.from_tensors(z.packed, z.scale, z.global_scale)(x)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_bias_and_residual_refused(layer, dtype):
    q, x = layer
    with pytest.raises(TypeError, match="bias must be bfloat16, float16 or float32"):
        _call(x, q, bias=torch.ones(N, dtype=dtype))
    with pytest.raises(TypeError, match="residual must be bfloat16, float16 or float32"):
        _call(x, q, residual=torch.ones(3, N, dtype=dtype))


def test_non_finite_activations_documented_behaviour(layer):
    """Not checked per call (docs/numerics.md): W4A4 saturates +-Inf like cvt.satfinite, NaN propagates."""
    q, x = layer
    x = x.clone()
    x[0, 0], x[1, 0] = float("inf"), float("nan")
    ins = torch.tensor(0.01)
    w4a4 = _call(x, q, ins=ins).float()
    assert bool(torch.isfinite(w4a4[0]).all()) and bool(torch.isnan(w4a4[1]).all())
    w4a16 = _call(x, q).float()
    assert not bool(torch.isfinite(w4a16[0]).all()) and bool(torch.isnan(w4a16[1]).all())


# ----------------------------------------------------------------------- 1-D scales: both hints work


def _hinted_calls(msg: str) -> dict[str, str]:
    """The two calls the ambiguity message offers, as Python expressions on ``weight_scale``."""
    import re

    swz = re.search(r"swizzled -> (weight_scale\.view\([\d, ]+\))", msg)
    lin = re.search(r"linear \[\d+, \d+\] matrix -> (nvgemm\.core\.formats\.to_blocked\(weight_scale\.view\(\d+, "
                    r"\d+\)\))", msg)
    assert swz and lin, msg
    return {"swizzled": swz.group(1), "linear": lin.group(1)}


@pytest.mark.parametrize("n,k", [(128, 128), (256, 192)], ids=["n128-k128", "n256-k192"])
def test_one_d_scale_message_names_both_layouts_and_each_call_is_right(seed, n, k):
    """A 1-D scale tensor is refused as ambiguous; the message gives the call for swizzled bytes and
    the call for a flattened linear [N, K/16] matrix, with this layer's N and K/16, and following the
    matching hint gives the reference result for either layout."""
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    x = torch.randn(3, k, generator=g).bfloat16()
    want, mag = ref_linear_fp64(x, q, q.global_scale, None, None, None, "none", torch.bfloat16)
    tol = 2.0**-8 * want.abs() + 2 * k * 2.0**-24 * mag + 1e-30
    held = {"swizzled": to_blocked(q.scale).reshape(-1), "linear": q.scale.reshape(-1)}
    assert held["swizzled"].numel() == held["linear"].numel()  # why the layout cannot be told
    for layout, flat in held.items():
        with pytest.raises(ValueError, match="1-D scales are ambiguous") as e:
            torch.ops.nvgemm.nvfp4_linear(x, q.packed, flat, q.global_scale, None, None, None, "none", None)
        msg = str(e.value)
        assert f"[N, K/16] = [{n}, {k // 16}]" in msg
        assert f"weight_scale.view{blocked_shape(n, k // 16)}" in msg
        assert f"nvgemm.core.formats.to_blocked(weight_scale.view({n}, {k // 16}))" in msg
        call = _hinted_calls(msg)[layout]
        scale = eval(call, {"nvgemm": nvgemm, "weight_scale": flat})
        out = torch.ops.nvgemm.nvfp4_linear(x, q.packed, scale, q.global_scale, None, None, None, "none", None)
        assert bool(((out.double() - want).abs() <= tol).all()), (layout, call)
    # the trap the message warns about: linear bytes viewed as swizzled are accepted and wrong
    wrong = torch.ops.nvgemm.nvfp4_linear(x, q.packed, held["linear"].view(blocked_shape(n, k // 16)),
                                          q.global_scale, None, None, None, "none", None)
    assert not bool(((wrong.double() - want).abs() <= tol).all())


def test_flattened_linear_scales_of_unpadded_size_get_the_linear_call(seed):
    """N % 128 != 0: a flattened linear matrix is smaller than the swizzled layout, so it is not
    ambiguous; the message names the one call that turns it into the accepted shape."""
    n, k = 100, 64
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    x = torch.randn(2, k, generator=g).bfloat16()
    with pytest.raises(ValueError, match=r"flattened linear \[N, K/16\] = \[100, 4\] matrix") as e:
        torch.ops.nvgemm.nvfp4_linear(x, q.packed, q.scale.reshape(-1), q.global_scale, None, None, None, "none",
                                      None)
    assert "nvgemm.core.formats.to_blocked(weight_scale.view(100, 4))" in str(e.value)
    out = torch.ops.nvgemm.nvfp4_linear(x, q.packed, to_blocked(q.scale.reshape(-1).view(100, 4)), q.global_scale,
                                        None, None, None, "none", None)
    want, mag = ref_linear_fp64(x, q, q.global_scale, None, None, None, "none", torch.bfloat16)
    assert bool(((out.double() - want).abs() <= 2.0**-8 * want.abs() + 2 * k * 2.0**-24 * mag + 1e-30).all())


# ----------------------------------------------------------------------- quantizer input_scale values

QUANTIZERS = {
    "quantize_nvfp4": lambda x, s: torch.ops.nvgemm.quantize_nvfp4(x, s),
    "rmsnorm_quantize_nvfp4": lambda x, s: torch.ops.nvgemm.rmsnorm_quantize_nvfp4(x, torch.ones(x.shape[1]), s),
    "add_rmsnorm_quantize_nvfp4": lambda x, s: torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4(
        x, torch.zeros_like(x), torch.ones(x.shape[1]), s),
    "silu_mul_quantize_nvfp4": lambda x, s: torch.ops.nvgemm.silu_mul_quantize_nvfp4(x, s),
}


@pytest.mark.parametrize("op", list(QUANTIZERS))
@pytest.mark.parametrize("v", BAD_SCALARS + [0.0, -0.0], ids=["nan", "inf", "negative", "zero", "minus-zero"])
def test_quantizers_refuse_a_bad_input_scale(seed, op, v):
    """quantize_nvfp4 and the fused quantizers refuse a NaN / Inf / zero / negative input_scale,
    naming the op and the value, instead of returning garbage codes and scales."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(seed)).bfloat16()
    with pytest.raises(ValueError, match=f"nvgemm.{op}: input_scale is {v}; it must be finite and > 0"):
        QUANTIZERS[op](x, torch.tensor(v))
    packed, scale = QUANTIZERS[op](x, torch.tensor(0.01))[:2]  # a good scale still quantizes
    assert packed.shape == (4, (64 if op != "silu_mul_quantize_nvfp4" else 32) // 2)


def test_quantizer_value_check_is_eager_only():
    """The fake impls take any value (they never read it), so tracing does not sync or fail."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 64, dtype=torch.bfloat16)
        packed, scale = torch.ops.nvgemm.quantize_nvfp4(x, torch.empty((), dtype=torch.float32))
    assert tuple(packed.shape) == (4, 32)
