"""The capture pass claims ``quantize_nvfp4 -> _scaled_mm(fp4) * alpha (+ bias)`` in every spelling.

``aten._scaled_mm`` on FP4 has no CPU kernel, so graphs are traced with FakeTensors
(``make_fx(tracing_mode="fake")``; the fake kernel of ``_scaled_mm`` works on CPU), rewritten by
the pass, and then *run* on CPU: after the rewrite only nvgemm ops remain. Numerics of the
rewritten graph are checked against the emulated reference computed directly from the same
tensors, and against the original graph's own semantics (fp32 dequantized GEMM, bf16 rounding
after the GEMM, after alpha and after bias).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.integrations.inductor.capture import capture_nvfp4_linears
from nvgemm.ops.linear import nvfp4_linear_emulated

aten = torch.ops.aten
FP4 = torch.float4_e2m1fn_x2
M, N, K = 5, 48, 64


def _operands(seed: int, bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g)).to(torch.bfloat16)
    w = torch.randn(N, K, generator=g) * 0.1
    q = quantize_weight(w)
    input_scale = (x.float().abs().amax() / 2688.0).reshape(())
    b = (torch.randn(N, generator=g) * 0.5).to(torch.bfloat16) if bias else None
    return x, q.packed, to_blocked(q.scale), q.global_scale.reshape(()), input_scale, b


def _scaled(x, w, ws, ins):
    qx, sx = torch.ops.nvgemm.quantize_nvfp4(x, ins)
    # torch._scaled_mm reads flat swizzled scale bytes
    return torch._scaled_mm(qx.view(FP4), w.view(FP4).t(), sx, ws.reshape(-1), out_dtype=torch.bfloat16)


# Every spelling the pass must claim. Each takes (x, w, ws, ws2, ins, alpha_t, bias).
SPELLINGS = {
    "tensor0d": lambda x, w, ws, ws2, ins, a, b: _scaled(x, w, ws, ins) * a,
    "tensor0d_left": lambda x, w, ws, ws2, ins, a, b: a * _scaled(x, w, ws, ins),
    "shape1": lambda x, w, ws, ws2, ins, a, b: _scaled(x, w, ws, ins) * a.reshape(1),
    "shape1_left": lambda x, w, ws, ws2, ins, a, b: a.reshape(1) * _scaled(x, w, ws, ins),
    "product": lambda x, w, ws, ws2, ins, a, b: _scaled(x, w, ws, ins) * (ins * ws2),
    "bias": lambda x, w, ws, ws2, ins, a, b: _scaled(x, w, ws, ins) * a + b,
    "bias_left": lambda x, w, ws, ws2, ins, a, b: b + a * _scaled(x, w, ws, ins),
}


def _float_spelling(alpha: float, with_bias: bool):
    if with_bias:
        return lambda x, w, ws, ws2, ins, a, b: _scaled(x, w, ws, ins) * alpha + b
    return lambda x, w, ws, ws2, ins, a, b: _scaled(x, w, ws, ins) * alpha


def _trace(fn, args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _eager_semantics(x, w, ws, ins, alpha, bias, out_dtype):
    """What the original graph computes (if _scaled_mm ran): bf16 GEMM, then bf16 * alpha, then + bias.

    Returns (result fp32, |acc * alpha| fp32: the magnitude at which the first two roundings happen).
    """
    from nvgemm.core.formats import dequantize, from_blocked, quantize_activation

    qx, sx = quantize_activation(x, ins)
    a = dequantize(qx, sx)
    wd = dequantize(w, from_blocked(ws, N, K // 16))
    acc = a @ wd.t()
    alpha_f = float(alpha) if isinstance(alpha, float) else alpha.float()
    y = acc.to(torch.bfloat16).float() * alpha_f
    y = y.to(out_dtype)
    if bias is not None:
        y = y + bias
    return y.float(), (acc * alpha_f).abs()


def _check_claimed(gm, expect_bias: bool):
    t = _targets(gm)
    assert aten._scaled_mm.default not in t, gm.graph
    assert t.count(torch.ops.nvgemm.nvfp4_linear.default) == 1, gm.graph
    assert torch.ops.nvgemm.quantize_nvfp4.default not in t, "the activation quantization must be inside the op"
    lin = next(n for n in gm.graph.nodes if n.target is torch.ops.nvgemm.nvfp4_linear.default)
    assert len(lin.args) == 9 and not lin.kwargs
    assert (lin.args[5] is not None) == expect_bias
    return lin


@pytest.mark.parametrize("spelling", sorted(SPELLINGS) + ["float", "float_bias"])
def test_scaled_mm_pattern_claimed_and_numerics(spelling):
    with_bias = "bias" in spelling
    x, w, ws, ws2, ins, b = _operands(seed=len(spelling), bias=with_bias)
    alpha_t = (ins * ws2).reshape(())
    fn = _float_spelling(float(alpha_t), with_bias) if spelling.startswith("float") else SPELLINGS[spelling]
    args = (x, w, ws, ws2, ins, alpha_t, b if b is not None else torch.zeros(N, dtype=torch.bfloat16))
    gm = _trace(fn, args)
    assert aten._scaled_mm.default in _targets(gm)
    # bf16 * shape-(1,) fp32 promotes to fp32 (a 1-D tensor is not a 0-d scalar); the rewrite
    # must keep whatever dtype the original graph produces.
    out_dtype = next(n for n in gm.graph.nodes if n.op == "output").args[0].meta["val"].dtype
    before = counters["nvgemm_cutedsl"]["scaled_mm_claimed"]
    capture_nvfp4_linears(gm.graph)
    gm.recompile()
    assert counters["nvgemm_cutedsl"]["scaled_mm_claimed"] == before + 1
    _check_claimed(gm, with_bias)

    out = gm(*args)  # runs on CPU: only nvgemm ops are left
    assert out.dtype == out_dtype and out.shape == (M, N)
    # (1) Against the emulated reference with the same operands. "product" passes ws2 itself
    # (bit-exact); the other spellings pass alpha / input_scale, which the op multiplies back
    # by input_scale: within 1 fp32 ulp of alpha, so at most 1 bf16 ulp (<= 2**-7 relative)
    # after the single rounding.
    ref = nvfp4_linear_emulated(x, w, ws, ws2, ins, b, None, "none", out_dtype)
    if spelling == "product":
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=1e-6)
    # (2) Against what the original graph means. nvgemm rounds once; the graph rounds after the
    # GEMM, after alpha and after the bias.
    alpha_used = float(alpha_t) if spelling.startswith("float") else alpha_t
    sem, pre = _eager_semantics(x, w, ws, ins, alpha_used, b, out_dtype)
    err = (out.float() - sem).abs()
    # bf16 unit roundoff u = 2**-8: the graph rounds the GEMM output, alpha (tensor case) and
    # the alpha product (<= u |acc*alpha| each), then each side rounds its final value once.
    u = 2**-8
    bound = 3 * u * pre + 2 * u * sem.abs() + 1e-6
    assert bool((err <= bound).all()), f"max excess {float((err - bound).max())}"


def test_pass_leaves_unclaimable_scaled_mm_alone():
    x, w, ws, ws2, ins, _ = _operands(seed=3)
    alpha = (ins * ws2).reshape(())
    qx, sx = torch.ops.nvgemm.quantize_nvfp4(x, ins)

    def pre_quantized(qx, sx, w, ws, a):  # activation not quantized in the graph: not ours
        return torch._scaled_mm(qx.view(FP4), w.view(FP4).t(), sx, ws.reshape(-1), out_dtype=torch.bfloat16) * a

    def with_scale_result(x, w, ws, ins, a):  # _scaled_mm's own scale_result keeps its ATen meaning
        q, s = torch.ops.nvgemm.quantize_nvfp4(x, ins)
        return torch._scaled_mm(q.view(FP4), w.view(FP4).t(), s, ws.reshape(-1), scale_result=a, out_dtype=torch.bfloat16) * a

    def vector_mul(x, w, ws, ins, v):  # a per-column multiply is not a scalar alpha
        return _scaled(x, w, ws, ins) * v

    cases = [
        (pre_quantized, (qx, sx, w, ws, alpha)),
        (with_scale_result, (x, w, ws, ins, alpha)),
        (vector_mul, (x, w, ws, ins, torch.rand(N))),
    ]
    for fn, args in cases:
        gm = _trace(fn, args)
        before = [str(n.target) for n in gm.graph.nodes]
        capture_nvfp4_linears(gm.graph)
        assert [str(n.target) for n in gm.graph.nodes] == before, fn.__name__


def test_nvfp4_linear_calls_are_normalised_to_2d_positional():
    x, w, ws, ws2, ins, b = _operands(seed=4, bias=True)
    x3 = x.reshape(1, M, K)

    def f(x3, w, ws, ws2, ins, b):
        return torch.ops.nvgemm.nvfp4_linear(x3, w, ws, ws2, input_scale=ins, bias=b)

    args = (x3, w, ws, ws2, ins, b)
    gm = _trace(f, args)
    capture_nvfp4_linears(gm.graph)
    gm.recompile()
    lin = next(n for n in gm.graph.nodes if n.target is torch.ops.nvgemm.nvfp4_linear.default)
    assert len(lin.args) == 9 and not lin.kwargs
    assert lin.args[0].meta["val"].dim() == 2
    out = gm(*args)
    assert out.shape == (1, M, N)
    assert torch.equal(out, nvfp4_linear_emulated(x3, w, ws, ws2, ins, b, None, "none", None))


def _post_grad_on_fake_cuda(fn, shapes):
    """Trace ``fn`` on fake CUDA tensors and run Inductor's post-grad passes (no GPU needed)."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes.post_grad import post_grad_passes
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    fm = FakeTensorMode()
    with fm:
        args = [torch.empty(s, dtype=d, device="cuda") for s, d in shapes]
    gm = make_fx(fn, decomposition_table=select_decomp_table())(*args)
    with V.set_fake_mode(fm):
        post_grad_passes(gm, is_inference=True)
    return gm


