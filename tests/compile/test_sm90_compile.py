"""Compile-only tests of the sm_90a W4A16 kernels (no GPU): they build for sm_90a across the
epilogue space, and their PTX / SASS keep the properties the performance depends on, so a
regression fails CI.

mma (decode) family, per compiled kernel:

* PTX: weights streamed with ``cp.async.cg ... L2::cache_hint`` under an L2 **evict-first** policy
  (``createpolicy.fractional.L2::evict_first``), activations with zero-filling ``cp.async.ca``, the
  ring waited with ``cp.async.wait_group stages-2``; ``mma.sync.m16n8k16`` on bf16/f16 operands made
  by packed multiplies (``mul.rn.bf16x2`` / ``f16x2``); PDL variants ``griddepcontrol.wait`` /
  ``launch_dependents``; split-K variants the counter atomic; no local memory;
* SASS: the main loop (the backward branch around the HMMAs) holds the stage's ``LDGSTS`` async
  copies, exactly ``row_tiles x chunks x 4 x m_groups`` ``HMMA.16816.F32``, the packed multiplies
  with the broadcast operand selector (no PRMT per multiply), no LDL/STL anywhere, and at most
  :data:`MAX_INSTR_PER_ELEM` SASS instructions per weight element (measured values in the table;
  the integer decode is 8 instructions per 8 elements, the minimum of the linear layouts
  bench/decode_layout_search.py searches).

wgmma family (register-A WGMMA, cp.async ring): PTX -- one ``wgmma.mma_async.m64n{tile_m}k16`` per
row block and k-step with four A registers, ``wgmma.wait_group 1`` (one k-step in flight while the
next decodes), the proxy fence, evict-first weight copies and 4-byte zero-filling activation
copies, ``cp.async.wait_group stages-3``; SASS -- ``HGMMA`` with a register A operand, pipelined
(``WARPGROUP.DEPBAR.LE gsb0, 0x1``), no LDL/STL anywhere, the instruction budget per element;
and its B descriptor's constant is the one CuTe builds for the same swizzled K-major operand.

The CI subset is ~10 kernels at 3-8 s each; ``python bench/compile_sweep_sm90.py`` compiles every
config the policy emits for the Llama shapes.
"""

import os

# Pin the target before cutlass is imported anywhere in this process (compiles also pass
# --gpu-arch sm_90a explicitly); keep DSL dumps out of the working tree.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import functools
import re

import pytest
import torch

pytest.importorskip("cutlass")

from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.heuristics.perfmodel import sass as S  # noqa: E402
from nvgemm.cli import sass_tool  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.templates.sm90_w4a16.backend import pick_config  # noqa: E402
from nvgemm.aot.abi import check_spec, get_template  # noqa: E402
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config as C  # noqa: E402

pytestmark = pytest.mark.compile_only

MM = "sm90_w4a16_mma"
WG = "sm90_w4a16_wgmma"
SCALAR = EpilogueSpec(alpha="scalar")

#: main-loop SASS instructions per weight element allowed per (tile_m, row tiles per warp, chunks
#: per stage), measured (cutlass-dsl 4.8.1, ptxas 13.0; 1.957, 2.195, 2.129, 2.535, 1.877, 2.547) + ~2 %
#: for ptxas noise; 8 tokens with 2+ row tiles and 4 chunks per stage: at most 2.0 (issue 14).
#: Per element: the decode 1.0 and the packed scale multiply 0.5; the HMMAs and B-fragment loads
#: grow with tile_m (0.125 + 0.06 per 8 tokens); the per-stage copies, scale words and loop control
#: shrink with more row tiles per warp and longer stages.
MAX_INSTR_PER_ELEM = {(8, 2, 4): 2.00, (8, 2, 2): 2.24, (16, 2, 4): 2.17, (32, 2, 4): 2.59, (8, 4, 4): 1.92,
                      (8, 1, 2): 2.60}


def _spec(tid: str, cfg: C, epi: EpilogueSpec = SCALAR, x: str = "bf16"):
    return make_spec(tid, cfg, "sm_90a", epilogue=epi, a_format=x)


@functools.lru_cache(maxsize=None)
def compiled(tid: str, cfg: C, epi: EpilogueSpec = SCALAR, x: str = "bf16"):
    spec = _spec(tid, cfg, epi, x)
    st = check_spec(spec)
    assert st, st.reason
    return get_template(tid).compile(spec, keep_ptx=True)


