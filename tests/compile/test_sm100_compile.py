"""Compile-only tests of the sm_100a NVFP4 kernel (no GPU): it compiles for the core path and
the decode/split-K/2-CTA/cluster variants, the PTX carries the block-scaled FP4 MMA, PDL's
griddepcontrol appears exactly when ``pdl`` is on, the alpha load exactly when alpha is
folded, the epilogue's loads/stores have the intended form (32x32b TMEM loads, TMA stores for
native tiles, 16-byte vector loads of alpha/bias/residual, per-tile alpha/bias for swap-AB, an
unrolled all-loads-first split-K reduction), and configs the predicates reject never reach the
compiler.

Fast subset for CI (~2-4 s per kernel on 2 cores); the full sweep over every config the policy
emits is ``python bench/compile_sweep_sm100.py``.
"""

import os

# Pin the target before cutlass is imported anywhere in this process (the compile call also
# passes --gpu-arch explicitly); keep DSL dumps out of the working tree.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    import tempfile

    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="nvgemm_cute_dump_")

import functools
import re

import pytest
import torch

pytest.importorskip("cutlass")

from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.aot.compile_spec import make_spec  # noqa: E402
from nvgemm.aot.abi import check_spec, get_template  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import validate_config  # noqa: E402

pytestmark = pytest.mark.compile_only

TID = "sm100_nvfp4_gemm"
MMA_RE = re.compile(r"tcgen05\.mma\.cta_group::([12])\.kind::mxf4nvf4\.block_scale\.block16")
TMA_STORE = "cp.async.bulk.tensor.2d.global.shared::cta"
SCALAR = EpilogueSpec(alpha="scalar")


@functools.lru_cache(maxsize=None)
def ptx_of(cfg: C, epi: EpilogueSpec = SCALAR) -> str:
    spec = make_spec(TID, cfg, "sm_100a", epilogue=epi)
    assert check_spec(spec), check_spec(spec).reason
    f = get_template(TID).compile(spec, keep_ptx=True)
    ptx = f.__ptx__
    assert ptx and ".target sm_100a" in ptx
    return ptx


def count(ptx: str, s: str) -> int:
    return ptx.count(s)


FAST = [
    C(tile_n=128, pdl=True),
    C(tile_n=128, pdl=False),
    C(tile_n=64),
    C(tile_n=256),
    C(tile_n=192),
    C(tile_n=8, swap_ab=True),
    C(tile_n=32, swap_ab=True, cluster_m=2),
    C(tile_n=16, swap_ab=True, split_k=4, l2_prefetch=True),
    C(tile_n=128, split_k=2),
    C(tile_m=256, tile_n=128, cluster_m=2),
    C(tile_n=128, cluster_m=2, cluster_n=2),
]


@pytest.mark.parametrize("cfg", FAST, ids=lambda c: c.name())
def test_compiles_with_block_scaled_fp4_mma(cfg):
    ptx = ptx_of(cfg)
    ctas = {m.group(1) for m in MMA_RE.finditer(ptx)}
    assert ctas == {"2" if cfg.use_2cta else "1"}, ctas
    # scale factors go smem -> TMEM with tcgen05.cp, accumulators come back with tcgen05.ld
    assert "tcgen05.cp." in ptx and "tcgen05.ld." in ptx
    assert "cp.async.bulk.tensor" in ptx  # TMA loads
    n_wait, n_launch = count(ptx, "griddepcontrol.wait"), count(ptx, "griddepcontrol.launch_dependents")
    if cfg.pdl:
        # TMA warp (activations) + epilogue warps (alpha/bias/residual/workspace); every role
        # releases the dependents once its part of the main loop is done.
        assert n_wait == 2 and n_launch == 3, (n_wait, n_launch)
    else:
        assert n_wait == 0 and n_launch == 0, (n_wait, n_launch)
    prefetch = count(ptx, "cp.async.bulk.prefetch.tensor")
    if not cfg.pdl and not cfg.l2_prefetch:
        assert prefetch == 0
    if cfg.l2_prefetch:
        assert prefetch >= 4  # A, B, SFA, SFB one stage ahead
    # TMEM -> registers always with the 32x32b shape (one accumulator row per thread)
    assert set(re.findall(r"tcgen05\.ld\.sync\.aligned\.(\w+)\.", ptx)) == {"32x32b"}
    if cfg.swap_ab:
        # per-element stores, coalesced across the warp (32 consecutive features per register)
        assert TMA_STORE not in ptx and "st.global.b16" in ptx
    else:
        # registers -> swizzled smem stage -> one TMA bulk store per sub-tile
        assert count(ptx, TMA_STORE) >= 1 and "st.shared.v4" in ptx
        if cfg.split_k == 1:
            assert "st.global" not in ptx
    if cfg.cluster_m * cfg.cluster_n > 1:
        assert ".multicast::cluster" in ptx


