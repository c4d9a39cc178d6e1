"""nvgemm's Triton kernels on a real GPU (marked ``gpu``; PDL tests need sm_90+).

Same contracts as the CPU interpreter tests (tests/cpu/triton_interp), at decode/prefill sizes:
* quantizers: bytes identical to ``nvgemm.core.formats`` computed on CPU (no tolerance);
* fused quantizers: y within one dtype ulp of the unfused reference on <= 1% of elements, and
  bytes identical to quantizing the kernel's own y;
* W4A16 / W4A4 GEMM vs the emulated op: fp32 summation-order bound (``nvfp4_cases.error_bound``)
  with ``acc_factor=2`` for tensor-core accumulation (its internal alignment is not IEEE add by add);
* PDL: kernels launched with ``launch_pdl`` and compiled with griddepcontrol, chained back to back
  (and inside a CUDA graph) with exact results.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu" / "triton_interp"))
from nvfp4_cases import adversarial, error_bound  # noqa: E402

from nvgemm.core.formats import blocked_numel, quantize_activation, quantize_weight, to_blocked  # noqa: E402
from nvgemm.ops.linear import nvfp4_linear_emulated  # noqa: E402
from nvgemm.templates.triton import reference as ref  # noqa: E402

DEV = "cuda"


def _cap():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


sm90_plus = pytest.mark.skipif(_cap() < (9, 0), reason="PDL (griddepcontrol) needs sm_90+")


def ref_bytes(x, gs, swizzle=True):
    p, s = quantize_activation(x.cpu(), gs.cpu())
    return p, (to_blocked(s).reshape(-1) if swizzle else s).view(torch.uint8)


def assert_bytes(p, s, rp, rs):
    assert torch.equal(p.cpu(), rp), f"{int((p.cpu() != rp).sum())} packed bytes differ"
    assert torch.equal(s.view(torch.uint8).cpu(), rs), f"{int((s.view(torch.uint8).cpu() != rs).sum())} scale bytes differ"


@pytest.mark.parametrize("m", [1, 7, 128, 129, 1000, 4096])
@pytest.mark.parametrize("k", [16, 48, 4096, 7168])
def test_quantizer_bytes(m, k, seed):
    from nvgemm.templates.triton.quantize import quantize_nvfp4_triton

    x = (torch.randn(m, k, device=DEV) * torch.exp2(torch.randint(-8, 8, (m, 1), device=DEV).float())).bfloat16()
    gs = torch.tensor(0.01, device=DEV)
    for swizzle in (True, False):
        p, s = quantize_nvfp4_triton(x, gs, swizzle)
        assert_bytes(p, s, *ref_bytes(x, gs, swizzle))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantizer_adversarial_and_op(dtype):
    x, gs = adversarial(torch.float16 if dtype == torch.float32 else dtype)
    x, gs = x.to(dtype).to(DEV), gs.to(DEV)
    p, s = torch.ops.nvgemm.quantize_nvfp4(x, gs, True)  # the op: dispatches to the Triton kernel on CUDA
    assert_bytes(p, s, *ref_bytes(x, gs))
    packed = torch.full((x.shape[0], x.shape[1] // 2), 0xAB, dtype=torch.uint8, device=DEV)
    scale = torch.full((blocked_numel(x.shape[0], x.shape[1] // 16),), 0xCD, dtype=torch.uint8, device=DEV)
    from nvgemm.templates.triton.quantize import quantize_nvfp4_triton

    p, s = quantize_nvfp4_triton(x, gs, True, out=(packed, scale))  # garbage buffers: padding must be rewritten
    assert_bytes(p, s, *ref_bytes(x, gs))


def _check_fused(y, y_ref, p, s, gs, dtype):
    y_ref = y_ref.float().cpu()
    y = y.cpu()
    diff = (y - y_ref).abs()
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
    assert bool((diff <= ulp * y_ref.abs() + 2.0**-24).all())
    assert float((diff > 0).float().mean()) <= 0.01
    assert_bytes(p, s, *ref_bytes(y, gs))


@pytest.mark.parametrize("m,k", [(1, 4096), (7, 5120), (128, 8192), (333, 2048), (2, 16384)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_quantizers(m, k, dtype, seed):
    from nvgemm.templates.triton.fused import (
        add_rmsnorm_quantize_nvfp4_triton,
        rmsnorm_quantize_nvfp4_triton,
        silu_mul_quantize_nvfp4_triton,
    )

    x = (torch.randn(m, k, device=DEV) * 3).to(dtype)
    r = torch.randn(m, k, device=DEV).to(dtype)
    w = (torch.rand(k, device=DEV) + 0.5).to(dtype)
    gs = torch.tensor(0.003, device=DEV)
    p, s, y = rmsnorm_quantize_nvfp4_triton(x, w, gs, 1e-6, True, return_y=True)
    _check_fused(y, ref.rmsnorm_ref(x.cpu(), w.cpu(), 1e-6), p, s, gs, dtype)
    p, s, r_new, y = add_rmsnorm_quantize_nvfp4_triton(x, r, w, gs, 1e-6, True, return_y=True)
    y_ref, r_ref = ref.add_rmsnorm_ref(x.cpu(), r.cpu(), w.cpu(), 1e-6)
    assert torch.equal(r_new.cpu(), r_ref)
    _check_fused(y, y_ref, p, s, gs, dtype)
    p, s, y = silu_mul_quantize_nvfp4_triton(x, gs, True, return_y=True)
    _check_fused(y, ref.silu_mul_ref(x.cpu()), p, s, gs, dtype)
    # the ops dispatch to the same kernels
    p2, s2 = torch.ops.nvgemm.silu_mul_quantize_nvfp4(x, gs, True)
    assert torch.equal(p2, p) and torch.equal(s2.view(torch.uint8), s.view(torch.uint8))


GEMM_CASES = [  # m, n, k, activation, w4a4, vector alpha, bias, residual
    (1, 4096, 4096, "none", False, False, False, False),
    (1, 4096, 4096, "none", True, False, False, False),
    (8, 2 * 11008, 4096, "silu_mul", True, True, False, False),
    (16, 4096, 11008, "none", False, False, True, True),
    (64, 1536, 4096, "gelu_tanh", True, True, True, False),
    (300, 1024, 2048, "silu", False, False, True, True),
]


@pytest.mark.parametrize("m,n,k,activation,w4a4,vec,has_bias,has_res", GEMM_CASES,
                         ids=[f"m{c[0]}-n{c[1]}-k{c[2]}-{c[3]}-{'w4a4' if c[4] else 'w4a16'}" for c in GEMM_CASES])
@pytest.mark.parametrize("xdt", [torch.bfloat16, torch.float16])
def test_gemm_vs_emulated(m, n, k, activation, w4a4, vec, has_bias, has_res, xdt, seed):
    from nvgemm.templates.triton.gemm_w4a16 import nvfp4_linear_triton

    q = quantize_weight(torch.randn(n, k) * 0.02)
    q = type(q)(q.packed.to(DEV), q.scale.to(DEV), q.global_scale.to(DEV))
    ws = to_blocked(q.scale)
    ws2 = q.global_scale * (torch.linspace(0.5, 2.0, n, device=DEV) if vec else torch.tensor(1.0, device=DEV))
    x = torch.randn(m, k, device=DEV).to(xdt)
    input_scale = (x.float().abs().amax() / 2688).reshape(()) if w4a4 else None
    n_out = n // 2 if activation == "silu_mul" else n
    bias = torch.randn(n, device=DEV).to(xdt) if has_bias else None
    residual = torch.randn(m, n_out, device=DEV).to(xdt) if has_res else None
    out = nvfp4_linear_triton(x, q.packed, ws, ws2, input_scale, bias, residual, activation, None)
    ref32 = nvfp4_linear_emulated(x, q.packed, ws, ws2, input_scale, bias, residual, activation, torch.float32)
    bound = error_bound(x.cpu(), type(q)(*(t.cpu() for t in q)), ws2.cpu(),
                        input_scale.cpu() if w4a4 else None, bias.cpu() if has_bias else None, activation, xdt,
                        ref32.cpu(), acc_factor=2.0)
    err = (out.double().cpu() - ref32.double().cpu()).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max():.3e}"
    # through the op: on GPUs without a CuTeDSL kernel the Triton backend is selected
    out_op = torch.ops.nvgemm.nvfp4_linear(x, q.packed, ws, ws2, input_scale, bias, residual, activation, None)
    assert out_op.shape == out.shape


def _compiled(jitfn):
    return [k for caches in jitfn.device_caches.values() for k in caches[0].values()]


@sm90_plus
def test_pdl_chain_exact_and_compiled_with_griddepcontrol(seed):
    """add+RMSNorm+quantize -> quantize(new residual) -> W4A4 GEMM, all launched with PDL, x20."""
    from nvgemm.templates.triton.fused import add_rmsnorm_quantize_nvfp4_triton, rmsnorm_quantize_kernel
    from nvgemm.templates.triton.gemm_w4a16 import nvfp4_linear_triton, w4a16_gemm_kernel
    from nvgemm.templates.triton.quantize import quantize_nvfp4_kernel, quantize_nvfp4_triton

    m, k, n = 4, 4096, 2048
    q = quantize_weight(torch.randn(n, k) * 0.02)
    wp, ws, ws2 = q.packed.to(DEV), to_blocked(q.scale).to(DEV), q.global_scale.to(DEV)
    w = (torch.rand(k, device=DEV) + 0.5).bfloat16()
    gs = torch.tensor(0.002, device=DEV)
    for i in range(20):
        x = torch.randn(m, k, device=DEV).bfloat16() * (i + 1)  # producer kernels right before ours
        r = torch.randn(m, k, device=DEV).bfloat16()
        p1, s1, r_new = add_rmsnorm_quantize_nvfp4_triton(x, r, w, gs, 1e-6, True, pdl=True)
        p2, s2 = quantize_nvfp4_triton(r_new, gs, True, pdl=True)
        out = nvfp4_linear_triton(r_new, wp, ws, ws2, gs, pdl=True, out_dtype=torch.float32)
        torch.cuda.synchronize()
        assert torch.equal(r_new.cpu(), (x.float() + r.float()).bfloat16().cpu())
        assert_bytes(p2, s2, *ref_bytes(r_new, gs))
        ref32 = nvfp4_linear_emulated(r_new, wp, ws, ws2, gs, None, None, "none", torch.float32)
        bound = error_bound(r_new.cpu(), q, q.global_scale, gs.cpu(), None, "none", torch.float32, ref32.cpu(),
                            acc_factor=2.0)
        assert bool(((out - ref32).abs().double().cpu() <= bound).all())
    for jitfn in (rmsnorm_quantize_kernel, quantize_nvfp4_kernel, w4a16_gemm_kernel):
        variants = [c for c in _compiled(jitfn) if c.metadata.launch_pdl]
        assert variants, f"{jitfn.__name__} was never launched with launch_pdl"
        for c in variants:
            assert "griddepcontrol.wait" in c.asm["ptx"] and "griddepcontrol.launch_dependents" in c.asm["ptx"]


@sm90_plus
def test_pdl_inside_cuda_graph(seed):
    from nvgemm.templates.triton.fused import rmsnorm_quantize_nvfp4_triton
    from nvgemm.templates.triton.quantize import quantize_nvfp4_triton

    m, k = 1, 8192
    x = torch.randn(m, k, device=DEV).bfloat16()
    w = (torch.rand(k, device=DEV) + 0.5).bfloat16()
    gs = torch.tensor(0.002, device=DEV)
    packed = torch.empty(m, k // 2, dtype=torch.uint8, device=DEV)
    scale = torch.empty(blocked_numel(m, k // 16), dtype=torch.uint8, device=DEV)
    rmsnorm_quantize_nvfp4_triton(x, w, gs, pdl=True)  # compile outside the capture
    quantize_nvfp4_triton(x, gs, pdl=True, out=(packed, scale))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2  # producer inside the graph
        p1, s1 = rmsnorm_quantize_nvfp4_triton(y, w, gs, pdl=True)
        quantize_nvfp4_triton(y, gs, pdl=True, out=(packed, scale))
    for i in range(3):
        x.copy_(torch.randn(m, k, device=DEV).bfloat16())
        g.replay()
        torch.cuda.synchronize()
        assert_bytes(packed, scale, *ref_bytes(x * 2, gs))


def test_fused_op_under_torch_compile(seed):
    x = torch.randn(3, 1024, device=DEV).bfloat16()
    w = (torch.rand(1024, device=DEV) + 0.5).bfloat16()
    gs = torch.tensor(0.002, device=DEV)

    def f(x):
        return torch.ops.nvgemm.rmsnorm_quantize_nvfp4(x * 1.5, w, gs, 1e-6, True)

    p, s = torch.compile(f, fullgraph=True)(x)
    p_e, s_e = f(x)
    assert torch.equal(p, p_e) and torch.equal(s.view(torch.uint8), s_e.view(torch.uint8))
