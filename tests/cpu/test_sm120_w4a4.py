"""The sm120 W4A4 family on CPU: the config space and ``can_implement`` refusals (with their reasons),
the host launcher against the emulated op, the policy and the ``cutedsl_sm120`` backend's dispatch on a
forced sm_120 / sm_121 capability (no GPU: the problem descriptor carries the capability)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.core.problem import GemmProblem, Target
from nvgemm.core.validation import check_linear_args, problem_of
from nvgemm.templates.sm120_w4a4.config import SMEM_CAPACITY, Sm120W4A4Config as C, config_from_name, smem_bytes, \
    validate_config
from nvgemm.templates.sm120_w4a4.validity import can_implement, can_implement_problem


def test_smem_budget_is_the_sm120_99kb_and_refused_with_the_reason():
    assert SMEM_CAPACITY == 101376  # CuTeDSL SMEM_CAPACITY_MAP["sm_120"] == ["sm_121"] == (100 - 1) * 1024
    from cutlass.cutlass_dsl.cutlass import SMEM_CAPACITY_MAP  # noqa: PLC0415 -- the DSL's own number

    assert SMEM_CAPACITY_MAP["sm_120"] == SMEM_CAPACITY_MAP["sm_121"] == SMEM_CAPACITY
    big = C(tile_m=32, tile_n=256, tile_k=256, num_warps=8, stages=6)
    assert smem_bytes(big) > SMEM_CAPACITY
    st = validate_config(big)
    assert not st and "99 KB" in st.reason and str(smem_bytes(big)) in st.reason
    assert validate_config(C())


@pytest.mark.parametrize("kw,why", [
    (dict(arch="sm_100a"), "arch sm_100a"),
    (dict(k=4112), "multiple of 32"),
    (dict(cluster=(2, 1)), "1x1 clusters"),
    (dict(activation="silu_mul", n=200), "N/2 = 100"),
    (dict(k=512, config=C(tile_k=256, split_k=3)), "split_k=3 exceeds the 2 pipeline stages"),
    (dict(activation="silu_mul", config=C(tile_n=64, num_warps=4)), "even number of row tiles"),
    (dict(config=C(tile_m=12)), "tile_m=12"),
])
def test_can_implement_problem_refuses_with_a_reason(kw, why):
    args = dict(config=C(), m=8, n=256, k=4096, arch="sm_120a")
    args.update(kw)
    cfg = args.pop("config")
    st = can_implement_problem(cfg, **args)
    assert not st and why in st.reason, st.reason


def test_can_implement_on_gemm_problems():
    ok = GemmProblem(n=4096, k=4096, m=8, a_format="nvfp4", b_format="nvfp4", target=Target("sm_121a", 48))
    assert can_implement(ok, C())
    w4a16 = dataclasses.replace(ok, a_format="bf16")
    assert "W4A4" in can_implement(w4a16, C()).reason
    assert "sm_100a" in can_implement(dataclasses.replace(ok, target=Target("sm_100a", 148)), C()).reason


def test_config_names_round_trip():
    for c in (C(), C(tile_m=32, tile_n=64, tile_k=128, num_warps=2, stages=3, split_k=4, pdl=True)):
        assert config_from_name(c.name()) == c
    with pytest.raises(ValueError, match="not an sm120"):
        config_from_name("nvgemm_cutedsl_sm90_w4a16_mma_t8x128x256_w4_s4")


def _layer(m=5, n=256, k=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    ins = (x.float().abs().amax() / 2688).reshape(())
    return x, q.packed, to_blocked(q.scale), q.global_scale.reshape(()), ins


def test_launcher_operands_and_kernel_view_match_the_emulated_op():
    """The launcher quantizes x with nvgemm's convention and computes alpha = ws2 * input_scale; the
    kernel's math on those arguments equals the emulated op (decode + fp32 mm) to fp32 summation order
    and one bf16 rounding (2**-7 relative, the emulator check's RANDOM_RTOL)."""
    from nvgemm.ops.linear import nvfp4_linear_emulated
    from nvgemm.templates.sm120_w4a4.launch import Sm120Workspace, kernel_view_ref, prepare_sm120_args

    x, w, ws, ws2, ins = _layer()
    b = torch.randn(256).to(torch.bfloat16)
    epi = EpilogueSpec(alpha="scalar", bias=True, out_dtype=torch.bfloat16)
    args = prepare_sm120_args(x, w, ws, ws2, ins, b, None, epi, C(split_k=2), workspace=Sm120Workspace(x.device))
    assert args.bias.dtype == torch.float32 and args.alpha.numel() == 1
    assert args.work.numel() >= 2 * 5 * 256 and not args.count.any()
    got = kernel_view_ref(args)
    want = nvfp4_linear_emulated(x, w, ws, ws2, ins, b, None, "none", None)
    assert float((got.float() - want.float()).norm() / want.float().norm()) < 2.0**-7


def test_launcher_refuses_w4a16_and_bad_scales():
    from nvgemm.templates.sm120_w4a4.launch import prepare_sm120_args

    x, w, ws, ws2, ins = _layer()
    epi = EpilogueSpec(alpha="scalar", out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="needs input_scale"):
        prepare_sm120_args(x, w, ws, ws2, None, None, None, epi, C())
    with pytest.raises(ValueError, match="128x4-swizzled"):
        prepare_sm120_args(x, w, ws.reshape(-1)[:-512], ws2, ins, None, None, epi, C())
    with pytest.raises(ValueError, match="cannot run this call"):
        prepare_sm120_args(x, w, ws, ws2, ins, None, None, epi, C(split_k=3))  # K = 512: 2 stages of 256


def test_policy_candidates_are_implementable_and_ranked():
    from nvgemm.heuristics import candidates
    from nvgemm.templates.sm120_w4a4.policy import pick_config, ranked

    for arch, sms in (("sm_120a", 170), ("sm_121a", 48)):
        for m in (1, 8, 16, 32, 64):
            for act in ("none", "silu_mul"):
                p = GemmProblem(n=28672, k=4096, m=m, a_format="nvfp4", b_format="nvfp4", epilogue=act,
                                target=Target(arch, sms))
                cands = candidates(p, use_nvmmh=False)
                assert cands and all(isinstance(c.config, C) and can_implement(p, c.config) for c in cands)
                assert cands[0].config == pick_config(m, 28672, 4096, act, arch, sms)
                times = [sum(r) for _, r in ranked(m, 28672, 4096, act, arch, sms)]
                assert times == sorted(times) or max(times[:2]) - min(times[:2]) < 1e-2
                assert "a model" in cands[0].reason


def test_model_runs_on_the_perfmodel_hardware_profiles():
    """The family's model reads its device numbers from ``heuristics.perfmodel.hardware`` (one source): the
    byte floor is the NVFP4 weight bytes over that profile's optimistic achievable bandwidth, CTAs per SM
    follow its shared memory / thread / CTA limits, a named GPU is used as named, a wrong arch is refused."""
    from nvgemm.heuristics.perfmodel.hardware import GPUS
    from nvgemm.templates.sm120_w4a4.perf import SM120_GPUS, byte_floor_us, ctas_per_sm, device_for, model_us

    assert set(SM120_GPUS) == {"RTX5090", "RTX5080", "RTXPRO6000", "GB10"}
    assert device_for("sm_120a") is GPUS["RTX5090"] and device_for("sm_121a") is GPUS["GB10"]
    assert device_for("sm_120a", gpu="RTXPRO6000") is GPUS["RTXPRO6000"]
    assert device_for("sm_120a", 100).sm_count == 100 and device_for("sm_120a", 100).name == "RTX5090"
    # a device's SM count names its profile (a live RTX 5080 / RTX PRO 6000 reports 84 / 188 SMs)
    assert device_for("sm_120a", 84) is GPUS["RTX5080"] and device_for("sm_120a", 188) is GPUS["RTXPRO6000"]
    for g in SM120_GPUS:
        hw = GPUS[g]
        # 28672 x 4096 NVFP4 weights (0.5625 B/element) at the top of the achievable range, in us
        assert byte_floor_us(1, 28672, 4096, hw) == pytest.approx(28672 * 4096 * 0.5625 / hw.achievable_bw_tbs / 1e6)
        c = C(tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4)
        want = min(hw.smem_per_sm // (smem_bytes(c) + hw.smem_reserved_per_cta), hw.max_threads_per_sm // c.threads,
                   hw.max_ctas_per_sm)
        assert ctas_per_sm(c, hw) == want
        lo = model_us(c, 1, 28672, 4096, hw, end=1)
        assert lo >= byte_floor_us(1, 28672, 4096, hw)
    # the same kernel is modelled slower on the 960 GB/s, 84-SM RTX 5080 than on the 1792 GB/s, 170-SM RTX 5090
    c = C(tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4)
    assert model_us(c, 1, 28672, 4096, GPUS["RTX5080"]) > model_us(c, 1, 28672, 4096, GPUS["RTX5090"])
    with pytest.raises(ValueError, match="GB10 is sm_121a"):
        device_for("sm_120a", gpu="GB10")
    with pytest.raises(ValueError, match="not sm_120a"):
        device_for("sm_90a")


def _problem(**kw):
    x, w, ws, ws2, ins = _layer()
    args = (x, w, ws, ws2, ins, None, None, "none", None)
    p = problem_of(*args[:8], check_linear_args(*args))
    return dataclasses.replace(p, **kw)


@pytest.mark.parametrize("cap", [(12, 0), (12, 1)])
def test_cutedsl_sm120_serves_sm120_and_sm121_and_wins_dispatch(cap):
    from nvgemm.dispatch.registry import backends, choose_backend
    from nvgemm.templates.sm120_w4a4 import backend as sm120

    p = _problem(device_type="cuda", capability=cap)
    assert sm120.supports(p) is None
    chosen = choose_backend(backends(), p, "", "NVGEMM_BACKEND", None, "backend", lambda r: None)
    assert chosen.name == "cutedsl_sm120"
    assert sm120.arch_of(cap) == {(12, 0): "sm_120a", (12, 1): "sm_121a"}[cap]


@pytest.mark.parametrize("kw,why", [
    (dict(device_type="cpu", capability=None), "CUDA device"),
    (dict(device_type="cuda", capability=(10, 0)), "capability 12.0 or 12.1"),
    (dict(device_type="cuda", capability=(9, 0)), "capability 12.0 or 12.1"),
    (dict(device_type="cuda", capability=(12, 0), weight_only=True), "W4A16"),
    (dict(device_type="cuda", capability=(12, 0), k=4112), "multiple of 32"),
])
def test_cutedsl_sm120_refuses_with_a_reason(kw, why):
    from nvgemm.templates.sm120_w4a4 import backend as sm120

    reason = sm120.supports(_problem(**kw))
    assert reason is not None and why in reason, reason


def test_serving_plan_names_the_sm120_kernel_and_its_compile_spec():
    """The serving plan (``nvgemm precompile --vllm`` / ``--sglang`` build from it) of a W4A4 layer on an sm_120 /
    sm_121 device: cutedsl_sm120 with the policy's config, compiled for the device's arch."""
    from nvgemm.core.problem import BACKEND_OF_CONFIG
    from nvgemm.dispatch.serving_plan import plan

    for cap, arch in (((12, 0), "sm_120a"), ((12, 1), "sm_121a")):
        ch = plan(_problem(device_type="cuda", capability=cap))
        assert ch.backend == "cutedsl_sm120" and isinstance(ch.config, C)
        assert ch.spec.arch == arch and ch.spec.template_id == "sm120_nvfp4_gemm" and ch.spec.config == ch.config
    assert BACKEND_OF_CONFIG[C.__name__] == "cutedsl_sm120"


@pytest.mark.parametrize("cap", [(12, 0), (12, 1)])
def test_cutedsl_sm120_serves_the_fused_requant_and_prequant_ops(cap):
    """On capability 12.x the fused gated-MLP ops (requant: the SwiGLU + NVFP4 requant epilogue; prequant: an
    already-quantized activation) take cutedsl_sm120 over the unfused / emulated paths."""
    from nvgemm.core.backend import PREQUANT, REQUANT
    from nvgemm.dispatch.registry import backends, choose_backend

    p = _problem(device_type="cuda", capability=cap, activation="silu_mul")
    for kind in (REQUANT, PREQUANT):
        chosen = choose_backend(backends(kind), p, "", "NVGEMM_FUSED_BACKEND", None, kind, lambda r: None)
        assert chosen.name == "cutedsl_sm120", kind
    from nvgemm.dispatch.registry import registered

    odd = dataclasses.replace(p, n=200)  # I = 100: not whole 16-feature blocks
    assert "N/2 = 100" in registered(REQUANT, "cutedsl_sm120").supports(odd)