def test_claimed_before_pytorchs_fold_and_pytorchs_fold_when_disabled():
    """The pre-pass runs before PyTorch's ``mul(_scaled_mm, alpha)`` fold (torch >= 2.15); disabled, or on a
    torch without the fold and no explicit ``claim_scaled_mm=True``, the chain stays PyTorch's."""
    import nvgemm.integrations.inductor as ni
    from nvgemm.core.formats import blocked_numel
    from nvgemm.integrations.inductor import compat

    has_fold = compat.available("scaled_mm_fold")

    def f(x, w, ws, ins, alpha):
        y = _scaled(x, w, ws, ins) * alpha
        return y.float().sum(-1)  # a reduction consumer: the case PyTorch folds early

    shapes = [((M, K), torch.bfloat16), ((N, K // 2), torch.uint8), ((blocked_numel(N, K // 16),), torch.float8_e4m3fn),
              ((), torch.float32), ((), torch.float32)]
    patch = dict(max_autotune=True, max_autotune_gemm_backends="NVGEMM,ATEN")
    with torch._inductor.config.patch(patch):
        fused = counters["inductor"]["scaled_mm_output_scale_fused"]
        gm = _post_grad_on_fake_cuda(f, shapes)
        mm = [n for n in gm.graph.nodes if n.target is aten._scaled_mm.default]
        assert len(mm) == 1
        assert torch.ops.nvgemm.nvfp4_linear.default not in _targets(gm)
        if has_fold:
            assert counters["inductor"]["scaled_mm_output_scale_fused"] == fused + 1  # PyTorch's own fold
            scale_result = mm[0].kwargs.get("scale_result", mm[0].args[5] if len(mm[0].args) > 5 else None)
            assert scale_result is not None  # alpha became _scaled_mm's native output scale

        claimed = counters["nvgemm_cutedsl"]["scaled_mm_claimed"]
        with ni.enabled():  # default: claim only where PyTorch folds
            gm = _post_grad_on_fake_cuda(f, shapes)
        assert counters["nvgemm_cutedsl"]["scaled_mm_claimed"] == claimed + int(has_fold)
        assert (aten._scaled_mm.default in _targets(gm)) is not has_fold
        if has_fold:
            assert counters["inductor"]["scaled_mm_output_scale_fused"] == fused + 1  # unchanged: ours came first

        with ni.enabled(claim_scaled_mm=True):  # asked for: claimed on every torch
            gm = _post_grad_on_fake_cuda(f, shapes)
        assert counters["nvgemm_cutedsl"]["scaled_mm_claimed"] == claimed + int(has_fold) + 1
        assert aten._scaled_mm.default not in _targets(gm)
        assert torch.ops.nvgemm.nvfp4_linear.default in _targets(gm)
        assert counters["inductor"]["scaled_mm_output_scale_fused"] == fused + int(has_fold)
