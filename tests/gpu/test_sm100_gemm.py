"""sm_100a NVFP4 kernel vs the emulated op, on a Blackwell (sm_100-family) GPU.

NOT RUN YET: no Blackwell GPU was available when this was written; these tests are skipped
elsewhere (markers ``gpu`` + ``sm100``) and are ready to run on a B200/GB200/B300.

Every test draws fresh random inputs (seeded from the test id), poisons the output with NaN
before the launch (so an unwritten element fails), and compares against
``nvgemm.ops.linear.nvfp4_linear_emulated`` on the same device.

Tolerance (element-wise): the kernel and the reference multiply the same exact operands
(E2M1 x e4m3 products are exact in fp32) and differ only in the fp32 summation order of the
MMA, bounded by ``4 * K * 2^-24 * |alpha| * sum_k |a*b|`` (4x slack for the tensor core's
internal accumulation order), propagated through the epilogue (SiLU/GELU have slope <= 1.13,
so x1.2; silu_mul: the product rule on gate and up), plus one ulp of the output dtype for the
final rounding and 8 fp32 ulps for exp/tanh. The kernel's ``acc*alpha + bias`` (and
``silu*up + residual``) are contracted into one fma (one fp32 rounding where the reference
rounds twice): a difference of at most one fp32 ulp of ``|acc*alpha|``, i.e. 2^-24 relative --
inside the summation-order term (K >= 32), which is why no separate term appears.
"""

import functools
import itertools

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.sm100]

from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.core.formats import dequantize, from_blocked, quantize_weight, to_blocked  # noqa: E402
from nvgemm.ops.linear import nvfp4_linear_emulated  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402

ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def _arch():
    major, minor = torch.cuda.get_device_capability()
    return {0: "sm_100a", 3: "sm_103a"}.get(minor, "sm_100f")


@functools.lru_cache(maxsize=None)
def kernel_for(cfg: C, epi: EpilogueSpec):
    """The production path: compile for this device's arch (explicit hardware numbers, the
    driver's cluster-occupancy answer), export, link and load through the kernel cache
    (``nvgemm.aot.cache``)."""
    from nvgemm.aot.cache import default_cache
    from nvgemm.templates.common.occupancy import query_max_active_clusters
    from nvgemm.templates.sm100_w4a4.backend import compile_spec_for

    props = torch.cuda.get_device_properties(0)
    query = functools.partial(query_max_active_clusters, 0)
    return default_cache().get(compile_spec_for(cfg, epi, _arch(), props.multi_processor_count, query))


def run_kernel(args):
    from nvgemm.templates.sm100_w4a4.launch import launch_sm100

    launch_sm100(args, kernel_for(args.config, args.spec), torch.cuda.current_stream())
    torch.cuda.synchronize()
    return args.out


def make_call(m, n, k, *, vector_alpha, bias, residual, activation, out_dtype):
    dev = "cuda"
    x = (torch.randn(m, k, device=dev) * 2).to(out_dtype)
    q = quantize_weight(torch.randn(n, k, device=dev) * 0.1)
    ws2 = q.global_scale * (torch.linspace(0.5, 2.0, n, device=dev) if vector_alpha else 1.0)
    ins = (x.float().abs().max() / 2688).reshape(())
    b = torch.randn(n, device=dev).to(out_dtype) if bias else None
    n_out = n // 2 if activation == "silu_mul" else n
    r = torch.randn(m, n_out, device=dev).to(out_dtype) if residual else None
    return (x, q.packed, to_blocked(q.scale), ws2.float(), ins, b, r, activation, out_dtype)


def prepare(call, cfg):
    from nvgemm.core.validation import check_linear_args
    from nvgemm.templates.sm100_w4a4.launch import prepare_sm100_args

    return prepare_sm100_args(*call[:7], check_linear_args(*call), cfg)


def check(cfg, m, n, k, *, vector_alpha=False, bias=False, residual=False, activation="none",
          out_dtype=torch.bfloat16, args_hook=None):
    call = make_call(m, n, k, vector_alpha=vector_alpha, bias=bias, residual=residual, activation=activation,
                     out_dtype=out_dtype)
    args = prepare(call, cfg)
    if args_hook is not None:
        args = args_hook(args)
    args.out.fill_(float("nan"))  # poison
    got = run_kernel(args)
    want = nvfp4_linear_emulated(*call)
    assert not torch.isnan(got).any(), "kernel left output elements unwritten"
    kb = k // 16
    A = dequantize(args.a, from_blocked(args.sfa, args.m, kb)).abs()
    B = dequantize(args.b, from_blocked(args.sfb, args.n, kb)).abs()
    sumabs = A @ B.t()
    if cfg.swap_ab:
        sumabs = sumabs.t()
    a_abs = args.alpha.abs().reshape(1, -1) if vector_alpha else args.alpha.abs()
    err_acc = 4 * k * 2.0**-24 * a_abs * sumabs  # GEMM-feature frame (interleaved when gated)
    if activation == "silu_mul":
        # |d(silu(g)*u)| <= 1.1*|u|*dg + |silu(g)|*du, with g/u the pre-activation values
        pre = (dequantize(args.a, from_blocked(args.sfa, args.m, kb)) @
               dequantize(args.b, from_blocked(args.sfb, args.n, kb)).t())
        pre = (pre.t() if cfg.swap_ab else pre) * (args.alpha.reshape(1, -1) if vector_alpha else args.alpha)
        g, u = pre[:, 0::2].abs(), pre[:, 1::2].abs()
        err_acc = 1.1 * u * err_acc[:, 0::2] + (g + 1) * err_acc[:, 1::2]
    bound = 1.2 * err_acc + ULP[out_dtype] * want.float().abs() + 2.0**-20
    err = (got.float() - want.float()).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max excess error {worst:.3g} over the bound ({cfg.name()}, m={m} n={n} k={k})"
    return got, args