def ptx_of(tid, cfg, epi=SCALAR, x="bf16") -> str:
    ptx = compiled(tid, cfg, epi, x).__ptx__
    assert ptx and ".target sm_90a" in ptx
    return ptx


@functools.lru_cache(maxsize=None)
def sass_of(tid, cfg, epi=SCALAR, x="bf16") -> str:
    if sass_tool.find_cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) for the SASS check")
    return sass_tool.dump_sass(compiled(tid, cfg, epi, x))[0]


def main_loop(sass: str, stream_load: str):
    fn = S.find_function(S.parse_sass(sass), stream_load)
    loop = S.main_loop(fn, stream_load)
    assert loop is not None, "no main loop found"
    return S.body(fn, loop)


def hist(body) -> dict:
    """Full opcodes (with modifiers) -> count, over the counted instructions of ``body``."""
    out: dict = {}
    for i in S.counted(body):
        out[i.opcode] = out.get(i.opcode, 0) + 1
    return out


def count(body, pattern: str) -> int:
    return S.count_matching(body, pattern)


# --------------------------------------------------------------------------- mma (decode) family

MMA_FAST = [
    (C("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True), SCALAR, "bf16"),
    (C("mma", tile_m=8, tile_n=64, tile_k=128, num_warps=2, stages=3),
     EpilogueSpec(alpha="vector", bias=True), "bf16"),
    (C("mma", tile_m=16, tile_n=128, tile_k=256, num_warps=4, stages=4, split_k=3, pdl=True),
     EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True), "bf16"),
    (C("mma", tile_m=32, tile_n=64, tile_k=256, num_warps=2, stages=3, split_k=2),
     EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.float32), "fp16"),
    (C("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=2, stages=4),
     EpilogueSpec(alpha="scalar", activation="silu", out_dtype=torch.float16), "fp16"),
    # fewer activation pieces per stage (8 x 16) than threads (256): no branch around the copies
    (C("mma", tile_m=8, tile_n=128, tile_k=128, num_warps=8, stages=3), SCALAR, "bf16"),
]


@pytest.mark.parametrize("cfg,epi,x", MMA_FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_mma_ptx_streams_with_async_copies_and_evict_first(cfg, epi, x):
    ptx = ptx_of(MM, cfg, epi, x)
    kind = "bf16" if x == "bf16" else "f16"
    assert "createpolicy.fractional.L2::evict_first" in ptx
    assert "cp.async.cg.shared.global.L2::cache_hint" in ptx  # weights: L2 only, evict-first
    assert re.search(r"cp\.async\.ca\.shared\.global\.L2::cache_hint \[[^]]+\], \[[^]]+\], (4|8),", ptx)  # scales
    assert re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 16, %r", ptx)  # activations, zfill
    assert f"cp.async.wait_group {cfg.stages - 2};" in ptx
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx
    assert f"mul.rn.{kind}x2" in ptx
    assert ("griddepcontrol.wait" in ptx) == cfg.pdl and ("griddepcontrol.launch_dependents" in ptx) == cfg.pdl
    assert ("atom.acq_rel.gpu.global.add.u32" in ptx) == (cfg.split_k > 1)
    assert ".local" not in ptx, "register arrays must not go to local memory"
    assert ptx.count(".entry") == 1  # one kernel per call: split-K reduces in-kernel


@pytest.mark.parametrize("cfg,epi,x", MMA_FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_mma_sass_main_loop(cfg, epi, x):
    sass = sass_of(MM, cfg, epi, x)
    assert "arch = sm_90a" in sass
    assert re.search(r"\bLDL\b|\bSTL\b", sass) is None, "spills"
    body = main_loop(sass, r"^LDGSTS")
    h = hist(body)
    kind = "BF16" if x == "bf16" else ""
    n_hmma = sum(v for op, v in h.items() if op.startswith("HMMA.16816.F32" + ("." + kind if kind else "")))
    assert n_hmma == cfg.row_tiles * cfg.chunks_per_stage * 4 * cfg.m_groups
    # async copies of the stage: one 16-byte LDGSTS per (row tile, chunk) of weights, one per row
    # tile of scales, and this thread's activation pieces
    assert count(body, r"^LDGSTS") >= cfg.row_tiles * (cfg.chunks_per_stage + 1)
    assert count(body, r"^DEPBAR") >= 1 and count(body, r"^BAR\.SYNC") == 1
    # one packed multiply per A register, the scale broadcast folded into the operand selector
    n_hmul = sum(v for op, v in h.items() if op.startswith("HMUL2"))
    assert n_hmul == cfg.row_tiles * cfg.chunks_per_stage * 16
    assert h.get("PRMT", 0) <= cfg.row_tiles * cfg.chunks_per_stage
    elems = cfg.row_tiles * cfg.chunks_per_stage * 32
    ipe = len(S.counted(body)) / elems
    assert ipe <= MAX_INSTR_PER_ELEM[(cfg.tile_m, cfg.row_tiles, cfg.chunks_per_stage)], (
        f"{ipe:.3f} instructions per weight element")


@pytest.mark.parametrize("x", ["bf16", "fp16"])
def test_mma_decode_is_eight_integer_instructions_per_word(x):
    """Per 32-bit weight word (8 elements): 4 rotations (SHF.R.W) and 4 masks / masked XORs (LOP3)
    -- the linear layout's minimum (bench/decode_layout_search.py); plus one mask per scale pair."""
    cfg = MMA_FAST[0][0]
    body = main_loop(sass_of(MM, cfg, SCALAR, x), r"^LDGSTS")
    words = cfg.row_tiles * cfg.chunks_per_stage * 4
    h = hist(body)
    assert h.get("SHF.R.W.U32", 0) == 4 * words
    lop3 = sum(v for op, v in h.items() if op.startswith("LOP3"))
    assert 4 * words <= lop3 <= 4 * words + cfg.row_tiles * cfg.chunks_per_stage  # + scale-pair masks


@pytest.mark.parametrize("n,k", [(28672, 4096), (4096, 14336), (57344, 8192)])
@pytest.mark.parametrize("m", [1, 16])
def test_policy_first_candidate_compiles(n, k, m):
    cfg = pick_config(m, n, k, torch.bfloat16, "none", 132)
    assert cfg.family == "mma"
    assert "cp.async.cg.shared.global.L2::cache_hint" in ptx_of(MM, cfg)


@pytest.mark.parametrize(
    "cfg,why",
    [
        (C("mma", tile_m=4), "tile_m"),
        (C("mma", tile_n=48), "row tiles"),
        (C("mma", tile_k=64), "chunks per stage"),
        (C("mma", stages=1), "stages"),
        (C("wgmma", tile_m=64, tile_n=256, tile_k=128, num_warps=8, stages=4), "mma family"),
    ],
)
def test_rejected_configs_never_compile(cfg, why):
    st = check_spec(_spec(MM, cfg))
    assert not st and why in st.reason
    with pytest.raises(ValueError, match="cannot be implemented"):
        get_template(MM).compile(_spec(MM, cfg))


def test_fp32_activations_and_odd_gated_tiles_rejected():
    assert "bf16 or fp16" in check_spec(_spec(MM, C(), x="fp32")).reason
    cfg = C("mma", tile_m=8, tile_n=64, tile_k=256, num_warps=4, stages=3)  # 1 row tile per warp
    assert "even number of row tiles" in check_spec(_spec(MM, cfg, EpilogueSpec(alpha="scalar",
                                                                                  activation="silu_mul"))).reason


# --------------------------------------------------------------------------- WGMMA family

WG_FAST = [
    (C("wgmma", tile_m=128, tile_n=256, tile_k=128, num_warps=8, stages=4, pdl=True), SCALAR, "bf16"),
    (C("wgmma", tile_m=64, tile_n=256, tile_k=128, num_warps=8, stages=4, split_k=3, pdl=True),
     EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True), "bf16"),
    (C("wgmma", tile_m=256, tile_n=128, tile_k=128, num_warps=8, stages=3),
     EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.float16), "fp16"),
    (C("wgmma", tile_m=32, tile_n=128, tile_k=256, num_warps=4, stages=3, split_k=2, pdl=True),
     EpilogueSpec(alpha="scalar", out_dtype=torch.float32), "bf16"),
]

#: main-loop SASS instructions per weight element allowed per (tile_m, row blocks, chunks per
#: stage, warps), measured (cutlass-dsl 4.8.1, ptxas 13.0: 2.898, 3.070, 4.938, 2.441) + ~2 %: the
#: decode and scale multiply (1.5 per element), the WGMMAs (1/8), plus the 4-byte activation
#: copies (tile_m x 32 x chunks / threads per stage, 2-3 instructions each), which grow with
#: tile_m per row of the CTA; at tile_m >= 128 the tensor cores, not issue, bound the kernel.
WG_MAX_INSTR_PER_ELEM = {(128, 2, 2, 8): 2.96, (64, 2, 2, 8): 3.13, (256, 1, 2, 8): 5.04, (32, 2, 4, 4): 2.49}


@pytest.mark.parametrize("cfg,epi,x", WG_FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_wgmma_ptx_register_a_pipelined(cfg, epi, x):
    ptx = ptx_of(WG, cfg, epi, x)
    kind = "bf16" if x == "bf16" else "f16"
    n_wg = len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.tile_m}k16\.f32\.{kind}\.{kind}", ptx))
    # one WGMMA per row block and k-step of the stage (register A: {4 regs}, then the B descriptor)
    assert n_wg == cfg.row_tiles * cfg.chunks_per_stage * 4, n_wg
    assert re.search(r"wgmma\.mma_async[^;]*\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+, p, 1, 1, 0;", ptx)
    assert "wgmma.fence.sync.aligned" in ptx and "wgmma.commit_group.sync.aligned" in ptx
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)  # k-step s + 1 decodes while s runs
    assert "fence.proxy.async.shared::cta" in ptx  # cp.async-written smem, read by the tensor cores
    assert "createpolicy.fractional.L2::evict_first" in ptx
    assert "cp.async.cg.shared.global.L2::cache_hint" in ptx  # weights
    assert re.search(r"cp\.async\.ca\.shared\.global \[[^]]+\], \[[^]]+\], 4, %r", ptx)  # activation pairs, zfill
    assert f"cp.async.wait_group {cfg.stages - 3};" in ptx  # stages - 2 in flight ahead
    assert f"mul.rn.{kind}x2" in ptx  # the mma family's exact packed decode
    assert ("griddepcontrol.wait" in ptx) == cfg.pdl
    assert ("atom.acq_rel.gpu.global.add.u32" in ptx) == (cfg.split_k > 1)
    assert ".local" not in ptx
    assert ptx.count(".entry") == 1


