"""Every Triton kernel nvgemm ships, from its real sm_90a and sm_100a PTX on the PTX emulator, one shape each
(the W4A16 GEMM two: its decode tile and its 64 x 64 tile, ``tcgen05.mma`` with A in tensor memory on sm_100a;
the default subset; ``python bench/triton_emulator_sweep.py`` runs every config, on sm_120a too), and the
activation quantizer and add + RMSNorm + quantize from their sm_120a PTX. Cases, references and the
tolerances (only where ``ex2.approx`` is involved) are in ``_triton_emu_cases.py``.

Also: the launcher packing (Triton's trailing scratch pointers, an int specialised to the constant 1 dropped
from the parameters), the instruction the tolerance rests on (``ex2.approx`` in the PTX), and the wiring
(``nvgemm.emulator.enable`` installs the stand-in: ``nvgemm::quantize_nvfp4`` and the fused ops on CPU tensors
run the Triton kernel's PTX)."""

from __future__ import annotations

import re

import pytest
import torch

triton = pytest.importorskip("triton")

from nvgemm.templates.triton._common import is_interpreted  # noqa: E402
from nvgemm.templates.triton.quantize import quantize_nvfp4_kernel  # noqa: E402

if is_interpreted(quantize_nvfp4_kernel):
    pytest.skip("kernels were defined under TRITON_INTERPRET=1; PTX needs the compiler", allow_module_level=True)

import _triton_emu_cases as C  # noqa: E402
from nvgemm.emulator import triton_ptx  # noqa: E402
from nvgemm.emulator.triton_ptx import EmuTritonKernel  # noqa: E402

pytestmark = pytest.mark.emulator

CASES = C.default_cases()


@pytest.mark.parametrize("arch", C.ARCHS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c.name}-{c.shape}" for c in CASES])
def test_triton_kernel_from_ptx(case, arch):
    n0 = len(triton_ptx.LAUNCHES)
    case.run(arch)
    ran = {r.kernel for r in triton_ptx.LAUNCHES[n0:] if r.arch == arch}
    assert ran == {k.__name__ for k in case.kernels}, ran  # every kernel of the case ran from PTX


SM120_CASES = C.sm120_default_cases()


@pytest.mark.parametrize("case", SM120_CASES, ids=[f"{c.name}-{c.shape}" for c in SM120_CASES])
def test_triton_kernel_from_sm120a_ptx(case):
    """The kernels an sm_120 GPU launches before every W4A4 linear, from Triton's sm_120a PTX."""
    n0 = len(triton_ptx.LAUNCHES)
    case.run("sm_120a")
    ran = {r.kernel for r in triton_ptx.LAUNCHES[n0:] if r.arch == "sm_120a"}
    assert ran == {k.__name__ for k in case.kernels}, ran


def test_launcher_packing_scratch_pointers_and_specialised_ints():
    """The PTX entry takes the non-constexpr arguments, minus ints specialised to 1, plus Triton's two trailing
    scratch pointers (global, profile); the quantizer at M = 1 still computes the reference's bytes."""
    from nvgemm.templates.triton.quantize import quantize_nvfp4_triton
    from nvgemm.templates.triton.reference import quantize_ref

    k = EmuTritonKernel(quantize_nvfp4_kernel, "sm_100a")
    for m in (1, 3):
        x = (torch.randn(m, 64, generator=torch.Generator().manual_seed(m)) * 2).bfloat16()
        gs = torch.tensor(0.02)
        q, s = quantize_nvfp4_triton(x, gs, kernel=k)
        rq, rs = quantize_ref(x, gs)
        assert torch.equal(q, rq) and torch.equal(s.view(torch.uint8), rs.view(torch.uint8))
        params = k.last.program.entry.params
        # x, gs, q, sf, [M], K, stride_xm, stride_qm, global_scratch, profile_scratch
        assert len(params) == (9 if m == 1 else 10), [p.name for p in params]
        assert [p.size for p in params[-2:]] == [8, 8]


@pytest.mark.parametrize("arch", C.ARCHS)
def test_silu_tolerance_rests_on_ex2_approx(arch):
    """The one tolerance (``Y_ULPS``) is for ``tl.exp``: it must compile to ``ex2.approx.f32`` of x * log2(e)
    (what ``_exp_model`` models), with IEEE division everywhere else."""
    from nvgemm.templates.triton.fused import silu_mul_quantize_kernel, silu_mul_quantize_nvfp4_triton

    k = EmuTritonKernel(silu_mul_quantize_kernel, arch)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    silu_mul_quantize_nvfp4_triton(x, torch.tensor(0.01), kernel=k)
    ptx = k.last_compiled.asm["ptx"]
    assert re.search(r"\bex2\.approx(\.ftz)?\.f32\b", ptx)
    assert re.search(r"mul\.rn\.f32\s+%r\d+, %r\d+, 0f[3B]FB8AA3B;", ptx)  # exp(+-x) = ex2(x * +-log2 e), RN
    assert "div.rn.f32" in ptx and not re.search(r"div\.(approx|full)", ptx)


