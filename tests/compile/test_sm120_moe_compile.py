"""Compile-only tests of the sm_120a / sm_121a grouped W4A4 MoE kernel (no GPU): GEMM1 (fused SwiGLU +
NVFP4 requant) and GEMM2 (fp32 out), with and without split-K, build for both arches; the PTX keeps the
block-scaled ``mma.sync`` count of the dense main loop, the requant's conversions and shuffles, the work
list read after ``griddepcontrol.wait``; the SASS has no LDL / STL (spill-free) and at most 128 registers."""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_120a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("cutlass")

from nvgemm.aot.abi import check_spec, get_template  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.cli import sass_tool  # noqa: E402
from nvgemm.core.epilogue import EpilogueSpec  # noqa: E402
from nvgemm.templates.sm120_moe.config import Sm120MoeConfig as C  # noqa: E402

pytestmark = pytest.mark.compile_only

TID = "sm120_moe_nvfp4"
G1 = EpilogueSpec(alpha="scalar", activation="silu_mul", out_dtype=torch.bfloat16, out_quant=True)
G1V = EpilogueSpec(alpha="vector", activation="silu_mul", out_dtype=torch.float16, out_quant=True)
G2 = EpilogueSpec(alpha="scalar", out_dtype=torch.float32)

CASES = [
    (C(tile_n=8, tile_rows=128, num_warps=4, stages=4), G1, "sm_120a"),
    (C(tile_n=16, tile_rows=64, tile_k=256, num_warps=2, stages=4, split_k=2), G1V, "sm_121a"),
    (C(tile_n=8, tile_rows=128, num_warps=4, stages=4), G2, "sm_121a"),
    (C(tile_n=32, tile_rows=64, num_warps=2, stages=3, split_k=4), G2, "sm_120a"),
]


@pytest.mark.parametrize("cfg,epi,arch", CASES, ids=lambda v: v.name() if hasattr(v, "name") and callable(v.name)
                         else str(v))
def test_grouped_kernel_compiles_spill_free(cfg, epi, arch):
    spec = make_spec(TID, cfg, arch, epilogue=epi)
    st = check_spec(spec)
    assert st, st.reason
    c = get_template(TID).compile(spec, keep_ptx=True)
    ptx = c.__ptx__
    d = cfg.dense()
    assert f".target {arch}" in ptx
    mmas = re.findall(r"mma\.sync\.aligned\.kind::mxf4nvf4\.block_scale", ptx)
    assert len(mmas) == d.row_tiles * d.slabs * d.m_groups
    assert "griddepcontrol.wait" in ptx
    assert ("cvt.rn.satfinite.e2m1x2.f32" in ptx) is epi.out_quant
    assert ("shfl.sync.bfly" in ptx) is epi.out_quant
    assert ("atom.acq_rel.gpu.global.add.u32" in ptx) is (cfg.split_k > 1)
    assert ".local" not in ptx
    if sass_tool.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) for the SASS check")
    sass, res = sass_tool.dump_sass(c)
    assert not re.search(r"\b(LDL|STL)\b", sass), "the kernel spills to local memory"
    regs = [int(r) for r in re.findall(r"REG:(\d+)", res)]
    assert regs and max(regs) <= 128 and "LOCAL:0" in res
    print(f"{cfg.name()} {epi.activation} {arch}: {max(regs)} registers")


def test_refused_specs_never_reach_the_compiler():
    t = get_template(TID)
    for cfg, epi, arch, why in [
        (C(), G1, "sm_100a", "targets"),
        (C(tile_rows=64), G1, "sm_120a", "even number of row tiles"),
        (C(), EpilogueSpec(alpha="scalar", activation="silu_mul", out_dtype=torch.bfloat16), "sm_120a", "out_quant"),
        (C(), EpilogueSpec(alpha="scalar", bias=True, out_dtype=torch.float32), "sm_120a", "bias"),
        (C(), EpilogueSpec(alpha="scalar", out_dtype=torch.bfloat16), "sm_120a", "fp32"),
    ]:
        st = t.can_implement(make_spec(TID, cfg, arch, epilogue=epi))
        assert not st and why in st.reason, (cfg, epi, st.reason)