@pytest.mark.parametrize("cfg,epi,x", WG_FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_wgmma_sass_main_loop(cfg, epi, x):
    """HGMMA with a register A operand in the cp.async main loop, pipelined one k-step deep
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``: ptxas did not serialise the WGMMAs), no spills anywhere,
    and the instruction budget per weight element."""
    sass = sass_of(WG, cfg, epi, x)
    assert re.search(r"\bLDL\b|\bSTL\b", sass) is None, "spills"
    body = main_loop(sass, r"^LDGSTS")
    h = hist(body)
    kind = r"\.BF16" if x == "bf16" else ""  # fp16 operands: no type suffix
    hg = [i for i in S.counted(body) if i.base == "HGMMA"]
    assert len(hg) == cfg.row_tiles * cfg.chunks_per_stage * 4
    # the SASS parser splits the mnemonic at the lower-case "x": match the whole text; A from registers
    pat = re.compile(rf"^HGMMA\.64 ?x{cfg.tile_m}x16\.F32{kind} R\d+, R\d+, gdesc\[")
    assert all(pat.match(i.text) for i in hg), {i.text for i in hg}
    assert h.get("WARPGROUP.DEPBAR.LE", 0) == cfg.chunks_per_stage * 4
    assert "gsb0, 0x1" in " ".join(i.args for i in S.counted(body) if i.opcode == "WARPGROUP.DEPBAR.LE")
    assert h.get("WARPGROUP.ARRIVE", 0) == cfg.chunks_per_stage * 4
    assert count(body, r"^DEPBAR") >= 1 and count(body, r"^BAR\.SYNC") == 1
    assert count(body, r"^FENCE\.VIEW\.ASYNC\.S") == 1
    n_hmul = sum(v for op, v in h.items() if op.startswith("HMUL2"))
    assert n_hmul == cfg.row_tiles * cfg.chunks_per_stage * 16
    # async copies: weights (16 B), scale words, and tile_m x 32 activation pairs per chunk
    n_act = cfg.tile_m * 32 * cfg.chunks_per_stage // cfg.threads
    assert count(body, r"^LDGSTS") >= cfg.row_tiles * (cfg.chunks_per_stage + 1) + n_act
    elems = cfg.row_tiles * cfg.chunks_per_stage * 32
    ipe = len(S.counted(body)) / elems
    key = (cfg.tile_m, cfg.row_tiles, cfg.chunks_per_stage, cfg.num_warps)
    assert ipe <= WG_MAX_INSTR_PER_ELEM[key], f"{ipe:.3f} instructions per weight element"


def _ptxas_info(ptx: str) -> str | None:
    """``ptxas -v`` output for ``ptx`` from the first ptxas that accepts its PTX version (the CUDA
    toolkit's, else the newer one Triton ships); None if none does."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    cands = [shutil.which("ptxas")]
    try:
        import triton

        b = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        cands += [str(b / "ptxas-blackwell"), str(b / "ptxas")]
    except ImportError:
        pass
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.ptx"
        f.write_text(ptx)
        for exe in cands:
            if not exe or not Path(exe).exists():
                continue
            r = subprocess.run([exe, "-arch=sm_90a", "-v", str(f), "-o", str(Path(d) / "k.cubin")],
                               capture_output=True, text=True)
            if r.returncode == 0:
                return r.stdout + r.stderr
    return None


@pytest.mark.parametrize("cfg,epi,x", WG_FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_wgmma_not_serialised_by_ptxas(cfg, epi, x):
    """ptxas's own verdict on the WGMMA pipeline: no ``C7515`` ("wgmma.mma_async instructions are
    serialized ...", e.g. when an instruction writes accumulator registers inside a pipeline stage)."""
    info = _ptxas_info(ptx_of(WG, cfg, epi, x))
    if info is None:
        pytest.skip("no ptxas that accepts this PTX version")
    assert "C7515" not in info and "serialized" not in info, info


def test_wgmma_descriptor_is_cutes_k_major_sw128():
    """The hand-built B descriptor's constant bits equal those CuTe builds for a K-major operand with
    the 128-byte swizzle (layout type, 1024-byte stride, leading-offset field): compile CuTe's own
    SS WGMMA for such a tile and find the same constant in its PTX."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.cute.nvgpu import OperandMajorMode
    from cutlass.tensor_utils import LayoutEnum

    from nvgemm.templates.sm90_w4a16.common import WGMMA_DESC_SW128_KMAJOR

    @cute.kernel
    def k(tiled_mma: cute.TiledMma, sB_layout: cute.ComposedLayout, sA_layout: cute.ComposedLayout):
        smem = cutlass.memory.SmemAllocator()
        sA = smem.allocate_tensor(cutlass.BFloat16, sA_layout.outer, 1024, swizzle=sA_layout.inner)
        sB = smem.allocate_tensor(cutlass.BFloat16, sB_layout.outer, 1024, swizzle=sB_layout.inner)
        tidx, _, _ = cute.arch.thread_idx()
        thr = tiled_mma.get_slice(tidx)
        acc = cute.make_rmem_tensor(thr.partition_shape_C((64, 128)), cutlass.Float32)
        acc.fill(0.0)
        tCrA = tiled_mma.make_fragment_A(thr.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr.partition_B(sB))
        cute.gemm(tiled_mma, acc, tCrA[(None, None, 0, 0)], tCrB[(None, None, 0, 0)], acc)

    @cute.jit
    def host():
        tm = sm90_utils.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, OperandMajorMode.K,
                                               OperandMajorMode.K, cutlass.Float32, (1, 1, 1), (64, 128))
        sa = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (64, 128, 64), cutlass.BFloat16, 1)
        sb = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (64, 128, 64), cutlass.BFloat16, 1)
        k(tm, sb, sa).launch(grid=(1, 1, 1), block=(128, 1, 1))

    ptx = cute.compile(host, options="--gpu-arch sm_90a --keep-ptx").__ptx__
    assert str(WGMMA_DESC_SW128_KMAJOR) in ptx, "CuTe's K-major SW128 descriptor constant differs"


@pytest.mark.parametrize(
    "cfg,why",
    [
        (C("wgmma", tile_m=44, tile_n=128, tile_k=128, num_warps=4, stages=4), "tile_m"),
        (C("wgmma", tile_m=128, tile_n=192, tile_k=128, num_warps=4, stages=4), "tile_n"),
        (C("wgmma", tile_m=128, tile_n=128, tile_k=64, num_warps=4, stages=4), "tile_k"),
        (C("wgmma", tile_m=128, tile_n=128, tile_k=128, num_warps=2, stages=4), "warpgroups"),
        (C("wgmma", tile_m=128, tile_n=128, tile_k=128, num_warps=4, stages=2), "stages"),
        (C("wgmma", tile_m=256, tile_n=256, tile_k=128, num_warps=8, stages=3), "accumulator"),
        (C("wgmma", tile_m=256, tile_n=128, tile_k=256, num_warps=8, stages=4), "shared memory"),
    ],
)
def test_wgmma_rejected_configs(cfg, why):
    st = check_spec(_spec(WG, cfg))
    assert not st and why in st.reason