def test_enable_installs_the_stand_in_on_the_op_path():
    """``nvgemm.emulator.enable(triton_arch=...)``: ``nvgemm::quantize_nvfp4`` and
    ``nvgemm::add_rmsnorm_quantize_nvfp4`` on CPU tensors run the Triton kernels' PTX (launch records appear)
    and return the reference's bytes. A plain ``enable()`` changes nothing until an ``emu_*`` backend is forced,
    and then follows it (sm_90a for ``emu_sm90``) only while it is forced."""
    import nvgemm.ops  # noqa: F401  (registers the ops)
    from nvgemm import emulator, settings
    from nvgemm.templates.common import triton_stand_in
    from nvgemm.templates.triton import fused_ops  # noqa: F401  (registers the fused ops)
    from nvgemm.templates.triton.reference import add_rmsnorm_quantize_ref, quantize_ref

    x = (torch.randn(3, 64, generator=torch.Generator().manual_seed(1)) * 2).bfloat16()
    gs = torch.tensor(0.02)
    rq, rs = quantize_ref(x, gs)

    def launches_of(fn):
        n0 = len(triton_ptx.LAUNCHES)
        q, s = fn()
        assert torch.equal(q, rq) and torch.equal(s.view(torch.uint8), rs.view(torch.uint8))
        return [(r.kernel, r.arch) for r in triton_ptx.LAUNCHES[n0:]]

    def quant():
        return torch.ops.nvgemm.quantize_nvfp4(x, gs)

    try:
        emulator.disable_triton()
        emulator.enable()
        assert triton_stand_in.installed_arch() is None and launches_of(quant) == []  # nothing forced
        with settings.override(NVGEMM_BACKEND="emu_sm90"):
            assert launches_of(quant) == [("quantize_nvfp4_kernel", "sm_90a")]
        assert launches_of(quant) == []  # the override ended: the reference again
        emulator.enable(triton_arch="sm_100a")
        assert launches_of(quant) == [("quantize_nvfp4_kernel", "sm_100a")]
        n0 = len(triton_ptx.LAUNCHES)
        res = (torch.randint(-4, 5, (3, 64)) * 0.25).bfloat16()
        w = torch.ones(64).bfloat16()
        out = torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4(x, res, w, gs)
        ref = add_rmsnorm_quantize_ref(x, res, w, gs)
        assert torch.equal(out[2], ref[2])  # the new residual: exact
        assert [(r.kernel, r.arch) for r in triton_ptx.LAUNCHES[n0:]] == [("rmsnorm_quantize_kernel", "sm_100a")]
        assert "quantize_nvfp4_kernel x1 (sm_100a" in triton_ptx.summary(triton_ptx.LAUNCHES[-2:-1])
        with pytest.raises(ValueError, match="triton_arch must be one of"):
            emulator.enable(triton_arch="sm_80")
    finally:
        emulator.disable_triton()
    assert triton_stand_in.installed_arch() is None


@pytest.mark.parametrize("arch", C.ARCHS)
def test_rope_kv_write_waits_before_its_first_load(arch):
    """The RoPE + KV-write kernel is the qkv GEMM's PDL consumer: compiled with ``griddepcontrol.wait`` ahead of
    every global load (the positions may come from a kernel still in the chain) and ``launch_dependents`` after."""
    from nvgemm.templates.triton.rope import rope_kv_write_kernel, rope_kv_write_triton

    k = EmuTritonKernel(rope_kv_write_kernel, arch)
    qkv = torch.zeros(1, 8 * 64, dtype=torch.bfloat16)
    cache = torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16)
    rope_kv_write_triton(qkv, torch.ones(4, 64), torch.zeros(4, 64), torch.tensor([1]), cache, cache.clone(), 4, 2,
                         kernel=k)
    ptx = k.last_compiled.asm["ptx"]
    wait, first_load = ptx.index("griddepcontrol.wait"), re.search(r"\bld\.global", ptx).start()
    assert wait < first_load and "griddepcontrol.launch_dependents" in ptx
