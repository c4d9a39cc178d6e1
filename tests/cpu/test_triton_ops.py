"""Triton kernel package on CPU without running kernels: registration, ops, fakes, references.

(The kernels themselves run under the interpreter in ``test_triton_interpreter.py``.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from nvgemm.core.formats import blocked_numel, quantize_activation, to_blocked
from nvgemm.dispatch.registry import LinearProblem, backends, load_builtin_backends, select_backend
from nvgemm.templates.triton import reference as ref

load_builtin_backends()


def test_import_nvgemm_does_not_import_triton():
    code = ("import sys, nvgemm, nvgemm.ops.linear, torch\n"
            "from nvgemm.dispatch.registry import backends\n"
            "names = [b.name for b in backends()]\n"
            "assert 'triton_w4a16' in names, names\n"
            "assert torch.ops.nvgemm.rmsnorm_quantize_nvfp4 is not None\n"
            "assert 'triton' not in sys.modules, 'registering the Triton backend imported triton'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_exact_dequant_claim_exhaustive():
    """Every E2M1 value times every finite e4m3 value is exact in bf16 and in fp16.

    This is what makes the W4A4-by-quantize-dequantize path bit-faithful: the kernel feeds the MMA
    ``E2M1[q] * float(sf)`` in x's dtype without any rounding.
    """
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6])
    e4m3 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    prod = (e2m1[:, None] * e4m3[None, :]).flatten()  # exact in fp32 (<= 6 significant bits)
    assert torch.equal(prod.double(), (e2m1.double()[:, None] * e4m3.double()[None, :]).flatten())
    assert torch.equal(prod.to(torch.bfloat16).float(), prod)
    assert torch.equal(prod.to(torch.float16).float(), prod)


def _problem(device_type="cuda", cap=(8, 9), x_dtype=torch.bfloat16, weight_only=True):
    return LinearProblem(m=1, n=256, k=256, device_type=device_type, capability=cap if device_type == "cuda" else None,
                         weight_only=weight_only, x_dtype=x_dtype, out_dtype=torch.bfloat16, alpha="scalar",
                         bias=False, activation="none", residual=False)


def test_backend_registered_between_cutedsl_and_emulated():
    by_name = {b.name: b for b in backends()}
    tb = by_name["triton_w4a16"]
    assert by_name["emulated"].priority < tb.priority
    for name, b in by_name.items():
        if name.startswith("cutedsl"):
            assert b.priority > tb.priority, name
    assert "CUDA" in tb.supports(_problem("cpu"))
    assert "sm_80" in tb.supports(_problem(cap=(7, 5)))
    assert "bfloat16 or float16" in tb.supports(_problem(x_dtype=torch.float32))
    for cap in ((8, 0), (8, 9), (9, 0), (12, 0)):
        for wo in (True, False):
            assert tb.supports(_problem(cap=cap, weight_only=wo)) is None


# (capability, W4A16 backend, W4A4 backend): the Triton GEMM serves where no CuTeDSL kernel does (sm_87: no kernel
# targets it) and the CuTeDSL kernels win where they exist (before sm_120 a W4A4 layer runs on the W4A16 mma kernel
# after the activation's NVFP4 quantize-dequantize, as on Hopper).
@pytest.mark.parametrize("cap,w4a16,w4a4", [
    ((8, 0), "cutedsl_mma_w4a16", "cutedsl_mma_w4a16"), ((8, 9), "cutedsl_mma_w4a16", "cutedsl_mma_w4a16"),
    ((8, 7), "triton_w4a16", "triton_w4a16"), ((12, 0), "cutedsl_mma_w4a16", "cutedsl_sm120"),
], ids=["sm80", "sm89", "sm87", "sm120"])
def test_fallback_is_selected_where_no_cutedsl_kernel(cap, w4a16, w4a4, monkeypatch):
    monkeypatch.delenv("NVGEMM_BACKEND", raising=False)
    assert select_backend(_problem(cap=cap)).name == w4a16
    assert select_backend(_problem(cap=cap, weight_only=False)).name == w4a4
    assert select_backend(_problem("cpu")).name == "emulated"


def test_cuda_quantizer_serves_the_reference_bytes_where_triton_cannot_run():
    """The activation quantizer handed to the kernel backends (and ``quantize_nvfp4``'s CUDA path) falls
    back to the torch reference on a device the Triton kernel cannot serve, with the op's bytes."""
    from nvgemm.templates.triton.fused_ops import quantize_nvfp4_cuda

    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ins = torch.tensor(0.02)
    for swizzle in (True, False):
        got = quantize_nvfp4_cuda(x, ins, swizzle)
        want = torch.ops.nvgemm.quantize_nvfp4(x, ins, swizzle)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))