def test_pdl_wait_precedes_activation_loads_and_follows_weight_prefetch():
    ptx = ptx_of(C(tile_n=128, pdl=True))
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("cp.async.bulk.prefetch.tensor") < wait < ptx.index("cp.async.bulk.tensor")
    # the epilogue warps' wait precedes their first global load (alpha) and store (TMA store of
    # the output)
    wait2 = ptx.index("griddepcontrol.wait", wait + 1)
    assert wait2 < ptx.index("ld.global") and wait2 < ptx.index(TMA_STORE)
    assert "st.global" not in ptx


def _global_loads(ptx: str) -> int:
    """Scalar 32-bit global loads."""
    return len(re.findall(r"\bld\.global(\.\w+)*\.(b32|f32)\b", ptx)) - len(re.findall(r"\bld\.global(\.\w+)*\.v\d\.(b32|f32)\b", ptx))


def _vector16_loads(ptx: str) -> int:
    """16-byte global loads (v4 of 32-bit or v2 of 64-bit words)."""
    return len(re.findall(r"\bld\.global(\.\w+)*\.(v4\.(b32|f32)|v2\.(b64|f64))\b", ptx))


def test_alpha_load_only_when_folded():
    cfg = C(tile_n=64)
    none = ptx_of(cfg, EpilogueSpec(alpha="none"))
    scalar = ptx_of(cfg, EpilogueSpec(alpha="scalar"))
    assert _global_loads(none) == 0 and _vector16_loads(none) == 0
    assert _global_loads(scalar) == 1 and _vector16_loads(scalar) == 0  # alpha[0], once per CTA
    vector = ptx_of(cfg, EpilogueSpec(alpha="vector"))
    # a sub-tile's 32 alpha columns as eight 16-byte loads (element-wise only on a ragged N edge)
    assert _vector16_loads(vector) == 8


def test_native_epilogue_operands_are_vector_loads():
    """alpha (fp32) and bias / residual (bf16) of a 32-column sub-tile: 8 + 4 + 4 16-byte loads
    on the in-bounds path, once per sub-tile, not per element; the ragged-edge fallback is
    element-wise (32 + 32 + 32 scalar loads, predicated)."""
    epi = EpilogueSpec(alpha="vector", bias=True, activation="gelu_tanh", residual=True)
    ptx = ptx_of(C(tile_n=128, pdl=False), epi)
    assert _vector16_loads(ptx) == 8 + 4 + 4
    assert _global_loads(ptx) == 32  # the ragged-edge alpha fallback
    assert count(ptx, "ld.global.b16") == 32 + 32  # ragged-edge bias + residual fallback


def test_full_epilogue_swap_ab_fp16():
    """swap-AB: a thread's feature is its row -> alpha and bias once per tile; the residual is
    read per element (coalesced across the warp); output as 2-byte stores, one per element."""
    epi = EpilogueSpec(alpha="vector", bias=True, activation="gelu_tanh", residual=True, out_dtype=torch.float16)
    ptx = ptx_of(C(tile_n=16, swap_ab=True), epi)
    assert MMA_RE.search(ptx)
    assert "tanh" in ptx or "ex2" in ptx  # the GELU-tanh transcendental
    assert _global_loads(ptx) == 1  # alpha[row], once per tile
    assert count(ptx, "ld.global.b16") == 1 + 16  # bias[row] once + 16 residual elements
    assert count(ptx, "st.global.b16") == 16


def test_silu_epilogue():
    ptx = ptx_of(C(tile_n=128, pdl=False), EpilogueSpec(alpha="scalar", bias=True, activation="silu"))
    assert "ex2" in ptx  # exp(-y) of SiLU


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_gated_silu_mul_epilogue(out_dtype):
    """silu_mul on interleaved gate/up rows: pairs meet in one thread (native: half-width TMA
    store) or in adjacent lanes, exchanged with one butterfly shuffle per register (swap-AB)."""
    epi = EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True, out_dtype=out_dtype)
    native = ptx_of(C(tile_n=128, pdl=False), epi)
    swapped = ptx_of(C(tile_n=16, swap_ab=True, pdl=False), epi)
    assert MMA_RE.search(native) and MMA_RE.search(swapped)
    assert "shfl.sync.bfly" not in native and count(native, TMA_STORE) == 1
    assert count(swapped, "shfl.sync.bfly") == 16  # one per element of a 16-column sub-tile
    assert "ex2" in native and "ex2" in swapped
    assert set(re.findall(r"tcgen05\.ld\.sync\.aligned\.(\w+)\.", swapped)) == {"32x32b"}


