"""Inductor on the W4A16 ``mma`` kernel's archs beside Hopper, on CPU (no GPU): forced sm_120 / sm_121 / sm_89 /
sm_80 devices get their autotuning choices from backend ``cutedsl_mma_w4a16`` -- for ``nvfp4_linear`` and for a
layer held in the sm90 (prepared) layout -- each a config the arch compiles, with PDL exactly where the arch has
``griddepcontrol`` (sm_120 / sm_121), and the code Inductor generates for a fake RTX 5090 / L40S calls the
prepared choice op with that backend's config and chains its Triton consumer with PDL on the RTX 5090 only.
"""

from __future__ import annotations

import re
import unittest.mock as um

import pytest
import torch

import nvgemm.integrations.inductor as ni
from nvgemm.dispatch.registry import LinearProblem
from nvgemm.integrations.inductor import compat
from nvgemm.integrations.inductor.choices import candidates, prepared_candidates
from nvgemm.templates.sm90_w4a16.config import ARCH_CAPS, arch_problem, config_from_name

MMA = "cutedsl_mma_w4a16"
ARCH = {(12, 0): "sm_120a", (12, 1): "sm_121a", (8, 9): "sm_89", (8, 0): "sm_80", (9, 0): "sm_90a"}


def _problem(cap, m=4, n=4096, k=4096, activation="none"):
    return LinearProblem(m=m, n=n, k=k, device_type="cuda", capability=cap, weight_only=True, x_dtype=torch.bfloat16,
                         out_dtype=torch.bfloat16, alpha="scalar", bias=False, activation=activation, residual=False)


@pytest.mark.parametrize("cap", [(12, 0), (12, 1), (8, 9), (8, 0)], ids=lambda c: ARCH[c])
@pytest.mark.parametrize("m", [1, 48])
def test_choices_are_the_mma_backend_configs_of_the_arch(cap, m):
    arch = ARCH[cap]
    for prepared, cands in ((False, candidates(_problem(cap, m))), (True, prepared_candidates(_problem(cap, m))),
                            (True, prepared_candidates(_problem(cap, m, n=28672, activation="silu_mul")))):
        assert cands[-1].key == "backend:emulated"
        kernels = [c for c in cands if c.backend == MMA]
        # the policy's configs (each named), not one config-less choice; at M = 1 several
        assert len(kernels) >= (2 if m == 1 else 1) and all(c.config for c in kernels), [c.key for c in cands]
        # nvfp4_linear also offers the Triton W4A16 kernel; a prepared layer only the kernel reading its layout
        others = {c.backend for c in cands[:-1]} - {MMA}
        assert others == (set() if prepared else {"triton_w4a16"}), [c.key for c in cands]
        assert "cutedsl_sm90" not in others
        for c in kernels:
            cfg = config_from_name(c.config)
            assert cfg.family == "mma" and arch_problem(cfg, arch) is None, (c.key, arch_problem(cfg, arch))
            assert cfg.pdl == ARCH_CAPS[arch].pdl == (cap[0] >= 9)


def test_hopper_keeps_its_backend_and_other_devices_get_no_mma_choice():
    hopper = [c for c in prepared_candidates(_problem((9, 0), 48)) if c.key != "backend:emulated"]
    assert hopper and {c.backend for c in hopper} == {"cutedsl_sm90"}
    for cap in ((10, 0), (7, 5)):  # sm_100 (W4A16 runs elsewhere) and an arch without the kernel
        assert all(c.backend != MMA for c in candidates(_problem(cap)) + prepared_candidates(_problem(cap)))


# ---------------------------------------------------------------------------------------------- codegen

N, K = 256, 128


