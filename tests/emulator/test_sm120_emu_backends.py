"""The emulator backends of an sm_120 GPU's fused and MoE kernels: ``emu_sm120`` for the fused gated-MLP ops
(``nvfp4_linear_requant``, ``nvfp4_linear_prequant_requant``, ``nvfp4_linear_prequant``: the sm_120a W4A4
kernel's fused SwiGLU + NVFP4 requant epilogue and its launch on given codes) and ``emu_sm120_moe`` for
``nvfp4_moe`` (the sm_120a grouped kernels), each on the RTX 5090 profile through the ops' dispatch, compared
bit for bit with the emulated ops on exactness-preserving data (``_fused_chain_emu``, ``_sm100_moe_emu``), and
their refusals (a forced backend that cannot run a problem is an error naming why).
"""

from __future__ import annotations

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_120a")

import nvgemm.ops.fused  # noqa: E402,F401  (registers the fused ops)
import nvgemm.ops.moe  # noqa: E402,F401  (registers the MoE op)
from _fused_chain_emu import exact_chain  # noqa: E402
from _sm100_moe_emu import exact_moe_operands  # noqa: E402

from nvgemm.core.formats import to_blocked  # noqa: E402
from nvgemm.ops.moe import nvfp4_moe_emulated  # noqa: E402

pytestmark = pytest.mark.emulator


@pytest.fixture
def spied(monkeypatch):
    """The compile specs the emulator backends prepare (template id, arch, device profile), in order."""
    from nvgemm.emulator import backend as emu_backend

    seen, real = [], emu_backend.prepare

    def spy(spec, device=None, **kw):
        seen.append((spec.template_id, spec.arch, device, getattr(spec.epilogue, "out_quant", False)))
        return real(spec, device=device, **kw) if device is not None else real(spec, **kw)

    monkeypatch.setattr(emu_backend, "prepare", spy)
    return seen


def test_emu_sm120_fused_chain_and_prequant_requant_bit_exact(tmp_path, monkeypatch, spied):
    """``NVGEMM_BACKEND=emu_sm120``: :func:`gated_mlp` runs gate_up through the sm_120a kernel's fused requant
    epilogue and down through the W4A4 kernel fed those codes and scales, bit for bit the emulated unfused chain;
    ``nvfp4_linear_prequant_requant`` (the activation arrives quantized) writes the same bytes as the requant op."""
    from nvgemm.dispatch.fused import PREQUANT, REQUANT, last_fused_selected
    from nvgemm.ops.fused import gated_mlp, requant_emulated

    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "cache"))
    gu, down, x = exact_chain()
    ref = gated_mlp(gu, down, x)
    assert torch.equal(ref, down(gu(x)))
    assert last_fused_selected(REQUANT) != "emu_sm120"
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm120")
    assert torch.equal(gated_mlp(gu, down, x), ref)
    assert last_fused_selected(REQUANT) == "emu_sm120" and last_fused_selected(PREQUANT) == "emu_sm120"
    # the sm_120a W4A4 kernel twice on the RTX 5090 profile: the out_quant (requant) launch, then prequant
    assert [(t, a, d, q) for t, a, d, q in spied] == [("sm120_nvfp4_gemm", "sm_120a", "RTX5090", True),
                                                      ("sm120_nvfp4_gemm", "sm_120a", "RTX5090", False)]
    rq = (gu.weight, gu.weight_scale, gu.weight_scale_2, gu.input_scale, gu.bias, down.input_scale)
    want = requant_emulated(x, *rq, torch.bfloat16)
    got = torch.ops.nvgemm.nvfp4_linear_requant(x, *rq, torch.bfloat16)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))
    xq, xs = torch.ops.nvgemm.quantize_nvfp4(x, gu.input_scale, True)
    got = torch.ops.nvgemm.nvfp4_linear_prequant_requant(xq, xs, *rq, torch.bfloat16)
    assert last_fused_selected(REQUANT) == "emu_sm120"
    assert torch.equal(got[0], want[0]) and torch.equal(got[1].view(torch.uint8), want[1].view(torch.uint8))
    assert len(spied) == 4 and all(s[:3] == ("sm120_nvfp4_gemm", "sm_120a", "RTX5090") for s in spied)


