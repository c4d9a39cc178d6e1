"""A tiny Llama's whole fused decode step with every GEMM on the real sm_100a / sm_90a kernel run by the PTX
emulator (``NVGEMM_BACKEND=emu_sm100`` / ``emu_sm90``), eager and compiled with nvgemm's layer rewrites.

sm_100a: W4A4 (the RMSNorm quantizer feeds qkv and the gate_up requant launch, prequant down, residuals in the
epilogues); sm_90a: W4A16 (SwiGLU and residuals in the epilogues). References: the same hand-written op chain on
the emulated backend, and the compiled step against the eager chain."""

import sys
from pathlib import Path

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cpu"))

from test_inductor_layer_fusion import _compiled, _fused_chain_step, _step_inputs  # noqa: E402

from nvgemm.dispatch.registry import last_selected  # noqa: E402
from nvgemm.integrations.inductor.demo import TinyLlamaConfig, TinyNvfp4Llama  # noqa: E402


@pytest.mark.emulator
@pytest.mark.parametrize("arch", ["sm100", "sm90"])
def test_fused_decode_step_on_the_kernels(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    model = TinyNvfp4Llama(TinyLlamaConfig(layers=1, fused=True, weight_only=arch == "sm90"))
    inputs = _step_inputs(model, batch=2, seed=3)
    ref = _fused_chain_step(model, *inputs)  # emulated backend
    monkeypatch.setenv("NVGEMM_BACKEND", f"emu_{arch}")
    got = _fused_chain_step(model, *inputs)
    assert last_selected() == f"emu_{arch}"
    # The kernels and the emulated op differ only in the fp32 summation order of each GEMM (K <= 256:
    # ~K * 2^-24 relative), which can move a bf16 rounding by one ulp (2^-8): k / v within that. A flip can move a
    # later FP4 code, so the logits get the loader test's 2% of their range. Observed: bit-identical.
    torch.testing.assert_close(got[1], ref[1], rtol=2.0**-7, atol=2.0**-7 * float(ref[1].abs().max()))
    scale = float(ref[0].abs().max())
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=0.02 * scale)
    # compiled with the layer rewrites: the eager chain's values (logits up to the fp32 order of the compiled
    # lm_head matmul and SDPA, < 1e-3 of the scale). The fused norm quantizer dispatches at run time; every GEMM op
    # (nvfp4_linear, prequant, prequant_requant) lowers to an autotuned choice op, where the emulator's backends are
    # never candidates (seconds per call): those run the emulated op, equal to the kernels as checked above.
    out, counts, code = _compiled(model, inputs)
    assert counts.get("residual_folded") == 2, counts
    assert torch.equal(out[1], got[1]) and torch.equal(out[2], got[2])
    torch.testing.assert_close(out[0], got[0], rtol=0, atol=1e-3 * scale)
    if arch == "sm100":
        assert "nvgemm.nvfp4_linear_prequant_requant_choice.default(" in code
        assert "nvgemm.nvfp4_linear_prequant_requant.default(" not in code