CORE = [C(tile_n=t, pdl=p) for t in (64, 128, 192, 256) for p in (True, False)]
DECODE = [C(tile_n=t, swap_ab=True) for t in (8, 16, 32)] + [
    C(tile_n=32, swap_ab=True, cluster_m=2),
    C(tile_n=8, swap_ab=True, cluster_m=4),  # 2-row B box multicast to 4 CTAs (never run anywhere)
    C(tile_n=8, swap_ab=True, l2_prefetch=True),
]
SPLITK = [C(tile_n=128, split_k=2), C(tile_n=64, split_k=4), C(tile_n=16, swap_ab=True, split_k=4),
          C(tile_n=8, swap_ab=True, split_k=16), C(tile_m=256, tile_n=64, cluster_m=2, swap_ab=True, split_k=2)]
BIG = [C(tile_m=256, tile_n=128, cluster_m=2), C(tile_m=256, tile_n=256, cluster_m=2),
       C(tile_n=128, cluster_m=2, cluster_n=2), C(tile_n=128, cluster_m=4)]


@pytest.mark.parametrize("cfg", CORE, ids=lambda c: c.name())
@pytest.mark.parametrize("mnk", [(1, 256, 512), (200, 640, 1024), (37, 200, 288)], ids=lambda t: "m%d-n%d-k%d" % t)
def test_core(cfg, mnk, seed):
    check(cfg, *mnk)


@pytest.mark.parametrize("cfg", DECODE, ids=lambda c: c.name())
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("nk", [(4096, 4096), (200, 288)], ids=lambda t: "n%d-k%d" % t)  # ragged N and K tails
def test_swap_ab_decode(cfg, m, nk, seed):
    check(cfg, m, *nk)


@pytest.mark.parametrize("cfg", SPLITK, ids=lambda c: c.name())
def test_split_k_correct_and_deterministic(cfg, seed):
    m = 5 if cfg.swap_ab else 64
    got, args = check(cfg, m, 512, 4096)
    assert int(args.counters.abs().sum()) == 0, "split-K counters must be left at zero"
    first = got.clone()
    args.out.fill_(float("nan"))
    again = run_kernel(args)
    assert torch.equal(first.view(torch.int16), again.view(torch.int16)), "split-K result is not bitwise reproducible"


def test_split_k_with_an_empty_split(seed):
    """K=512 has 2 K tiles; a split_k=4 kernel gives splits 0 and 2 no K tile. The launcher
    refuses that config, so the launch is assembled by hand: the kernel must still be correct
    (empty splits publish zeros instead of a never-written accumulator)."""
    from dataclasses import replace

    from nvgemm.templates.sm100_w4a4.launch import splitk_buffers

    cfg4 = C(tile_n=16, swap_ab=True, split_k=4)

    def to_split4(args):
        ws, cnt = splitk_buffers(args.out.device, args.m, args.n, cfg4, torch.cuda.current_stream().cuda_stream)
        return replace(args, config=cfg4, workspace=ws, counters=cnt)

    check(C(tile_n=16, swap_ab=True, split_k=2), 5, 512, 512, args_hook=to_split4)


@pytest.mark.parametrize("cfg", BIG, ids=lambda c: c.name())
def test_2cta_and_clusters(cfg, seed):
    check(cfg, 300, 1024, 2048)


# every gated swap-AB case: each token tile width, clusters, split-K, 2-CTA, every output dtype
GATED_SWAP = [C(tile_n=t, swap_ab=True) for t in (8, 16, 32, 64, 128)] + [
    C(tile_n=8, swap_ab=True, cluster_m=4),
    C(tile_n=16, swap_ab=True, split_k=4),
    C(tile_n=32, swap_ab=True, cluster_m=2, l2_prefetch=True),
    C(tile_m=256, tile_n=64, cluster_m=2, swap_ab=True),
    C(tile_m=256, tile_n=128, cluster_m=2, swap_ab=True, split_k=2),
]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("cfg", GATED_SWAP, ids=lambda c: c.name())
def test_gated_silu_mul_swap_ab(cfg, out_dtype, seed):
    """Interleaved gate/up rows 2j/2j+1 sit in lanes 2j/2j+1 (tcgen05.ld.32x32b); one shuffle
    pairs them. Ragged N/2 (odd multiple of 8) and token counts up to the tile width."""
    m = min(cfg.tile_n, 13)
    check(cfg, m, 912, 1024, vector_alpha=True, bias=True, residual=True, activation="silu_mul", out_dtype=out_dtype)