def _prepared_shapes(m: int):
    """(shape, dtype) of a prepared layer's call arguments (x, pweight, pscale, weight_scale_2) and an
    unrelated input."""
    from nvgemm.core.formats import blocked_shape
    from nvgemm.ops.prepared import sm90_weight_of  # noqa: F401  (the layout's reader; shapes below are its)
    from nvgemm.templates.sm90_w4a16.operand import prepare_sm90_weight

    w = torch.zeros(N, K // 2, dtype=torch.uint8)
    s = torch.full(blocked_shape(N, K // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)
    p = prepare_sm90_weight(w, s, torch.tensor(1.0), "bf16")
    return [((m, K), torch.bfloat16), (tuple(p.weight.shape), p.weight.dtype), (tuple(p.scale.shape), p.scale.dtype),
            ((), torch.float32), ((m, 64), torch.float32)]


def _graph(x, pw, ps, ws2, other):
    y = torch.ops.nvgemm.nvfp4_linear_sm90_prepared(x, pw, ps, ws2, None, None, None, "none", None, N, K, "bf16")
    return torch.relu(y.float()) * 2.0, torch.sin(other) + 1.0


class _PickFirstKernel:
    """Stands in for Inductor's benchmark of custom-op choices: records the offered keys, picks the first kernel."""

    def __init__(self):
        self.offered: list[list[str]] = []

    def __call__(self, *, name, choices, **kwargs):
        keys = [getattr(getattr(c, "decomposition", None), "nvgemm_choice", None) for c in choices]
        # torch <= 2.14 adds the op's own eager fallback (``<op>_autotune_fallback``) to the choices; name it
        keys = [k or ("fallback" if c.name.endswith("_fallback") else None) for k, c in zip(keys, choices)]
        self.offered.append(keys)
        return None, choices[next(i for i, k in enumerate(keys) if k and k.startswith("backend:cutedsl_"))]


def _codegen(gpu: str, m: int = 4) -> tuple[str, _PickFirstKernel]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from nvgemm.integrations.inductor.codegen import generate_cuda_code

    shapes = _prepared_shapes(m)
    fm = FakeTensorMode(shape_env=ShapeEnv())  # autotuned lowerings trace their candidates symbolically
    with fm:
        args = [torch.empty(s, dtype=d, device="cuda") for s, d in shapes]
    bench = _PickFirstKernel()
    with um.patch("torch._inductor.kernel.custom_op.autotune_select_algorithm", bench):
        code = generate_cuda_code(_graph, args, gpu=gpu)
    return code, bench


def _consumer(code: str) -> str:
    srcs = [m.group(2) for m in re.finditer(r"(\w+) = async_compile\.triton\('(?:\w+)', '''(.*?)'''", code, re.S)]
    cons = [s for s in srcs if "relu" in s or "maximum" in s]
    assert len(cons) == 1, srcs
    return cons[0]


@pytest.fixture
def nvgemm_on():
    ni.enable()
    yield
    ni.disable()


@pytest.mark.parametrize("gpu,arch", [("RTX5090", "sm_120a"), ("L40S", "sm_89")])
def test_fake_device_codegen_autotunes_the_mma_backend(nvgemm_on, gpu, arch):
    code, bench = _codegen(gpu)
    assert len(bench.offered) == 1, bench.offered
    offered = bench.offered[0]
    kernels = [k for k in offered if k not in ("backend:emulated", "fallback")]
    assert len(kernels) >= 2 and all(k and k.startswith(f"backend:{MMA}:") for k in kernels), offered
    calls = re.findall(r"nvgemm\.nvfp4_linear_sm90_prepared_choice\.default\((.*?)\)\n", code)
    assert len(calls) == 1, code[-3000:]
    key = re.search(r"'(backend:[^']+)'", calls[0]).group(1)
    assert key == kernels[0]
    cfg = config_from_name(key.split(":")[2])
    assert arch_problem(cfg, arch) is None and cfg.pdl == ARCH_CAPS[arch].pdl
    if compat.available("pdl_hook"):
        cons = _consumer(code)
        # PDL into the Triton consumer on sm_120 (the kernel triggers its dependents), never on sm_89
        assert ("tl.extra.cuda.gdc_wait()" in cons) == cfg.pdl
        assert ("'launch_pdl': True" in cons) == cfg.pdl


def test_fake_devices_answer_the_arch():
    from nvgemm.integrations.inductor.codegen import fake_cuda_device

    for gpu, cap, sms, smem in (("RTX5090", (12, 0), 170, 101376), ("GB10", (12, 1), 48, 101376),
                                ("L40S", (8, 9), 142, 101376), ("A100", (8, 0), 108, 166912)):
        with fake_cuda_device(gpu):
            props = torch.cuda.get_device_properties(0)
            assert torch.cuda.get_device_capability() == cap
            assert (props.multi_processor_count, props.shared_memory_per_block_optin) == (sms, smem)


def test_producer_pdl_follows_the_mma_config():
    """The PDL chain treats an ``mma`` choice as a PDL producer only when its config launches with PDL (its
    kernel has ``griddepcontrol.launch_dependents``); without a config, where the device has PDL (sm_90+).
    (On a fake sm_89 device PyTorch's own sm_90+ condition also keeps the consumer off PDL.)"""
    from nvgemm.integrations.inductor.codegen import fake_cuda_device
    from nvgemm.integrations.inductor.pdl import _is_pdl_kernel

    base = "backend:cutedsl_mma_w4a16:nvgemm_cutedsl_sm90_w4a16_mma_t8x128x256_w4_s4"
    assert _is_pdl_kernel(base + "_pdl") and not _is_pdl_kernel(base)
    assert _is_pdl_kernel("backend:cutedsl_sm90:nvgemm_cutedsl_sm90_w4a16_mma_t8x128x256_w4_s4_pdl")
    assert not _is_pdl_kernel("backend:emulated")
    for gpu, pdl in (("RTX5090", True), ("L40S", False), ("A100", False)):
        with fake_cuda_device(gpu):
            assert _is_pdl_kernel("backend:cutedsl_mma_w4a16") == pdl, gpu
