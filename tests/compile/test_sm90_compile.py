"""Compile-only tests of the sm_90a W4A16 gemv kernel (no GPU).

* representative configs compile for sm_90a across the epilogue space (scalar/vector alpha, bias,
  silu / gelu_tanh / silu_mul, residual, bf16/fp16/fp32 out, split-K with its reduce kernel);
* the PTX streams the weight with 16-byte ``ld.global.nc.L1::no_allocate.v4`` loads (one per weight
  row of a register pass), decodes scales with ``cvt.rn.f16x2.e4m3x2`` and uses no local memory;
* the SASS (cuobjdump, when available) has ``LDG.E...128`` weight loads and no LDL/STL spills;
* the first gemv candidate the policy emits for Llama-3.1-8B / 3.3-70B decode shapes compiles;
* configs the predicates reject never reach the compiler.

The CI subset is ~8 kernels at 2-8 s each; every config the policy emits over the model shapes is
compiled by ``python bench/compile_sweep_sm90.py``.
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
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass")

from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.runtime.compile_spec import make_spec  # noqa: E402
from nvgemm.runtime.sm90_launch import pick_config  # noqa: E402
from nvgemm.templates.registry import check_spec, get_template  # noqa: E402
from nvgemm.templates.sm90_config import Sm90W4A16Config as C  # noqa: E402
from nvgemm.templates.sm90_config import gemv_passes  # noqa: E402

pytestmark = pytest.mark.compile_only

TID = "sm90_w4a16_gemv"
WEIGHT_LD = "ld.global.nc.L1::no_allocate.v4.b32"
SCALAR = EpilogueSpec(alpha="scalar")


def _spec(tid: str, cfg: C, epi: EpilogueSpec = SCALAR, x: str = "bf16"):
    return make_spec(tid, cfg, "sm_90a", epilogue=epi, a_format=x)


@functools.lru_cache(maxsize=None)
def compiled(tid: str, cfg: C, epi: EpilogueSpec = SCALAR, x: str = "bf16"):
    spec = _spec(tid, cfg, epi, x)
    st = check_spec(spec)
    assert st, st.reason
    return get_template(tid).compile(spec, keep_ptx=True)


def ptx_of(tid: str, cfg: C, epi: EpilogueSpec = SCALAR, x: str = "bf16") -> str:
    ptx = compiled(tid, cfg, epi, x).__ptx__
    assert ptx and ".target sm_90a" in ptx
    return ptx


def _cuobjdump() -> str | None:
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(p) if p.exists() else None
    except ImportError:
        return None


def sass_of(tid: str, cfg: C, epi: EpilogueSpec = SCALAR, x: str = "bf16") -> str:
    exe = _cuobjdump()
    if exe is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton's bundled copy) for the SASS check")
    from nvgemm.templates.sm90_w4a16_gemv import embedded_cubin

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.fatbin"
        f.write_bytes(embedded_cubin(compiled(tid, cfg, epi, x)))
        return subprocess.run([exe, "--dump-sass", str(f)], check=True, capture_output=True, text=True).stdout


def _main_kernel_ptx(ptx: str) -> str:
    """The PTX of the main (streaming) kernel: the .entry whose body has the weight loads."""
    entries = re.split(r"(?=\.visible \.entry|\.entry )", ptx)
    main = [e for e in entries if WEIGHT_LD in e]
    assert len(main) == 1
    return main[0]


FAST = [
    (C(tile_m=1, tile_n=8, tile_k=4096, num_warps=4), SCALAR, "bf16"),
    (C(tile_m=1, tile_n=16, tile_k=8192, num_warps=4), EpilogueSpec(alpha="vector", bias=True), "bf16"),
    (C(tile_m=2, tile_n=8, tile_k=2048, num_warps=2, split_k=2),
     EpilogueSpec(alpha="scalar", activation="silu", out_dtype=torch.float16), "fp16"),
    (C(tile_m=4, tile_n=16, tile_k=4096, num_warps=4),
     EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True), "bf16"),
    (C(tile_m=8, tile_n=8, tile_k=8192, num_warps=8),
     EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.float32), "bf16"),
]


@pytest.mark.parametrize("cfg,epi,x", FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_compiles_and_streams_16_byte_weight_loads(cfg, epi, x):
    ptx = ptx_of(TID, cfg, epi, x)
    body = _main_kernel_ptx(ptx)
    rp, _ = gemv_passes(cfg)
    # one 16-byte weight load per (row of a pass, vector per thread) in the unrolled step
    assert body.count(WEIGHT_LD) == rp * cfg.vec_per_thread
    assert "cvt.rn.f16x2.e4m3x2" in body  # block scales decoded in registers
    assert "ld.global.nc.v4.b32" in body  # 16-byte activation loads
    assert ".local" not in ptx, "register arrays must not go to local memory"
    if cfg.split_k > 1:
        assert ptx.count(".entry") == 2  # + the fixed-order split-K reduce kernel
    else:
        assert ptx.count(".entry") == 1


def test_sass_has_128_bit_loads_and_no_spills():
    cfg, epi, x = FAST[0]
    sass = sass_of(TID, cfg, epi, x)
    assert "arch = sm_90a" in sass
    assert len(re.findall(r"LDG\.E\.NA\.128\.CONSTANT", sass)) == gemv_passes(cfg)[0] * cfg.vec_per_thread
    assert re.search(r"\bLDL\b|\bSTL\b", sass) is None


@pytest.mark.parametrize("n,k", [(28672, 4096), (4096, 14336), (57344, 8192)])
def test_policy_first_candidate_compiles(n, k):
    cfg = pick_config(1, n, k, torch.bfloat16, "none", 132)
    body = _main_kernel_ptx(ptx_of(TID, cfg))
    assert WEIGHT_LD in body


@pytest.mark.parametrize(
    "cfg,why",
    [
        (C(tile_n=12), "multiple of 8"),
        (C(pdl=True), "pdl"),
        (C(stages=2), "stages"),
        (C(tile_k=2048, num_warps=4), "tile_k"),
        (C(tile_m=3), "tile_m"),
        (C(family="wgmma", tile_m=64, tile_n=128, tile_k=64, stages=4), "gemv family"),
    ],
)
def test_rejected_configs_never_compile(cfg, why):
    st = check_spec(_spec(TID, cfg))
    assert not st and why in st.reason
    with pytest.raises(ValueError, match="cannot be implemented"):
        get_template(TID).compile(_spec(TID, cfg))


def test_fp32_activations_rejected():
    spec = _spec(TID, C(), x="fp32")
    assert "bf16 or fp16" in check_spec(spec).reason


# --------------------------------------------------------------------------- WGMMA family

WG = "sm90_w4a16_wgmma"


WG_FAST = [
    (C(family="wgmma", tile_m=64, tile_n=128, tile_k=64, num_warps=4, stages=2), SCALAR, "bf16", 128),
    (C(family="wgmma", tile_m=128, tile_n=128, tile_k=64, num_warps=8, stages=2),
     EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True), "bf16", 128),
    (C(family="wgmma", tile_m=64, tile_n=64, tile_k=64, num_warps=4, stages=2, split_k=3),
     EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.float16), "fp16", 64),
    # fewer weight vectors per K step (16 x 2) than threads (256)
    (C(family="wgmma", tile_m=128, tile_n=16, tile_k=64, num_warps=8, stages=2), SCALAR, "bf16", 16),
]


@pytest.mark.parametrize("cfg,epi,x,n", WG_FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_wgmma_family_compiles_with_wgmma_instructions(cfg, epi, x, n):
    ptx = ptx_of(WG, cfg, epi, x)
    kind = "bf16" if x == "bf16" else "f16"
    # 4 x k16 per 64-deep K step, per warpgroup-wide instruction m64nNk16
    assert len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.{kind}\.{kind}", ptx)) == 4
    assert "fence.proxy.async.shared::cta" in ptx  # generic-proxy smem stores before the tensor cores read
    assert "wgmma.fence" in ptx and "wgmma.commit_group" in ptx and "wgmma.wait_group" in ptx
    assert WEIGHT_LD in ptx
    assert ".local" not in ptx
    assert ptx.count(".entry") == (2 if cfg.split_k > 1 else 1)


def test_wgmma_sass_has_hgmma():
    cfg, epi, x, n = WG_FAST[0]
    sass = sass_of(WG, cfg, epi, x)
    assert len(re.findall(r"HGMMA\.64x128x16\.F32\.BF16", sass)) == 4
    assert re.search(r"\bLDL\b|\bSTL\b", sass) is None


@pytest.mark.parametrize(
    "cfg,why",
    [
        (C(family="wgmma", tile_m=64, tile_n=256, tile_k=64, num_warps=4, stages=2), "tile_n"),
        (C(family="wgmma", tile_m=64, tile_n=128, tile_k=128, num_warps=4, stages=2), "tile_k"),
        (C(family="wgmma", tile_m=128, tile_n=128, tile_k=64, num_warps=4, stages=2), "warpgroup"),
        (C(), "wgmma family"),
    ],
)
def test_wgmma_rejected_configs(cfg, why):
    st = check_spec(_spec(WG, cfg))
    assert not st and why in st.reason


# --------------------------------------------------------------------------- small-M tensor-core (mma) family

MM = "sm90_w4a16_mma"


MM_FAST = [
    (C(family="mma", tile_m=8, tile_n=16, tile_k=512, num_warps=4, stages=1), SCALAR, "bf16"),
    (C(family="mma", tile_m=16, tile_n=32, tile_k=1024, num_warps=4, stages=1, split_k=2),
     EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True), "bf16"),
    (C(family="mma", tile_m=32, tile_n=16, tile_k=1024, num_warps=8, stages=1),
     EpilogueSpec(alpha="scalar", activation="gelu_tanh", out_dtype=torch.float16), "fp16"),
]


@pytest.mark.parametrize("cfg,epi,x", MM_FAST, ids=lambda v: v.name() if isinstance(v, C) else None)
def test_mma_family_compiles_with_tensor_core_mma(cfg, epi, x):
    ptx = ptx_of(MM, cfg, epi, x)
    kind = "bf16" if x == "bf16" else "f16"
    u = cfg.tile_k // (128 * cfg.num_warps)
    # 8 k16 steps per 128-element chunk, per 8-row activation group, per chunk in flight
    n_mma = len(re.findall(rf"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.{kind}\.{kind}\.f32", ptx))
    assert n_mma == 8 * (cfg.tile_m // 8) * u
    assert ptx.count(WEIGHT_LD) == 2 * u  # rows g and g + 8, one 16-byte vector each per chunk
    assert f"cvt.rn.{kind}x2.f32" in ptx  # exact E2M1*scale operands
    assert ".local" not in ptx


def test_mma_sass_has_hmma_and_no_spills():
    cfg, epi, x = MM_FAST[0]
    sass = sass_of(MM, cfg, epi, x)
    assert len(re.findall(r"HMMA\.16816\.F32\.BF16", sass)) == 8
    assert len(re.findall(r"LDG\.E\.NA\.128\.CONSTANT", sass)) == 2
    assert re.search(r"\bLDL\b|\bSTL\b", sass) is None


@pytest.mark.parametrize(
    "cfg,why",
    [
        (C(family="mma", tile_m=4, tile_n=16, tile_k=512, num_warps=4, stages=1), "tile_m"),
        (C(family="mma", tile_m=8, tile_n=24, tile_k=512, num_warps=4, stages=1), "tile_n"),
        (C(family="mma", tile_m=8, tile_n=16, tile_k=4096, num_warps=4, stages=1), "tile_k"),
    ],
)
def test_mma_rejected_configs(cfg, why):
    st = check_spec(_spec(MM, cfg))
    assert not st and why in st.reason


def test_mma_gated_needs_whole_16_row_halves():
    cfg = C(family="mma", tile_m=8, tile_n=16, tile_k=512, num_warps=4, stages=1)
    st = check_spec(_spec(MM, cfg, EpilogueSpec(alpha="scalar", activation="silu_mul")))
    assert not st and "tile_n % 32" in st.reason