def test_emu_sm120_fused_refuses_what_the_kernel_cannot_run(monkeypatch):
    """Forced, ``emu_sm120`` refuses a requant / prequant problem the sm_120a kernel cannot run (K = 48, not a
    multiple of 32) with an error naming the backend and the reason; nothing is compiled."""
    monkeypatch.setenv("NVGEMM_BACKEND", "emu_sm120")
    g = torch.Generator().manual_seed(0)
    k, i = 48, 32
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    w = torch.randint(0, 256, (2 * i, k // 2), generator=g, dtype=torch.uint8)
    ws = to_blocked(torch.ones(2 * i, k // 16).to(torch.float8_e4m3fn))
    one = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match=r"NVGEMM_BACKEND=emu_sm120 cannot run .*K=48 is not a multiple of 32"):
        torch.ops.nvgemm.nvfp4_linear_requant(x, w, ws, one, one, None, one, torch.bfloat16)
    xq = torch.randint(0, 256, (3, k // 2), generator=g, dtype=torch.uint8)
    xs = to_blocked(torch.ones(3, k // 16).to(torch.float8_e4m3fn)).reshape(-1)
    with pytest.raises(RuntimeError, match=r"NVGEMM_BACKEND=emu_sm120 cannot run .*K=48 is not a multiple of 32"):
        torch.ops.nvgemm.nvfp4_linear_prequant(xq, xs, w, ws, one, one, None, None, torch.bfloat16)


def test_emu_sm120_moe_runs_the_grouped_kernels_bit_exact(monkeypatch, spied):
    """``NVGEMM_MOE_BACKEND=emu_sm120_moe``: ``nvfp4_moe`` runs the sm_120a grouped kernels (GEMM1 with the
    fused requant, GEMM2; the policy's pick for the RTX 5090 profile) and the MoE prep / finalize kernels from
    their sm_120a PTX, bit for bit the emulated op."""
    from nvgemm.dispatch.moe import last_moe_selected
    from nvgemm.emulator import triton_ptx

    monkeypatch.setenv("NVGEMM_MOE_BACKEND", "emu_sm120_moe")
    ids = torch.tensor([[1, 3], [3, 0], [2, 3]], dtype=torch.int32)
    ops = exact_moe_operands(3, 2, 4, 64, 32, ids=ids, seed=5)
    n0 = len(triton_ptx.LAUNCHES)
    got = torch.ops.nvgemm.nvfp4_moe(*ops)
    assert last_moe_selected() == "emu_sm120_moe"
    assert torch.equal(got, nvfp4_moe_emulated(*ops))
    assert [s[:3] for s in spied] == [("sm120_moe_nvfp4", "sm_120a", "RTX5090")] * 2
    assert [(r.kernel, r.arch) for r in triton_ptx.LAUNCHES[n0:]] == [("_moe_prep_kernel", "sm_120a"),
                                                                         ("_finalize_kernel", "sm_120a")]


@pytest.mark.parametrize("case,match", [
    ("h48", r"NVGEMM_MOE_BACKEND=emu_sm120_moe cannot run .*H=48 and I=32 must be multiples of 32"),
    ("w4a16", r"NVGEMM_MOE_BACKEND=emu_sm120_moe cannot run .*W4A16 MoE is not this kernel"),
])
def test_emu_sm120_moe_refuses_what_the_kernels_cannot_run(case, match, monkeypatch):
    """Forced, ``emu_sm120_moe`` refuses H = 48 (not a multiple of 32) and a W4A16 call (no input scales) with
    an error naming the backend and the reason."""
    monkeypatch.setenv("NVGEMM_MOE_BACKEND", "emu_sm120_moe")
    ops = exact_moe_operands(3, 2, 4, 48 if case == "h48" else 64, 32, seed=1)
    if case == "w4a16":
        ops[6] = ops[10] = None
    with pytest.raises(RuntimeError, match=match):
        torch.ops.nvgemm.nvfp4_moe(*ops)


def test_emu_sm120_moe_only_when_forced_by_name():
    """Registered, ``emu_sm120_moe`` never serves a call it was not named for (seconds per call)."""
    from nvgemm.emulator.backend import supports_moe_sm120

    assert supports_moe_sm120(None) == "runs only when forced (NVGEMM_MOE_BACKEND=emu_sm120_moe)"
