"""Compile-only tests of the sm_120a / sm_121a NVFP4 W4A4 decode kernel (no GPU): it builds for both
arches across the epilogue space, and its PTX / SASS keep what correctness and performance depend on.

* PTX: ``.target sm_120a`` / ``sm_121a``; ``mma.sync ... kind::mxf4nvf4.block_scale.scale_vec::4X
  ... ue4m3`` with the scale selectors {0, 0}; A fragments by ``ldmatrix .x4``, B by ``.x2``; weights
  streamed with zero-filling ``cp.async.cg ... L2::cache_hint`` under an evict-first policy; scale
  words with 4-byte ``cp.async`` whose source size is a register (the K-tail predicate); PDL variants
  ``griddepcontrol``; split-K variants the counter atomic.
* SASS: exactly ``row_tiles x slabs x m_groups`` ``OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X`` in the main
  loop, no LDL / STL anywhere (spill-free), at most 128 registers per thread.

``python bench/compile_sweep_sm120.py`` compiles every config the policy picks for the Llama shapes.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_120a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import functools
import re

import pytest
import torch

pytest.importorskip("cutlass")

from nvgemm.aot.abi import check_spec, get_template  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.cli import sass_tool  # noqa: E402
from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.templates.sm120_w4a4.config import Sm120W4A4Config as C  # noqa: E402

pytestmark = pytest.mark.compile_only

TID = "sm120_nvfp4_gemm"
OMMA = r"^OMMA\.SF\.16864\.F32\.E2M1\.E2M1\.UE4M3\.4X"
MAX_REGS = 128

CASES = [
    (C(tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True), EpilogueSpec(alpha="scalar"), "sm_120a"),
    (C(tile_m=16, tile_n=128, tile_k=256, num_warps=4, stages=3, split_k=3, pdl=True),
     EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True), "sm_120a"),
    (C(tile_m=32, tile_n=64, tile_k=128, num_warps=2, stages=4, split_k=2),
     EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.float32), "sm_121a"),
    # the fused SwiGLU + NVFP4 requant epilogue (uint8 codes and scale bytes out), with split-K
    (C(tile_m=16, tile_n=128, tile_k=256, num_warps=4, stages=4, split_k=2, pdl=True),
     EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", out_quant=True), "sm_120a"),
    (C(tile_m=8, tile_n=256, tile_k=256, num_warps=8, stages=2),
     EpilogueSpec(alpha="vector", bias=True, residual=True, out_dtype=torch.float16), "sm_121a"),
]


@functools.lru_cache(maxsize=None)
def compiled(cfg, epi, arch):
    spec = make_spec(TID, cfg, arch, epilogue=epi)
    st = check_spec(spec)
    assert st, st.reason
    return get_template(TID).compile(spec, keep_ptx=True)


@pytest.mark.parametrize("cfg,epi,arch", CASES, ids=lambda v: getattr(v, "name", lambda: str(v))()
                         if hasattr(v, "name") else str(v))
def test_ptx_and_sass(cfg, epi, arch):
    c = compiled(cfg, epi, arch)
    ptx = c.__ptx__
    assert f".target {arch}" in ptx
    mmas = re.findall(r"mma\.sync\.aligned\.kind::mxf4nvf4\.block_scale\.scale_vec::4X\.m16n8k64\.row\.col\."
                      r"f32\.e2m1\.e2m1\.f32\.ue4m3 [^;]*, %r\d+, \{0, 0\}, %r\d+, \{0, 0\};", ptx)
    assert len(mmas) == cfg.row_tiles * cfg.slabs * cfg.m_groups
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)) == cfg.row_tiles * cfg.slabs
    assert len(re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x2\.shared\.b16", ptx)) == cfg.m_groups * cfg.slabs
    assert "createpolicy.fractional.L2::evict_first" in ptx
    assert re.search(r"cp\.async\.cg\.shared\.global\.L2::cache_hint \[%r\d+\], \[%rd\d+\], 16, %r\d+, %rd\d+;", ptx)
    assert re.search(r"cp\.async\.ca\.shared\.global \[%r\d+\], \[%rd\d+\], 4, %r\d+;", ptx)
    assert ("griddepcontrol.wait" in ptx) is cfg.pdl
    assert ("atom.acq_rel.gpu.global.add.u32" in ptx) is (cfg.split_k > 1)
    assert ".local" not in ptx
    if sass_tool.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) for the SASS check")
    sass, res = sass_tool.dump_sass(c)
    assert not re.search(r"\b(LDL|STL)\b", sass), "the kernel spills to local memory"
    regs = [int(r) for r in re.findall(r"REG:(\d+)", res)]
    assert regs and max(regs) <= MAX_REGS and "LOCAL:0" in res
    body = main_loop(sass)
    assert len([i for i in body if re.match(OMMA, i)]) == cfg.row_tiles * cfg.slabs * cfg.m_groups


def main_loop(sass: str) -> list[str]:
    """Opcodes (with modifiers) of the main loop: the body of the backward branch around the OMMAs."""
    ins = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", sass)]
    loops = [(int(t, 16), int(a, 16)) for a, t in
             re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?BRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?0x([0-9a-f]+)",
                        sass)]
    best = []
    for lo, hi in loops:
        if lo < hi:
            body = [op for a, op in ins if lo <= a <= hi]
            if sum(bool(re.match(OMMA, op)) for op in body) > sum(bool(re.match(OMMA, op)) for op in best):
                best = body
    assert best, "no main loop (backward branch around OMMA) found"
    return best


def test_other_arches_are_refused_with_a_reason():
    from nvgemm.templates.sm120_w4a4.kernel import TEMPLATE

    for arch in ("sm_100a", "sm_90a"):
        st = TEMPLATE.can_implement(make_spec(TID, C(), arch, epilogue=EpilogueSpec(alpha="scalar")))
        assert not st and "warp-level mxf4nvf4" in st.reason
    st = TEMPLATE.can_implement(make_spec(TID, C(tile_n=64, num_warps=4), "sm_120a",
                                          epilogue=EpilogueSpec(alpha="scalar", activation="silu_mul")))
    assert not st and "even number of row tiles" in st.reason
