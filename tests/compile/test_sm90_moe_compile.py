"""Compile-only tests of the sm_90a grouped MoE kernel (no GPU): every config the MoE policy emits
compiles for sm_90a without spills, and its SASS main loop is the dense ``mma`` kernel's (the
performance model charges the grouped GEMM with the dense kernel's SASS facts).

Per kernel: PTX -- one entry, evict-first weight stream, ``mma.sync.m16n8k16``, PDL variants wait
(``griddepcontrol.wait``) before the work list is read, split-K variants the counter atomic, no
local memory; SASS -- no LDL / STL anywhere, and the main loop (the backward branch around the
HMMAs) holds exactly ``row_tiles x chunks x 4 x m_groups`` ``HMMA.16816.F32`` and one packed
multiply per A register, as the dense kernel.

Default run: the policy's first (GEMM1, GEMM2) pair for each MoE layer at M = 1 on H200 (7 distinct
kernels) plus the per-row-alpha and fp16 variants, 3-8 s each. ``NVGEMM_MOE_SWEEP=1`` compiles every candidate the policy emits for the
presets at M = 1..256 and writes ``bench/results/sm90_moe_compile_sweep.txt``.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import functools
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.templates.sm90_moe.policy import MOE_LAYERS, moe_candidates  # noqa: E402
from nvgemm.templates.sm90_moe.config import FUSED_FINALIZE_MAX_TOKENS  # noqa: E402
from nvgemm.heuristics.perfmodel import sass as S  # noqa: E402
from nvgemm.cli import sass_tool  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.aot.abi import check_spec, get_template  # noqa: E402

pytestmark = pytest.mark.compile_only

TID = "sm90_moe_mma"
EPI13 = EpilogueSpec(alpha="scalar", activation="silu_mul", out_dtype=torch.bfloat16)
EPI13_ROW = EpilogueSpec(alpha="vector", activation="silu_mul", out_dtype=torch.bfloat16)
EPI2 = EpilogueSpec(alpha="scalar", out_dtype=torch.float32)
SWEEP_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@functools.lru_cache(maxsize=None)
def compiled(cfg, epi, x="bf16"):
    spec = make_spec(TID, cfg, "sm_90a", epilogue=epi, a_format=x)
    st = check_spec(spec)
    assert st, st.reason
    return get_template(TID).compile(spec, keep_ptx=True)


def _policy_pairs(ms):
    out = []
    for shape in MOE_LAYERS.values():
        for m in ms:
            for c in moe_candidates(shape, m, "H200", max_candidates=1):
                # what moe_forward runs at M tokens: one token without a work list, the finalize in GEMM2 up to
                # FUSED_FINALIZE_MAX_TOKENS
                out.append((replace(c.config13, direct=m == 1), EPI13))
                out.append((replace(c.config2, direct=m == 1, finalize=m <= FUSED_FINALIZE_MAX_TOKENS,
                                    early_weights=c.config2.pdl), EPI2))
    return sorted(set(out), key=lambda t: t[0].name() + str(t[1]))


def check_kernel(cfg, epi, x="bf16"):
    comp = compiled(cfg, epi, x)
    ptx = comp.__ptx__
    kind = "bf16" if x == "bf16" else "f16"
    assert ptx.count(".entry") == 1
    assert "createpolicy.fractional.L2::evict_first" in ptx
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx
    assert ("griddepcontrol.wait" in ptx) == cfg.pdl
    if cfg.pdl and not cfg.early_weights:  # GEMM1: the work list comes from its producer: wait before reading it
        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")
    if cfg.early_weights:  # GEMM2: its first weight stages (cp.async) are issued before the wait
        assert ptx.index("cp.async.cg.shared.global") < ptx.index("griddepcontrol.wait")
    assert ("atom.acq_rel.gpu.global.add.u32" in ptx) == (cfg.split_k > 1 or cfg.finalize)  # the counters
    assert ".local" not in ptx
    if sass_tool.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) for the SASS check")
    sass = sass_tool.dump_sass(comp)[0]
    assert "arch = sm_90a" in sass
    ldl_stl = len(re.findall(r"\bLDL\b|\bSTL\b", sass))
    assert ldl_stl == 0, f"{ldl_stl} LDL/STL (spills) in {cfg.name()}"
    fn = S.find_function(S.parse_sass(sass), r"^LDGSTS")
    loop = S.main_loop(fn, r"^LDGSTS")
    assert loop is not None, "no main loop"
    body = S.body(fn, loop)
    hmma = S.count_matching(body, r"^HMMA\.16816\.F32")
    d = cfg.dense()
    assert hmma == d.row_tiles * d.chunks_per_stage * 4 * d.m_groups
    assert S.count_matching(body, r"^HMUL2") == d.row_tiles * d.chunks_per_stage * 16
    return ldl_stl, hmma, len(S.counted(body))


DEFAULT = _policy_pairs((1,))


@pytest.mark.parametrize("cfg,epi", DEFAULT, ids=lambda v: v.name() if hasattr(v, "name") else v.activation)
def test_policy_configs_compile_without_spills(cfg, epi):
    check_kernel(cfg, epi)


def test_row_alpha_and_fp16_variants():
    """Per-row alpha (unequal gate/up weight_scale_2) and fp16 activations of the first picks."""
    check_kernel(next(c for c, e in DEFAULT if e == EPI13), EPI13_ROW)
    check_kernel(next(c for c, e in DEFAULT if e == EPI2), EPI2, "fp16")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NVGEMM_MOE_SWEEP") != "1", reason="sweep: set NVGEMM_MOE_SWEEP=1")
def test_sweep_every_emitted_config():
    rows = []
    for shape in MOE_LAYERS.values():
        for m in SWEEP_MS:
            for c in moe_candidates(shape, m, "H200"):
                rows.append((c.config13, EPI13))
                rows.append((c.config2, EPI2))
    rows = sorted(set(rows), key=lambda t: t[0].name() + str(t[1]))
    lines = [f"# sm90 grouped MoE: every config the policy emits for {', '.join(MOE_LAYERS)} at M={SWEEP_MS} "
             "on H200, compiled for sm_90a (no GPU)",
             "# command: NVGEMM_MOE_SWEEP=1 python -m pytest -q tests/compile/test_sm90_moe_compile.py -k sweep",
             "# config | epilogue | LDL+STL | main-loop HMMA | main-loop instructions"]
    for cfg, epi in rows:
        spills, hmma, n = check_kernel(cfg, epi)
        lines.append(f"{cfg.name()} | {epi.activation} {epi.out_dtype} | {spills} | {hmma} | {n}")
    out = Path(__file__).resolve().parents[2] / "bench" / "results" / "sm90_moe_compile_sweep.txt"
    out.write_text("\n".join(lines) + f"\n# {len(rows)} kernels, all without spills\n")
