"""Compile-only tests of the W4A16 ``mma`` decode kernel for the archs beside Hopper (no GPU): the real
kernel builds for sm_120a / sm_121a (GeForce / workstation Blackwell, DGX Spark), sm_89 (Ada), sm_86 and
sm_80 (Ampere), and per compiled artifact:

* PTX: ``.target`` is the arch; ``mma.sync.m16n8k16`` on the activation's type; weights streamed with
  ``cp.async.cg ... L2::cache_hint``; no ``.local``; PDL (``griddepcontrol``) exactly where the arch
  has it (sm_90+: here sm_120a / sm_121a) and never before sm_90; the bf16 scale multiply is
  ``mul.rn.bf16x2`` from sm_90 on and ``fma.rn.bf16x2`` with a -0 addend before (``mul.bf16x2`` is
  sm_90+, PTX ISA), so a pre-sm_90 PTX has no ``mul.bf16x2`` at all;
* SASS: the cubin's arch is the target, no ``LDL`` / ``STL`` anywhere (no ptxas spills), and the main
  loop (the backward branch around the stage's ``LDGSTS``) holds exactly ``row_tiles x chunks x 4 x
  m_groups`` ``HMMA.16816.F32``.

One or two kernels per arch (~5-20 s each on the shared 2-core machine); the sm_90a checks of the same
kernel are in test_sm90_compile.py, the per-arch compile sweep in ``bench/compile_sweep_sm90.py --arch``.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
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
from nvgemm.heuristics.perfmodel import sass as S  # noqa: E402
from nvgemm.templates.sm90_w4a16.config import ARCH_CAPS, Sm90W4A16Config as C, arch_problem  # noqa: E402

pytestmark = pytest.mark.compile_only

MM = "sm90_w4a16_mma"
SCALAR = EpilogueSpec(alpha="scalar")
FULL = EpilogueSpec(alpha="vector", bias=True, residual=True)


def _decode(arch: str) -> C:
    return C("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=ARCH_CAPS[arch].pdl)


#: (arch, config, epilogue, activation format): the decode config on every arch; on sm_120a and sm_89
#: also a split-K / two-M-group / gated case with the full epilogue, on sm_80 an fp16 one.
CASES = [
    ("sm_120a", _decode("sm_120a"), SCALAR, "bf16"),
    ("sm_120a", C("mma", tile_m=16, tile_n=128, tile_k=256, num_warps=4, stages=3, split_k=4, pdl=True),
     EpilogueSpec(alpha="vector", bias=True, residual=True, activation="silu_mul"), "bf16"),
    ("sm_121a", _decode("sm_121a"), SCALAR, "bf16"),
    ("sm_89", _decode("sm_89"), SCALAR, "bf16"),
    ("sm_89", C("mma", tile_m=16, tile_n=128, tile_k=256, num_warps=4, stages=3, split_k=4),
     EpilogueSpec(alpha="vector", bias=True, residual=True, activation="silu_mul"), "bf16"),
    ("sm_86", _decode("sm_86"), FULL, "bf16"),
    ("sm_80", _decode("sm_80"), SCALAR, "bf16"),
    ("sm_80", C("mma", tile_m=32, tile_n=64, tile_k=256, num_warps=2, stages=3, split_k=2),
     EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.float32), "fp16"),
]


def _id(case) -> str:
    arch, cfg, epi, x = case
    return f"{arch}-{cfg.name().split('_mma_')[1]}-{epi.activation}-{x}"


@functools.lru_cache(maxsize=None)
def compiled(arch: str, cfg: C, epi: EpilogueSpec, x: str):
    assert arch_problem(cfg, arch) is None
    spec = make_spec(MM, cfg, arch, epilogue=epi, a_format=x)
    st = check_spec(spec)
    assert st, st.reason
    return get_template(MM).compile(spec, keep_ptx=True)


@functools.lru_cache(maxsize=None)
def sass_of(arch: str, cfg: C, epi: EpilogueSpec, x: str) -> str:
    if sass_tool.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) for the SASS check")
    return sass_tool.dump_sass(compiled(arch, cfg, epi, x))[0]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_ptx_targets_the_arch_with_its_instruction_set(case):
    arch, cfg, epi, x = case
    ptx = compiled(arch, cfg, epi, x).__ptx__
    kind = "bf16" if x == "bf16" else "f16"
    assert re.search(rf"^\.target {arch}\b", ptx, re.M), f"PTX is not for {arch}"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx
    assert "cp.async.cg.shared.global.L2::cache_hint" in ptx
    assert ".local" not in ptx, "register arrays must not go to local memory"
    caps = ARCH_CAPS[arch]
    assert caps.pdl == arch.startswith("sm_12")  # sm_90+ of the archs tested here
    assert ("griddepcontrol.wait" in ptx) == cfg.pdl == caps.pdl
    assert ("griddepcontrol.launch_dependents" in ptx) == caps.pdl
    if not caps.pdl:
        assert "griddepcontrol" not in ptx
    if x == "bf16":
        # the scale multiply: mul.bf16x2 from sm_90 on, fma.bf16x2 with a -0 addend before
        assert ("mul.rn.bf16x2" in ptx) == caps.bf16_mul
        assert ("fma.rn.bf16x2" in ptx) == (not caps.bf16_mul)
    else:
        assert "mul.rn.f16x2" in ptx
    if not caps.bf16_mul:
        assert re.search(r"\bmul(\.\w+)*\.bf16x2\b", ptx) is None, "mul.bf16x2 is sm_90+"
    assert ("atom.acq_rel.gpu.global.add.u32" in ptx) == (cfg.split_k > 1)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_sass_is_spill_free_with_the_tensor_core_loop(case):
    arch, cfg, epi, x = case
    sass = sass_of(arch, cfg, epi, x)
    assert re.search(rf"arch = {arch}\b", sass), f"cubin is not {arch}"
    spills = re.findall(r"\b(?:LDL|STL)\b[.\w]*", sass)
    assert not spills, f"{len(spills)} local-memory instructions (ptxas spills): {sorted(set(spills))}"
    fn = S.find_function(S.parse_sass(sass), r"^LDGSTS")
    loop = S.main_loop(fn, r"^LDGSTS")
    assert loop is not None, "no main loop found"
    body = S.body(fn, loop)
    kind = ".BF16" if x == "bf16" else ""
    n_hmma = sum(1 for i in S.counted(body) if i.opcode.startswith("HMMA.16816.F32" + kind))
    assert n_hmma == cfg.row_tiles * cfg.chunks_per_stage * 4 * cfg.m_groups
