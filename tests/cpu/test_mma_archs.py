"""The W4A16 ``mma`` decode kernel off Hopper (sm_80 / sm_86 / sm_89 / sm_120a / sm_121a), on CPU with the
device faked the way the sm90 / sm100 host-path tests fake it (:func:`nvgemm.testing.host_path_stand_in`:
CPU problems read as if on a GPU of the given capability, the real host path, only the launch replaced):

* backend ``cutedsl_mma_w4a16`` takes exactly those capabilities, ``cutedsl_sm90`` keeps Hopper;
* ``nvfp4_linear``, a layer held in the prepared layout (``nn.linear.prepare_for_sm90`` ->
  ``nvgemm::nvfp4_linear_sm90_prepared``) and the serving plugins' warm-up (vLLM / SGLang selection,
  ``integrations.serving``) select it on a forced sm_120 / sm_89 / sm_121 / sm_80 device, and the kernel
  they load is compiled for that arch (PDL exactly where the arch has ``griddepcontrol``);
* the policy offers only configs that arch can compile (no wgmma off Hopper, no PDL before sm_90, the
  arch's shared memory);
* the hardware profiles and targets of the new GPUs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.core.problem import GemmProblem, Target
from nvgemm.core.validation import LinearProblem
from nvgemm.dispatch import registry as B
from nvgemm.dispatch.serving_plan import plan
from nvgemm.heuristics import candidates
from nvgemm.heuristics.perfmodel.hardware import DEFAULT_GPU_OF_ARCH, GPUS, get_hardware
from nvgemm.templates.sm90_w4a16 import backend as sb
from nvgemm.templates.sm90_w4a16.config import ARCH_CAPS, MMA_ARCHS, Sm90W4A16Config as C, arch_problem, mma_smem_bytes
from nvgemm.testing import host_path_stand_in

MMA = "cutedsl_mma_w4a16"
#: capability -> (arch, SM count of its default GPU)
FORCED = {(12, 0): ("sm_120a", 170), (8, 9): ("sm_89", 142), (12, 1): ("sm_121a", 48), (8, 0): ("sm_80", 108),
          (8, 6): ("sm_86", 72)}


def _layer(n, k, seed=0, blocked=True):
    """(weight, block scales -- swizzled as the op takes them, or the checkpoint's [N, K/16] --, global scale)."""
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    return q.packed, to_blocked(q.scale) if blocked else q.scale, q.global_scale.reshape(()).float()


def _problem(cap, m=4, n=256, k=512, **kw):
    return LinearProblem(m=m, n=n, k=k, device_type="cuda", capability=cap, weight_only=True,
                         x_dtype=torch.bfloat16, out_dtype=torch.bfloat16, alpha="scalar", bias=False,
                         activation="none", residual=False, **kw)


def test_policy_candidates_name_the_backend_of_their_arch():
    """``Candidate.backend`` of a W4A16 config is the backend that runs it on the problem's arch: Hopper's
    ``cutedsl_sm90`` on sm_90a, ``cutedsl_mma_w4a16`` on every other arch of the mma kernel."""
    from nvgemm.heuristics import candidates

    for cap, (arch, _sms) in [*FORCED.items(), ((9, 0), ("sm_90a", 132))]:
        cands = candidates(_problem(cap, m=4, n=4096, k=4096))
        assert cands, cap
        want = "cutedsl_sm90" if cap == (9, 0) else MMA
        assert {c.backend for c in cands} == {want} and {c.arch for c in cands} == {arch}, (cap, cands[:2])


def test_backends_split_the_capabilities():
    for cap in FORCED:
        assert sb.supports_mma(_problem(cap)) is None, cap
        assert "sm_90" in sb.supports(_problem(cap))
    assert sb.supports(_problem((9, 0))) is None and "sm_80" in sb.supports_mma(_problem((9, 0)))
    for cap in ((7, 5), (8, 7), (10, 0), (11, 0), None):
        assert sb.supports_mma(_problem(cap)) is not None, cap  # no kernel arch for it: the fallback serves
    assert "CUDA" in sb.supports_mma(replace(_problem((12, 0)), device_type="cpu"))
    assert "multiple of 32" in sb.supports_mma(_problem((8, 9), k=528))


@pytest.mark.parametrize("cap", list(FORCED), ids=[a for a, _ in FORCED.values()])
def test_serving_plan_loads_the_kernel_of_the_device_arch(cap):
    arch, sms = FORCED[cap]
    ch = plan(_problem(cap, m=8, n=4096, k=4096), sm_count=sms)
    assert ch.backend == MMA and ch.spec.arch == arch and ch.config.family == "mma"
    assert ch.config.pdl == ARCH_CAPS[arch].pdl and arch_problem(ch.config, arch) is None
    hop = plan(_problem((9, 0), m=8, n=4096, k=4096), sm_count=132)
    assert hop.backend == "cutedsl_sm90" and hop.spec.arch == "sm_90a" and hop.config.pdl


@pytest.mark.parametrize("cap", [(12, 0), (8, 9)], ids=["sm_120a", "sm_89"])
def test_nvfp4_linear_on_a_forced_arch_runs_the_mma_kernel(cap):
    arch, sms = FORCED[cap]
    w, s, ws2 = _layer(256, 512, seed=1)
    x = torch.randn(13, 512).to(torch.bfloat16)
    with host_path_stand_in("sm90", capability=cap, sms=sms) as rec:
        for _ in range(2):  # the first call and a bound one
            rec.clear()
            torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, None, None, None, "none", None)
            assert B.last_selected() == MMA
            assert rec.events == ["gemm:sm90_w4a16_mma"]


