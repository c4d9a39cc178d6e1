"""Compile-only tests of the sm_100a grouped W4A4 MoE kernel (no GPU): configs the MoE policy emits
compile for sm_100a without spills and carry what the grouped design needs.

Per kernel: PTX -- one entry, the block-scaled FP4 ``tcgen05.mma`` (1-CTA), PDL variants wait
(``griddepcontrol.wait``) and issue no weight prefetch before it (the expert of a slot comes from the
routing), split-K variants the counter atomic, GEMM1 the fused requant's E2M1 / e4m3 conversions, no
local memory; SASS -- no LDL / STL anywhere.

Default run: a representative subset (GEMM1 tile_n 8 scalar alpha bf16; GEMM2 tile_n 8 split-K 2;
GEMM1 tile_n 64 split-K 4 per-row alpha fp16), 3-8 s each. ``NVGEMM_MOE_SWEEP=1`` compiles every
candidate the policy emits for the MoE presets at M = 1..256 on B200 (both GEMMs, per-expert and
per-row alpha, bf16 and fp16) and writes ``bench/results/sm100_moe_compile_sweep.txt``.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import functools
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.cli import sass_tool  # noqa: E402
from nvgemm.aot.abi import check_spec, get_template  # noqa: E402
from nvgemm.templates.sm100_moe.config import Sm100MoeConfig as C  # noqa: E402

pytestmark = pytest.mark.compile_only

TID = "sm100_moe_nvfp4"
SWEEP_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MMA = "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16"


def epi13(alpha="scalar", dt=torch.bfloat16):
    return EpilogueSpec(alpha=alpha, activation="silu_mul", out_dtype=dt, out_quant=True)


EPI2 = EpilogueSpec(alpha="scalar", out_dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def compiled(cfg, epi):
    spec = make_spec(TID, cfg, "sm_100a", epilogue=epi)
    st = check_spec(spec)
    assert st, st.reason
    return get_template(TID).compile(spec, keep_ptx=True)


def check_kernel(cfg, epi):
    comp = compiled(cfg, epi)
    ptx = comp.__ptx__
    assert ptx.count(".entry") == 1 and ".target sm_100a" in ptx
    assert MMA in ptx
    assert ("griddepcontrol.wait" in ptx) == cfg.pdl
    # GEMM1: no weight load of an unknown expert before the wait; GEMM2 (early_weights): its first work slot's
    # expert's weight and scale K tiles are TMA-loaded into the smem ring before it
    # GEMM1 with prefetch_next: L2 prefetches of GEMM2's weights, all after the wait (the experts come from
    # the work list)
    assert ("cp.async.bulk.prefetch.tensor" in ptx) == cfg.prefetch_next
    if cfg.prefetch_next:
        assert ptx.index("cp.async.bulk.prefetch.tensor") > ptx.index("griddepcontrol.wait")
    if cfg.pdl:
        assert (ptx.index("cp.async.bulk.tensor") < ptx.index("griddepcontrol.wait")) == cfg.early_weights
    assert bool(re.search(r"atom\.[a-z_.:]*add", ptx)) == (cfg.split_k > 1 or cfg.finalize)  # split-K, finalize
    assert ("cvt.rn.satfinite.e2m1x2.f32" in ptx) == epi.out_quant
    assert ".local" not in ptx
    if sass_tool.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) for the SASS check")
    sass = sass_tool.dump_sass(comp)[0]
    assert "arch = sm_100a" in sass
    ldl_stl = len(re.findall(r"\bLDL\b|\bSTL\b", sass))
    assert ldl_stl == 0, f"{ldl_stl} LDL/STL (spills) in {cfg.name()}"
    return ldl_stl


DEFAULT = [(C(tile_n=8), epi13()), (C(tile_n=8, split_k=2, early_weights=True), EPI2),
           (C(tile_n=64, split_k=4), epi13("vector", torch.float16)),
           # GEMM2 with the top-k finalize (what a one- or two-token call runs; out_dtype = the finalize's rounding)
           (C(tile_n=8, finalize=True, early_weights=True), EpilogueSpec(alpha="scalar", out_dtype=torch.bfloat16)),
           # GEMM1 prefetching GEMM2's weights into L2 (decode)
           (C(tile_n=8, prefetch_next=True), epi13())]


@pytest.mark.parametrize("cfg,epi", DEFAULT, ids=lambda v: v.name() if hasattr(v, "name") else v.activation)
def test_representative_configs_compile_without_spills(cfg, epi):
    check_kernel(cfg, epi)


def test_refused_specs_never_reach_the_compiler():
    """A gated GEMM1 without the requant output, a bias, a non-sm100 arch, GEMM2 with GEMM1's prefetch of the next
    GEMM's weights: refused with the reason."""
    tpl = get_template(TID)
    no_q = make_spec(TID, C(), "sm_100a", epilogue=EpilogueSpec(alpha="scalar", activation="silu_mul"))
    assert "out_quant" in tpl.can_implement(no_q).reason
    bias = make_spec(TID, C(), "sm_100a", epilogue=EpilogueSpec(alpha="scalar", bias=True))
    assert "bias" in tpl.can_implement(bias).reason
    sm90 = make_spec(TID, C(), "sm_90a", epilogue=EPI2)
    assert "sm_90a" in tpl.can_implement(sm90).reason
    pf_on_gemm2 = make_spec(TID, C(prefetch_next=True), "sm_100a", epilogue=EPI2)
    assert "prefetch_next is GEMM1's" in tpl.can_implement(pf_on_gemm2).reason
    with pytest.raises(ValueError, match="tile_n=128"):
        tpl.make_kernel(make_spec(TID, C(tile_n=128), "sm_100a", epilogue=EPI2))


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NVGEMM_MOE_SWEEP") != "1", reason="sweep: set NVGEMM_MOE_SWEEP=1")
def test_sweep_every_emitted_config():
    from nvgemm.templates.sm100_moe.policy import moe_candidates
    from nvgemm.templates.sm90_moe.policy import MOE_LAYERS

    rows = set()
    for shape in MOE_LAYERS.values():
        for m in SWEEP_MS:
            for c in moe_candidates(shape, m, "B200"):
                for alpha in ("scalar", "vector"):
                    for dt in (torch.bfloat16, torch.float16):
                        rows.add((c.config13, epi13(alpha, dt)))
                rows.add((c.config2, EPI2))
    rows = sorted(rows, key=lambda t: t[0].name() + str(t[1]))
    lines = [f"# sm100 grouped W4A4 MoE: every config the policy emits for {', '.join(MOE_LAYERS)} at M={SWEEP_MS} "
             "on B200 (GEMM1: per-expert / per-row alpha, bf16 / fp16), compiled for sm_100a (no GPU)",
             "# command: NVGEMM_MOE_SWEEP=1 NVGEMM_TEST_SLOW=1 python -m pytest -q tests/compile/test_sm100_moe_compile.py -k sweep",
             "# config | epilogue | LDL+STL"]
    for cfg, epi in rows:
        spills = check_kernel(cfg, epi)
        lines.append(f"{cfg.name()} | {epi.activation} alpha={epi.alpha} {epi.out_dtype}"
                     f"{' out_quant' if epi.out_quant else ''} | {spills}")
    out = Path(__file__).resolve().parents[2] / "bench" / "results" / "sm100_moe_compile_sweep.txt"
    out.write_text("\n".join(lines) + f"\n# {len(rows)} kernels, all without spills\n")