@pytest.mark.parametrize("cfg", [C(tile_n=16, swap_ab=True, split_k=4), C(tile_n=128, split_k=2),
                                 C(tile_n=8, swap_ab=True, split_k=8)], ids=lambda c: c.name())
def test_splitk_reduction_is_unrolled_vector_loads(cfg):
    """Publish: epi_n/4 16-byte stores per sub-tile. Reduce: S x epi_n/4 16-byte loads per
    sub-tile, all present in the code (S is a compile-time constant; no per-element loop over
    S with scalar loads), plus the acq_rel counter protocol. (The compiler may also unroll the
    sub-tile loop, hence "a whole multiple of".)"""
    ptx = ptx_of(cfg)
    epi_n = min(cfg.tile_n, 32)
    assert re.search(r"atom(\.global)?\.acq_rel(\.gpu)?\.add\.[us]32", ptx)
    assert count(ptx, "fence.acq_rel.gpu") >= 2  # publish partials / acquire before reducing
    stores = len(re.findall(r"\bst\.global\.(v4\.b32|v2\.b64)\b", ptx))
    loads = _vector16_loads(ptx)
    assert stores >= epi_n // 4 and stores % (epi_n // 4) == 0, stores
    assert loads >= cfg.split_k * epi_n // 4 and loads % (cfg.split_k * epi_n // 4) == 0, loads
    assert _global_loads(ptx) == 1  # alpha only: no scalar partial loads


def _policy_configs(max_configs: int):
    heur = pytest.importorskip("nvgemm.heuristics")
    from nvgemm.core.problem import GemmProblem, Target

    seen = []
    for m, n, k in ((1, 4096, 4096), (16, 6144, 4096), (128, 4096, 14336)):
        prob = GemmProblem(n=n, k=k, m=m, target=Target.from_gpu("B200"))
        for cand in heur.candidates(prob, use_nvmmh=False):
            if cand.config not in seen:
                seen.append(cand.config)
    return seen[:max_configs]


def test_policy_emitted_configs_compile():
    """A few of the policy's candidates (the full list: bench/compile_sweep_sm100.py)."""
    cfgs = _policy_configs(4)
    assert cfgs
    for cfg in cfgs:
        assert MMA_RE.search(ptx_of(cfg))


def test_invalid_config_gets_reason_and_never_compiles(monkeypatch):
    import cutlass.cute as cute

    def boom(*a, **k):
        raise AssertionError("an invalid config reached cute.compile")

    monkeypatch.setattr(cute, "compile", boom)
    bad = [
        (C(tile_n=24), "tile_n=24"),
        (C(tile_m=256, cluster_m=1), "even cluster_m"),
        (C(tile_n=16, tile_m=256, cluster_m=2), "narrow tile_n"),
        (C(split_k=3), "split_k=3"),
    ]
    for cfg, why in bad:
        st = validate_config(cfg)
        assert not st and why in st.reason, st
        spec = make_spec(TID, cfg, "sm_100a", epilogue=SCALAR)
        st = check_spec(spec)
        assert not st and why in st.reason
        with pytest.raises(ValueError, match=re.escape(why)):
            get_template(TID).compile(spec)
    # a native gated tile_n=8 kernel would write 4-column output sub-tiles (under the TMA-store
    # epilogue's 8): refused by the kernel and by the problem rule
    from nvgemm.templates.sm100_w4a4.validity import can_implement_problem

    gated = EpilogueSpec(alpha="scalar", activation="silu_mul", out_dtype=torch.float32)
    with pytest.raises(ValueError, match="narrower than 8 columns"):
        get_template(TID).compile(make_spec(TID, C(tile_n=8), "sm_100a", epilogue=gated))
    st = can_implement_problem(C(tile_n=8), m=4, n=8, k=256, out_bytes=4, activation="silu_mul")
    assert not st and "use tile_n >= 16" in st.reason
    # operand formats the template does not implement: refused with a reason, before compiling
    spec = make_spec(TID, C(), "sm_100a", epilogue=SCALAR, a_format="bf16")
    assert "nvfp4 x nvfp4" in check_spec(spec).reason
    with pytest.raises(ValueError, match="nvfp4 x nvfp4"):
        get_template(TID).compile(spec)
    # and the problem-level predicate refuses problem/config mismatches with a reason
    from nvgemm.heuristics import can_implement
    from nvgemm.core.problem import GemmProblem, Target

    prob = GemmProblem(n=4096, k=4096, m=64, target=Target.from_gpu("B200"))
    st = can_implement(prob, C(tile_n=8, swap_ab=True))
    assert not st and "narrow tile_n=8" in st.reason