# --------------------------------------------------------------------------- fused ops


def _inputs(m=3, k=48, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(m * 1000 + k)
    x = torch.randn(m, k, generator=g).to(dtype)
    return x, torch.randn(m, k, generator=g).to(dtype), (torch.rand(k, generator=g) + 0.5).to(dtype), torch.tensor(0.01)


@pytest.mark.parametrize("swizzle", [True, False])
def test_fused_ops_cpu_eager_and_fake_shapes(swizzle):
    x, r, w, gs = _inputs()
    outs = {
        "rms": torch.ops.nvgemm.rmsnorm_quantize_nvfp4(x, w, gs, 1e-6, swizzle),
        "add": torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4(x, r, w, gs, 1e-6, swizzle),
        "silu": torch.ops.nvgemm.silu_mul_quantize_nvfp4(x[:, :32], gs, swizzle),
    }
    # CPU eager runs the torch reference: identical to quantizing the unfused chain
    p, s = quantize_activation(ref.rmsnorm_ref(x, w, 1e-6), gs)
    assert torch.equal(outs["rms"][0], p)
    assert torch.equal(outs["rms"][1].view(torch.uint8), (to_blocked(s).reshape(-1) if swizzle else s).view(torch.uint8))
    assert torch.equal(outs["add"][2], (x.float() + r.float()).bfloat16())
    p, s = quantize_activation(ref.silu_mul_ref(x[:, :32]), gs)
    assert torch.equal(outs["silu"][0], p)
    # fakes on meta produce the same shapes/dtypes
    mx, mr, mw, mgs = (t.to("meta") for t in (x, r, w, gs))
    fakes = {
        "rms": torch.ops.nvgemm.rmsnorm_quantize_nvfp4(mx, mw, mgs, 1e-6, swizzle),
        "add": torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4(mx, mr, mw, mgs, 1e-6, swizzle),
        "silu": torch.ops.nvgemm.silu_mul_quantize_nvfp4(mx[:, :32], mgs, swizzle),
    }
    for key, real in outs.items():
        for a, b in zip(real, fakes[key]):
            assert a.shape == b.shape and a.dtype == b.dtype, key
    if swizzle:
        assert outs["rms"][1].shape == (blocked_numel(3, 3),)


def test_fused_ops_opcheck():
    x, r, w, gs = _inputs(m=2, k=32)
    torch.library.opcheck(torch.ops.nvgemm.rmsnorm_quantize_nvfp4.default, (x, w, gs, 1e-6, True))
    torch.library.opcheck(torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4.default, (x, r, w, gs, 1e-6, True))
    torch.library.opcheck(torch.ops.nvgemm.silu_mul_quantize_nvfp4.default, (x, gs, False))


def test_fused_ops_errors():
    x, r, w, gs = _inputs()
    with pytest.raises(ValueError, match="multiple of 16"):
        torch.ops.nvgemm.silu_mul_quantize_nvfp4(x, gs)  # I = 24
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        torch.ops.nvgemm.rmsnorm_quantize_nvfp4(x.float(), w, gs)
    with pytest.raises(ValueError, match="input_scale"):
        torch.ops.nvgemm.rmsnorm_quantize_nvfp4(x, w, gs.double())
    with pytest.raises(ValueError, match="residual must match"):
        torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4(x, r[:, :16], w, gs)


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_ref_is_hugging_face_llama(dtype):
    """The reference *is* HF's LlamaRMSNorm / Qwen2RMSNorm, bit for bit (an independent implementation)."""
    hf = pytest.importorskip("transformers.models.llama.modeling_llama")
    x, _, w, _ = _inputs(m=5, k=64, dtype=dtype)
    norm = hf.LlamaRMSNorm(64, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
        assert torch.equal(norm(x), ref.rmsnorm_ref(x, w, 1e-5))


def test_silu_mul_ref_vs_fp64():
    """One rounding of silu(g)*u: within half an ulp of the fp64 value, except double-rounding ties."""
    x, _, _, _ = _inputs(m=8, k=256)
    y = ref.silu_mul_ref(x).double()
    g, u = x[:, :128].double(), x[:, 128:].double()
    exact = g / (1 + torch.exp(-g)) * u
    assert bool(((y - exact).abs() <= 2.0**-8 * exact.abs() + 1e-30).all())  # <= 1/2 bf16 ulp (+fp32 slack)
    assert (y == exact.to(torch.bfloat16).double()).float().mean() >= 0.99
