"""nvgemm under torch.compile on a CUDA GPU: autotuning, dynamic batch, CUDA graphs, PDL.

NOT RUN YET: no GPU was available when this was written (markers ``gpu``, and ``sm100`` where
the test needs Blackwell's FP4 tensor cores); ready to run on an H100/H200 (``gpu`` tests) or a
B200/GB200/B300 (all).

Tolerances: the compiled graph and eager run the same nvgemm kernels on the same operands
except where autotuning picks a different candidate than eager's dispatch; candidates agree with
the emulated reference to fp32 summation order (``tests/gpu/test_sm100_gemm.py``) plus one
output rounding, so logits are compared at 2e-2 of their max magnitude (bf16 activations through
two NVFP4 re-quantizations; a flipped e2m1 code moves a block by one FP4 step).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache, run_and_get_code

import nvgemm
from nvgemm.integrations.inductor.demo import TinyLlamaConfig, TinyNvfp4Llama, make_linear

pytestmark = [pytest.mark.gpu]

CFG = TinyLlamaConfig(vocab=512, hidden=1024, intermediate=2048, layers=1, heads=8, kv_heads=2, cache_len=64)


def _inputs(model, b):
    ids = ((torch.arange(b) * 37 + 5) % model.cfg.vocab).cuda()
    k, v = (t.cuda() for t in model.make_cache(b, seed=b))
    for t, d in ((ids, 0), (k, 1), (v, 1)):
        torch._dynamo.mark_dynamic(t, d, min=2, max=256)  # backed: nvgemm autotunes per M range
    return ids, k, v


def test_compiled_llama_matches_eager_with_cudagraphs_and_one_compile():
    model = TinyNvfp4Llama(CFG).cuda()
    torch._dynamo.reset()
    counters.clear()
    with fresh_cache(), nvgemm.enabled():
        cm = torch.compile(model, mode="max-autotune", fullgraph=True)
        for b in (2, 3, 8, 17, 64):
            x = _inputs(model, b)
            for _ in range(3):  # cudagraph trees record on the 2nd/3rd call
                out = cm(*x)
            ref = model(*x)
            scale = float(ref[0].abs().max())
            torch.testing.assert_close(out[0], ref[0], rtol=0, atol=2e-2 * scale)
    assert counters["nvgemm_cutedsl"]["lowered"] == 7  # one compile: 7 linears lowered once
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert not counters["graph_break"]


def _pdl_graph(choice):
    lin = make_linear((torch.randn(1024, 1024) * 0.05).to(torch.bfloat16), None, 0.002, "op").cuda()

    def f(x):
        y = torch.ops.nvgemm.nvfp4_linear_choice(x, lin.weight, lin.weight_scale, lin.weight_scale_2,
                                                 lin.input_scale, None, None, "none", None, choice)
        return torch.relu(y) * 2

    return f


@pytest.mark.sm100
def test_generated_consumer_uses_pdl_on_blackwell():
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    with fresh_cache(), nvgemm.enabled():
        out, (code, *_) = run_and_get_code(torch.compile(_pdl_graph("backend:cutedsl_sm100")), x)
    assert "gdc_wait" in code and "'launch_pdl': True" in code
    ref = _pdl_graph("backend:emulated")(x)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=1e-2 * float(ref.abs().max()))


@pytest.mark.sm100
def test_scaled_mm_spelling_is_claimed_and_matches_cublaslt():
    w = (torch.randn(2048, 1024) * 0.05).to(torch.bfloat16)
    lin = make_linear(w, None, 0.002, "scaled_mm").cuda()
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)

    def f(x):
        return lin(x).float().sum(-1)

    eager = f(x)  # cuBLASLt NVFP4 + bf16 multiply (PyTorch's semantics)
    before = counters["nvgemm_cutedsl"]["scaled_mm_claimed"]
    with fresh_cache(), nvgemm.enabled():
        out = torch.compile(f, mode="max-autotune", fullgraph=True)(x)
    assert counters["nvgemm_cutedsl"]["scaled_mm_claimed"] == before + 1
    # Per element nvgemm rounds once where the graph rounds three times (<= 3 bf16 ulps), summed.
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2 * float(eager.abs().max()))
