"""Fused SwiGLU + NVFP4 requant: the lane model (:mod:`nvgemm.epilogues.requant`) driven by the sm_100a
kernel's OWN epilogue thread ownership (``thread_ownership``: the tiled MMA's C partition and the TMEM
load atom the kernel selects, traced on CPU), byte-compared with ``quantize_nvfp4`` of the unfused output.

For each epilogue warp, sub-tile and register, the 32 lanes' accumulator elements (GEMM row = interleaved
gate/up feature, column = token) are gathered exactly where the kernel's registers hold them; the warp's
block index and token are read from lane 0's coordinate. If the kernel's ownership stopped matching the
lane model's premise (32 consecutive interleaved rows = one 16-feature block, one token per register),
the bytes would differ: the old 16x256b TMEM-load choice is the mutation that shows it.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("cutlass")

import nvgemm.ops.linear  # noqa: E402,F401
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.epilogues.requant import requant_warp  # noqa: E402
from nvgemm.core.formats import blocked_numel, blocked_offset  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402
from nvgemm.templates.sm100_w4a4.launch import gate_up_permutation  # noqa: E402

pytestmark = pytest.mark.compile_only
WARP = 32


def _fused_from_ownership(own, pre_gemm, m, gs, dtype):
    """pre_gemm fp32 [128, tile_n]: post-alpha accumulator in the kernel's interleaved row order."""
    i = pre_gemm.shape[0] // 2
    kb = i // 16
    packed = torch.zeros(m, i // 2, dtype=torch.uint8)
    scales = torch.zeros(blocked_numel(m, kb), dtype=torch.uint8)
    for w in range(4):
        regs = [own[(0, WARP * w + lane)][0] for lane in range(WARP)]  # [lane][sub-tile][register] -> (r, c)
        for st in range(len(regs[0])):
            for reg in range(len(regs[0][st])):
                rc = [regs[lane][st][reg] for lane in range(WARP)]
                lanes = torch.tensor([float(pre_gemm[r, c]) for r, c in rc])
                byte, sf = requant_warp(lanes, gs, dtype)
                r0, tok = rc[0]
                if tok < m:  # the kernel's predicate: tokens beyond M are not stored
                    packed[tok, (r0 // 32) * 8:(r0 // 32) * 8 + 8] = byte
                    scales[blocked_offset(tok, r0 // 32, kb)] = sf.view(torch.uint8)
    return packed, scales


def _case(tile_n, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = tile_n - 3  # a token tail inside the tile
    pre = torch.randn(m, 128, generator=g) * torch.logspace(-2, 1, 128)  # [gate | up], I = 64
    pre[1] = 0  # an all-zero row: sf = 0, codes 0
    inter = torch.zeros(128, tile_n)
    inter[:, :m] = pre[:, gate_up_permutation(128)].t()
    return m, pre, inter, torch.tensor(1.5 / 2688)


def _own(cfg, kernel_cls=None):
    from nvgemm.templates.sm100_w4a4.epilogue import thread_ownership
    from nvgemm.templates.sm100_w4a4.kernel import Sm100Nvfp4GemmKernel

    epi = EpilogueSpec(alpha="vector", activation="silu_mul", out_dtype=torch.bfloat16)
    return thread_ownership((kernel_cls or Sm100Nvfp4GemmKernel)(cfg, epi, max_active_clusters=148))


@pytest.mark.parametrize("tile_n", [16, 32])
def test_requant_on_kernel_ownership_equals_quantize(tile_n):
    m, pre, inter, gs = _case(tile_n)
    packed, scales = _fused_from_ownership(_own(C(tile_n=tile_n, swap_ab=True)), inter, m, gs, torch.bfloat16)
    h = (torch.nn.functional.silu(pre[:, :64]) * pre[:, 64:]).to(torch.bfloat16)
    ref_p, ref_s = torch.ops.nvgemm.quantize_nvfp4(h, gs, True)
    assert torch.equal(packed, ref_p)
    assert torch.equal(scales, ref_s.view(torch.uint8))  # padding rows (m .. 127) and K blocks 4.. stay zero


def test_old_16x256b_atom_breaks_the_blocks():
    """Mutation: with the TMEM-load atom the kernel once chose (16x256b for column-major 16-bit output),
    a warp's lanes no longer hold one 16-feature block of one token, and the bytes differ."""
    import cutlass.utils as utils

    from nvgemm.templates.sm100_w4a4.kernel import Sm100Nvfp4GemmKernel

    class OldAtomChoice(Sm100Nvfp4GemmKernel):
        def _t2r_layout(self):
            return utils.LayoutEnum.COL_MAJOR

    m, pre, inter, gs = _case(16)
    packed, scales = _fused_from_ownership(_own(C(tile_n=16, swap_ab=True), OldAtomChoice), inter, m, gs,
                                           torch.bfloat16)
    h = (torch.nn.functional.silu(pre[:, :64]) * pre[:, 64:]).to(torch.bfloat16)
    ref_p, ref_s = torch.ops.nvgemm.quantize_nvfp4(h, gs, True)
    assert not (torch.equal(packed, ref_p) and torch.equal(scales, ref_s.view(torch.uint8)))


@pytest.mark.parametrize("alpha,tile_n", [("scalar", 16), ("vector", 32)])
def test_fused_requant_kernel_compiles_without_spills(alpha, tile_n):
    """The out_quant epilogue compiles for sm_100a: per register one e2m1x2 and one e4m3x2 conversion,
    true divisions, 6 butterfly shuffles (gate/up pair, 4 amax steps, nibble pair), byte stores; no local
    memory (LDL/STL) in the SASS."""
    import re

    from nvgemm.cli import sass_tool
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.aot.abi import check_spec, get_template

    epi = EpilogueSpec(alpha=alpha, bias=True, activation="silu_mul", out_quant=True)
    spec = make_spec("sm100_nvfp4_gemm", C(tile_n=tile_n, swap_ab=True), "sm_100a", epilogue=epi)
    assert check_spec(spec), check_spec(spec).reason
    f = get_template("sm100_nvfp4_gemm").compile(spec, keep_ptx=True)
    ptx = f.__ptx__
    regs = min(tile_n, 32)  # epi_n registers per sub-tile; the sub-tile loop is not unrolled
    assert ptx.count("cvt.rn.satfinite.e2m1x2.f32") == regs
    assert ptx.count("cvt.rn.satfinite.e4m3x2.f32") == regs
    assert ptx.count("cvt.rn.f16x2.e4m3x2") == regs
    assert ptx.count("shfl.sync.bfly") == 6 * regs
    assert ptx.count("div.rn.f32") >= 2 * regs
    # one code byte, one scale byte per register (predicated), plus the one store of the loop that zeroes the scale
    # layout's padding rows (_zero_sf_padding: the host allocates the scales uninitialised)
    assert ptx.count("st.global.b8") == 2 * regs + 1
    if sass_tool.find_cuobjdump() is None:
        pytest.skip("no cuobjdump for the SASS spill check")
    sass = sass_tool.dump_sass(f)[0]
    assert not re.search(r"\b(LDL|STL)\b", sass), "the fused requant epilogue spills to local memory"


def test_out_quant_rejects_what_it_does_not_implement():
    from nvgemm.templates.sm100_w4a4.kernel import Sm100Nvfp4GemmKernel

    with pytest.raises(ValueError, match="1-CTA swap-AB"):
        Sm100Nvfp4GemmKernel(C(tile_n=64), EpilogueSpec(activation="silu_mul", out_quant=True), 148)
    with pytest.raises(ValueError, match="out_quant"):
        EpilogueSpec(activation="none", out_quant=True)
    assert EpilogueSpec(activation="silu_mul").key() == "ascalar-b0-silu_mul-r0-bfloat16"  # old keys unchanged