@pytest.mark.parametrize("cap", [(12, 0), (8, 9)], ids=["sm_120a", "sm_89"])
def test_layer_held_in_the_prepared_layout_runs_the_mma_kernel(cap):
    """``prepare_for_sm90`` holds the layer once when the mma backend serves it, and the prepared op runs
    the kernel on those tensors (no checkpoint-layout rebuild)."""
    from nvgemm.nn.linear import NVFP4Linear, prepare_for_sm90

    arch, sms = FORCED[cap]
    w, s, ws2 = _layer(256, 512, seed=2)
    lin = NVFP4Linear(512, 256, bias=False)
    lin.weight.data, lin.weight_scale.data, lin.weight_scale_2.data = w, s, ws2.reshape(lin.weight_scale_2.shape)
    model = torch.nn.Sequential(lin)
    with host_path_stand_in("sm90", capability=cap, sms=sms) as rec:
        held = prepare_for_sm90(model, "bf16")
        assert list(held) == ["0"] and lin.sm90_kind == "bf16"
        rec.clear()
        with _no_warning():
            model(torch.randn(3, 512).to(torch.bfloat16))
        assert B.last_selected() == MMA and rec.events == ["gemm:sm90_w4a16_mma"]


class _no_warning:
    """Fails on any warning (the prepared-layout fallback warns once when another backend serves)."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings(record=True)
        self._log = self._ctx.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        assert not [str(w.message) for w in self._log if "nvgemm" in str(w.message)]


@pytest.mark.parametrize("cap", [(12, 0), (8, 9)], ids=["sm_120a", "sm_89"])
def test_serving_warm_up_selects_the_mma_backend_for_w4a16_checkpoints(cap):
    """The vLLM / SGLang plugins' selection (``integrations.serving``: warm-up selects and runs each (GEMM,
    M); the layer's log line is built from ``describe_choices``) on a W4A16_NVFP4 fused layer."""
    from nvgemm.integrations.serving import describe_choices, plan_gemms, sm90_serve_reason, warm_up

    arch, sms = FORCED[cap]
    w0, s0, a0 = _layer(128, 512, seed=3, blocked=False)
    w1, s1, a1 = _layer(128, 512, seed=4, blocked=False)
    w, s, ws2 = torch.cat([w0, w1]), torch.cat([s0, s1]), torch.stack([a0, a1])
    gemms = plan_gemms(w, s, ws2, None, [128, 128])
    with host_path_stand_in("sm90", capability=cap, sms=sms):
        assert sm90_serve_reason(gemms, 512, torch.device("cpu"), torch.bfloat16, False, [1, 16]) is None
        chosen = warm_up("model.layers.0.mlp.gate_up_proj", w, gemms, None, torch.bfloat16, [1, 8, 16])
    assert {name for _g, _p, name in chosen} == {MMA}
    assert MMA in describe_choices(chosen)


@pytest.mark.parametrize("gpu", ["RTX5090", "RTX5080", "RTXPRO6000", "GB10", "L40S", "RTX4090", "A10", "RTX3090",
                                 "A100"])
def test_policy_offers_only_what_the_arch_compiles(gpu):
    t = Target.from_gpu(gpu)
    assert t.arch in MMA_ARCHS and t.sm_count == GPUS[gpu].sm_count
    for m in (1, 13, 64, 200):
        for act in ("none", "silu_mul"):
            cands = candidates(GemmProblem(n=14336 * (2 if act == "silu_mul" else 1), k=4096, m=m, a_format="bf16",
                                           epilogue=act, target=t), use_nvmmh=False)
            assert cands, (gpu, m, act)
            for c in cands:
                cfg = c.config
                assert cfg.family == "mma" and cfg.pdl == ARCH_CAPS[t.arch].pdl
                assert mma_smem_bytes(cfg) <= ARCH_CAPS[t.arch].smem_optin - 1024
                assert "model" in c.reason  # priced by the performance model on this GPU's profile


def test_arch_rules():
    pdl = C("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True)
    assert "griddepcontrol" in arch_problem(pdl, "sm_89") and arch_problem(pdl, "sm_120a") is None
    big = C("mma", tile_m=32, tile_n=128, tile_k=256, num_warps=4, stages=4)
    assert "shared memory" in arch_problem(big, "sm_120a") and arch_problem(big, "sm_80") is None
    wg = C("wgmma", tile_m=64, tile_n=256, tile_k=128, num_warps=8, stages=4, pdl=True)
    assert "targets" in arch_problem(wg, "sm_120a") and arch_problem(wg, "sm_90a") is None
    for arch in MMA_ARCHS:
        d = sb.default_config(1, arch)
        assert d.family == "mma" and arch_problem(d, arch) is None


@pytest.mark.parametrize("gpu", ["RTX5090", "RTX5080", "RTXPRO6000", "GB10", "L40S", "RTX4090", "A10", "RTX3090",
                                 "A100"])
def test_hardware_profiles(gpu):
    hw = get_hardware(gpu)
    assert hw.arch == Target.from_gpu(gpu).arch and hw.sm_count > 0
    lo, hi = (b / 1e12 for b in hw.achievable_bw_range)
    assert 0.8 * hw.peak_bw_tbs - 1e-9 <= lo <= hi <= hw.peak_bw_tbs
    assert hw.source and "NVIDIA" in hw.source and "issue" not in hw.source.lower()
    assert hw.pdl_saving_us == ((0.3, 0.7) if ARCH_CAPS[hw.arch].pdl else (0.0, 0.0))
    assert hw.smem_per_sm >= ARCH_CAPS[hw.arch].smem_optin
    for arch in MMA_ARCHS:
        assert get_hardware(DEFAULT_GPU_OF_ARCH[arch]).arch == arch
    assert get_hardware("RTX_5090").name == "RTX5090" and Target.from_gpu("DGX_SPARK").arch == "sm_121a"
