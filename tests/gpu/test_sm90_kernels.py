"""sm_90a NVFP4 W4A16 kernels (mma decode family, wgmma family) vs the emulated op, on a Hopper GPU.

NOT RUN YET: no GPU was available when this was written; these tests are skipped elsewhere
(markers ``gpu`` + ``sm90``) and are ready to run on an H100/H200. Kernels come from the kernel
cache (``NVGEMM_CACHE_DIR``): on a box with cutlass-dsl they are compiled on a miss; on the GPU image
(no cutlass-dsl) build them here first with ``python bench/build_sm90_artifacts.py`` and run with
``NVGEMM_CACHE_DIR=build/sm90_gpu_check python3 -m pytest tests/gpu/test_sm90_kernels.py``.

Cases: ``bench/sm90_suite.py`` (Llama-3.1-8B / 3.3-70B layer shapes at M = 1 and 16; ragged N, M
and K tails; every epilogue part; fp16; split-K with the in-kernel reduction; W4A4 run as
quantize-dequantize; both families -- the register-A WGMMA kernel at 17..256 tokens per CTA, one
and two warpgroups, K not a multiple of its 64-deep chunk), plus every e4m3 scale byte (subnormal,
zero, negative) through the packed decode of both families -- the check that bf16/fp16 packed
multiplies and the tensor cores keep the subnormal operands the exact decode relies on. Every test draws
fresh random inputs (seeded from the test id), poisons the output with NaN before each launch and
compares with ``nvgemm.ops.linear.nvfp4_linear_emulated`` on the same device.

Tolerance (element-wise): both sides compute the same exact products (E2M1 x e4m3 x activation
are exact in fp32) and differ in fp32 summation order only: |diff| <= 2 ulp(out) * |ref| +
4 * K * 2**-24 * (|x| @ |W|^T) * |alpha| (the factor 4 covers activation slopes <= 1.13 and the
gated product), as in ``bench/gpu_check.py``.
"""

import dataclasses
import hashlib
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

ROOT = Path(__file__).resolve().parents[2]


def _load(name, rel):
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


suite = _load("sm90_suite", "bench/sm90_suite.py")
check = _load("sm90_gpu_check", "bench/gpu_check.py")

CASES = suite.numeric_cases() + [c for c in suite.timing_cases() if c.m in (1, 16)]


@pytest.fixture
def gen(request):
    s = int(hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8], 16)
    g = torch.Generator(device="cuda")
    g.manual_seed(s)
    return g


class _CacheRunner(check.Runner):
    """gpu_check's runner, but kernels come from the runtime's kernel cache by compile spec."""

    def __init__(self):
        super().__init__(Path("."), cpu_selftest=True)  # no manifest: kernels come from the cache
        self.cpu = False

    def config(self, case):
        build = _load("sm90_build", "bench/build_sm90_artifacts.py")
        return build.case_config(case, suite)

    def kernel(self, case):
        from nvgemm.aot.cache import default_cache

        build = _load("sm90_build", "bench/build_sm90_artifacts.py")
        return default_cache().get(build.case_spec(case, suite), build=True)


@pytest.fixture(scope="module")
def runner():
    torch.backends.cuda.matmul.allow_tf32 = False
    return _CacheRunner()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_emulated(case, runner, gen):
    r = check.check_numerics(case, runner, torch.device("cuda"), gen)
    assert r["ok"], r["why"]


def test_op_dispatches_to_sm90_kernel_and_matches(gen):
    """Through ``torch.ops.nvgemm.nvfp4_linear``: the cutedsl_sm90 backend is selected on sm_90."""
    from nvgemm.core.validation import check_linear_args, problem_of
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.dispatch.registry import select_backend

    case = next(c for c in CASES if c.name == "8b.gate_up.m1")
    lay = check.random_layer(case, torch.device("cuda"), gen)
    args = (lay["x"], lay["weight"], lay["weight_scale"], lay["weight_scale_2"], lay["input_scale"], lay["bias"],
            lay["residual"], lay["activation"], lay["out_dtype"])
    spec = check_linear_args(*args)
    assert select_backend(problem_of(*args[:8], spec)).name == "cutedsl_sm90"
    out = torch.ops.nvgemm.nvfp4_linear(*args)
    ref = nvfp4_linear_emulated(*args)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2 * 2.0**-7, atol=1e-2 * ref.float().abs().max().item())


@pytest.mark.parametrize("family", ["policy", "wgmma"])
def test_every_scale_byte_and_code_through_the_kernel(gen, family):
    """All 16 codes x every finite e4m3 block scale (subnormals, zero, negative) in one weight, fp16
    and bf16 activations, through the policy's kernel (M = 3: the mma family) and the register-A
    WGMMA kernel: the decode is exact only if the packed multiply keeps subnormal inputs (code 0.5
    decodes to a bf16 / fp16 subnormal) and the tensor cores keep subnormal fp16 operands."""
    from nvgemm.core.formats import to_blocked
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.templates.sm90_w4a16.backend import run_sm90

    dev = torch.device("cuda")
    sb = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    n = 16 * ((sb.numel() + 15) // 16)
    sb = torch.cat([sb, torch.full((n - sb.numel(),), 0x38, dtype=torch.uint8)])
    k = 256
    scales = sb.view(torch.float8_e4m3fn).reshape(n, 1).repeat(1, k // 16).to(dev)
    codes = torch.arange(16, dtype=torch.uint8, device=dev).repeat(n, k // 16)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    for dt in (torch.bfloat16, torch.float16):
        x = torch.randn(3, k, device=dev, generator=gen).to(dt)
        args = (x, packed, to_blocked(scales), torch.tensor(1.0, device=dev), None, None, None, "none", torch.float32)
        if family == "policy":
            out = torch.ops.nvgemm.nvfp4_linear(*args)
        else:  # the suite's scales.allbytes.*.wgmma config (built by build_sm90_artifacts.py)
            case = next(c for c in suite.numeric_cases() if c.name == "scales.allbytes.bf16.wgmma")
            out = run_sm90(*args, config=Sm90W4A16Config(**case.config))
        ref = nvfp4_linear_emulated(*args)
        scale = (x.float().abs() @ (6 * scales.float().abs().repeat_interleave(16, 1)).t())
        assert ((out - ref).abs() <= k * 2.0**-23 * scale + 1e-30).all(), (family, dt)


@pytest.mark.parametrize("name", ["epi.silu_mul.splitk", "wgmma.m64.splitk3"])
def test_deterministic_and_graph_capturable(gen, name):
    """Fixed-order reductions: bitwise-identical reruns; the call replays inside a CUDA graph (both
    families, split-K with the in-kernel reduction: the counters come back to zero)."""
    from nvgemm.templates.sm90_w4a16.backend import run_sm90

    case = next(c for c in CASES if c.name == name)
    lay = check.random_layer(dataclasses.replace(case), torch.device("cuda"), gen)
    args = (lay["x"], lay["weight"], lay["weight_scale"], lay["weight_scale_2"], lay["input_scale"], lay["bias"],
            lay["residual"], lay["activation"], lay["out_dtype"])
    cfg = Sm90W4A16Config(**case.config)
    os.environ.pop("NVGEMM_BACKEND", None)
    a = run_sm90(*args, config=cfg)
    b = run_sm90(*args, config=cfg)
    assert torch.equal(a, b)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run_sm90(*args, config=cfg)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        c = run_sm90(*args, config=cfg)
    c.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, a)