NATIVE_FP32 = [(c, a) for c in (C(tile_n=128), C(tile_n=192), C(tile_m=256, tile_n=128, cluster_m=2), C(tile_n=16),
                                 C(tile_n=8)) for a in ("none", "silu_mul") if not (a == "silu_mul" and c.tile_n < 16)]


@pytest.mark.parametrize("cfg,activation", NATIVE_FP32, ids=[f"{c.name()}-{a}" for c, a in NATIVE_FP32])
def test_native_tma_store_fp32_out(cfg, activation, seed):
    """fp32 output through the TMA store epilogue (ragged M and N; narrow tiles hold all of N;
    gated native tiles need tile_n >= 16, the template refuses tile_n 8 there)."""
    n = cfg.tile_n if cfg.tile_n < 64 else 400
    check(cfg, 150, n, 512, vector_alpha=True, bias=True, residual=True, activation=activation,
          out_dtype=torch.float32)


def test_aot_cluster_occupancy_is_a_lower_bound():
    """The per-arch AOT cluster count (nvgemm.templates.sm100_w4a4.occupancy) must never exceed what
    this GPU holds (a larger one would spill the persistent grid into a second wave). Prints
    both, so the first Blackwell run can replace the guaranteed values by measured ones."""
    from nvgemm.templates.common.occupancy import query_max_active_clusters
    from nvgemm.templates.sm100_w4a4.occupancy import aot_max_active_clusters

    props = torch.cuda.get_device_properties(0)
    for c in (1, 2, 4, 8, 16):
        hw = query_max_active_clusters(0, c)
        aot = aot_max_active_clusters(_arch(), props.multi_processor_count, c)
        print(f"{props.name}: {props.multi_processor_count} SMs, cluster {c}: device {hw}, AOT {aot}")
        assert 1 <= aot <= hw


def test_split_k_workspace_growth_keeps_captured_graphs_valid(seed):
    """Capture a split-K GEMM in a CUDA graph, then run a larger split-K GEMM eagerly on the same
    stream (the workspace grows), then replay: the graph must still compute its result."""
    from nvgemm.templates.sm100_w4a4.launch import launch_sm100

    cfg = C(tile_n=16, swap_ab=True, split_k=4)
    epi_call = make_call(5, 512, 2048, vector_alpha=False, bias=False, residual=False, activation="none",
                         out_dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        args = prepare(epi_call, cfg)  # eager: sizes the pool for this shape
        kernel = kernel_for(cfg, args.spec)
        launch_sm100(args, kernel, stream)
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            launch_sm100(args, kernel, stream)
        big = prepare(make_call(16, 8192, 4096, vector_alpha=False, bias=False, residual=False, activation="none",
                                out_dtype=torch.bfloat16), cfg)
        assert big.workspace.data_ptr() != args.workspace.data_ptr()  # grown: a new pair
        launch_sm100(big, kernel, stream)
        args.out.fill_(float("nan"))
        g.replay()
        stream.synchronize()
    want = nvfp4_linear_emulated(*epi_call)
    # same tolerance and reasoning as test_through_op_and_cache (|out| ~ 1-10, fp32 order ~1e-4)
    torch.testing.assert_close(args.out.float(), want.float(), rtol=2 * ULP[torch.bfloat16], atol=1e-2)


EPI = list(itertools.product([False, True], [False, True], ["none", "silu", "gelu_tanh", "silu_mul"], [False, True],
                             [torch.bfloat16, torch.float16]))


@pytest.mark.parametrize("vector_alpha,bias,activation,residual,out_dtype", EPI)
@pytest.mark.parametrize("cfg", [C(tile_n=128), C(tile_n=16, swap_ab=True)], ids=lambda c: c.name())
def test_epilogue_combinations(cfg, vector_alpha, bias, activation, residual, out_dtype, seed):
    m = 9 if cfg.swap_ab else 130
    check(cfg, m, 384, 512, vector_alpha=vector_alpha, bias=bias, residual=residual, activation=activation,
          out_dtype=out_dtype)


def test_through_op_and_cache(monkeypatch, tmp_path, seed):
    """torch.ops.nvgemm.nvfp4_linear dispatches to cutedsl_sm100 (policy-chosen config) on sm_100.

    Tolerance: the same bound as check() would give is not available through the op, so this
    uses 2 output ulps relative plus 1e-2 absolute (|out| ~ 1-10 here, K=1024 fp32 order
    differences are ~1e-4); the exact-bound tests above cover the kernel itself."""
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NVGEMM_BACKEND", "cutedsl_sm100")
    call = make_call(4, 1024, 1024, vector_alpha=False, bias=True, residual=True, activation="silu",
                     out_dtype=torch.bfloat16)
    got = torch.ops.nvgemm.nvfp4_linear(*call)
    want = nvfp4_linear_emulated(*call)
    torch.testing.assert_close(got.float(), want.float(), rtol=2 * ULP[torch.bfloat16], atol=1e-2)
