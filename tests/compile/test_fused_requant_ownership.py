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

import nvgemm.ops  # noqa: E402,F401
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.epilogues.requant import requant_warp  # noqa: E402
from nvgemm.formats import blocked_numel, blocked_offset  # noqa: E402
from nvgemm.templates.sm100.config import Sm100Nvfp4GemmConfig as C  # noqa: E402
from nvgemm.templates.sm100.launch import gate_up_permutation  # noqa: E402

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
    from nvgemm.templates.sm100.epilogue import thread_ownership
    from nvgemm.templates.sm100.kernel import Sm100Nvfp4GemmKernel

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

    from nvgemm.templates.sm100.kernel import Sm100Nvfp4GemmKernel

    class OldAtomChoice(Sm100Nvfp4GemmKernel):
        def _t2r_layout(self):
            return utils.LayoutEnum.COL_MAJOR

    m, pre, inter, gs = _case(16)
    packed, scales = _fused_from_ownership(_own(C(tile_n=16, swap_ab=True), OldAtomChoice), inter, m, gs,
                                           torch.bfloat16)
    h = (torch.nn.functional.silu(pre[:, :64]) * pre[:, 64:]).to(torch.bfloat16)
    ref_p, ref_s = torch.ops.nvgemm.quantize_nvfp4(h, gs, True)
    assert not (torch.equal(packed, ref_p) and torch.equal(scales, ref_s.view(torch.uint8)))
