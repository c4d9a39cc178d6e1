"""A tiny NVFP4 Llama decode step under torch.compile(mode="max-autotune", fullgraph=True) with nvgemm.

CPU runs the emulated nvgemm backend (the only candidate here, so no benchmarking). Config
patches for the CPU budget/comparability, none of which touch nvgemm's path:
* ``max_autotune_gemm_backends="ATEN"``: skip autotuning the bf16 ``lm_head`` with the C++
  GEMM template (unrelated to nvgemm, ~20 s on 2 cores);
* ``emulate_precision_casts=True``: compiled bf16 pointwise code rounds where eager rounds,
  so the activations reaching nvgemm's quantizer are the eager ones (the quantizer is
  discontinuous; without this, one flipped bf16 rounding can move an e2m1 code);
* ``cpp.vec_isa_ok=False``: scalar C++ kernels, which compile in half the time on 2 cores.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code

import nvgemm
from nvgemm.integrations.inductor.demo import ScaledMmNvfp4Linear, TinyLlamaConfig, TinyNvfp4Llama, make_linear

CPU_PATCH = {"max_autotune_gemm_backends": "ATEN", "emulate_precision_casts": True, "cpp.vec_isa_ok": False}


def _mark_batch_dynamic(ids, k, v):
    # Unbacked batch: B=1 would otherwise specialise (Inductor's view lowering guards on size 1).
    # torch 2.11's mark_unbacked takes no bounds (an unbacked size has no hint to specialise on).
    import inspect

    mark = torch._dynamo.decorators.mark_unbacked
    bounds = {"min": 1, "max": 256} if "min" in inspect.signature(mark).parameters else {}
    mark(ids, 0, **bounds)
    mark(k, 1, **bounds)
    mark(v, 1, **bounds)


def _torch_release() -> tuple[int, ...]:
    from packaging.version import Version

    return Version(torch.__version__.split("+")[0]).release[:2]


#: torch 2.11/2.12's Inductor CPU code rounds some bf16 pointwise ops differently from eager even
#: with emulate_precision_casts; the NVFP4 activation quantizer is discontinuous, so one flipped
#: bf16 rounding moves an e2m1 code. Measured on 2.12.1 with nvgemm *disabled*: compiled vs eager
#: logits differ by 8% of the logit scale. There the reference is the same model compiled without
#: nvgemm (nvgemm::nvfp4_linear as Inductor's opaque fallback), i.e. the same activations reach the
#: GEMM and only nvgemm's lowering differs.
EAGER_MATCHES_COMPILED = _torch_release() >= (2, 13)


def _reference_outputs(model, batches):
    if EAGER_MATCHES_COMPILED:
        return [model(*inp) for inp in batches]
    torch._dynamo.reset()
    with fresh_cache(), torch._inductor.config.patch(CPU_PATCH):
        plain = torch.compile(model, mode="max-autotune", fullgraph=True)
        outs = []
        for ids, k, v in batches:
            _mark_batch_dynamic(ids, k, v)
            outs.append(plain(ids, k, v))
    return outs


def test_tiny_llama_dynamic_batch_decode_compiles_once_and_matches_eager():
    model = TinyNvfp4Llama(TinyLlamaConfig(layers=1))
    batches = []
    for b in (1, 3, 8, 17):
        k, v = model.make_cache(b, seed=b)
        batches.append(((torch.arange(b) * 37 + 5) % model.cfg.vocab, k, v))
    refs = _reference_outputs(model, batches)
    torch._dynamo.reset()
    counters.clear()
    # fuse_layer=False: the graph's own glue (norms, residual adds, SwiGLU), so the compiled step is the eager
    # arithmetic; the layer rewrites and their rounding changes: test_inductor_layer_fusion.py
    with fresh_cache(), torch._inductor.config.patch(CPU_PATCH), nvgemm.enabled(fuse_layer=False):
        compiled = torch.compile(model, mode="max-autotune", fullgraph=True)
        for i, ((ids, k, v), ref) in enumerate(zip(batches, refs)):
            _mark_batch_dynamic(ids, k, v)
            if i == 0:
                out, codes = run_and_get_code(compiled, ids, k, v)
                code = "\n".join(codes)
            else:
                out = compiled(ids, k, v)
            # Same emulated GEMM code eager and compiled; what may differ is fp32 summation order
            # in the fp32 lm_head matmul (K=128) and SDPA: ~K * eps_fp32 relative (1.5e-5), far
            # below 1e-3 of the logit scale. (Observed: bit-identical.)
            scale = float(ref[0].abs().max())
            torch.testing.assert_close(out[0], ref[0], rtol=0, atol=1e-3 * scale)
            torch.testing.assert_close(out[1], ref[1], rtol=0, atol=0)  # new k: bf16, exact
            torch.testing.assert_close(out[2], ref[2], rtol=0, atol=0)

    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])  # one compile for 1, 3, 8, 17
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["nvgemm_cutedsl"]["nvfp4_linear_captured"] == 7  # q k v o gate up down
    # The generated code calls nvgemm's choice op (emulated on CPU), never the plain fallback op.
    assert code.count("torch.ops.nvgemm.nvfp4_linear_choice.default(") == 7
    assert "backend:emulated" in code
    assert "torch.ops.nvgemm.nvfp4_linear.default(" not in code


@pytest.mark.parametrize("alpha_form,bias", [("float", True), ("vec1", False)])
def test_scaled_mm_linear_compiles_and_runs_on_cpu(alpha_form, bias):
    """``quantize -> _scaled_mm(fp4) * alpha (+ bias)`` cannot run eagerly on CPU; compiled with nvgemm it
    does (the pass rewrote it to nvgemm::nvfp4_linear) and matches the nvgemm op on the same weights."""
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(96, 64, generator=g) * 0.1).to(torch.bfloat16)
    b = (torch.randn(96, generator=g) * 0.2).to(torch.bfloat16) if bias else None
    lin = make_linear(w, b, 0.002, "scaled_mm", alpha_form)
    ref_lin = make_linear(w, b, 0.002, "op")
    assert isinstance(lin, ScaledMmNvfp4Linear)

    def f(x):
        return torch.relu(lin(x)).sum(-1)

    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    with pytest.raises(Exception):
        lin(x)  # no CPU kernel for FP4 _scaled_mm: proves the compiled result is nvgemm's
    torch._dynamo.reset()
    before = counters["nvgemm_cutedsl"]["scaled_mm_claimed"]
    # claim_scaled_mm=True: the default claims only where PyTorch has its own fold (torch >= 2.15)
    with fresh_cache(), torch._inductor.config.patch(CPU_PATCH), nvgemm.enabled(claim_scaled_mm=True):
        out = torch.compile(f, mode="max-autotune", fullgraph=True)(x)
    assert counters["nvgemm_cutedsl"]["scaled_mm_claimed"] == before + 1
    y = ref_lin(x)  # the same weights through nvgemm.NVFP4Linear
    if alpha_form == "vec1":
        # bf16 * shape-(1,) fp32 tensor promotes to fp32 in the original graph; kept.
        y = torch.ops.nvgemm.nvfp4_linear(x, ref_lin.weight, ref_lin.weight_scale, ref_lin.weight_scale_2,
                                          ref_lin.input_scale, ref_lin.bias, None, "none", torch.float32)
    ref = torch.relu(y).sum(-1)
    # alpha reaches the op as alpha / input_scale (fp32), multiplied back by input_scale: within
    # 1 fp32 ulp, i.e. at most 1 ulp of each output element (2**-7 relative, bf16) before the sum.
    torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=2**-7 * float(y.float().abs().sum(-1).max()))
