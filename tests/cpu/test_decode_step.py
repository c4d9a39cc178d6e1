"""The kernels of one Llama-3.1-8B decoder layer at batch-1 decode, counted from Inductor's generated code.

``nvgemm bench decode-step`` (:mod:`nvgemm.cli.decode_step`) generates the layer's CUDA code on a fake
B200 / H200 (no GPU), replays the wrapper and expands every ``nvgemm::`` op by running its host launcher
with each device launch recorded. The pinned lists below are what the code produces today, one entry per
kernel, in launch order: **the one place to update** when a helper kernel leaves a launcher or a fusion
lands in the compile path (the tests print the new list on failure).

Kinds: ``triton`` Inductor's generated kernels and nvgemm's Triton quantizer, ``gemm`` the CuTeDSL GEMMs
(the AOT kernel's launch), ``attention`` flash attention, ``helper`` an ATen kernel a launcher runs.
"""

from __future__ import annotations

import pytest
import torch

from nvgemm.cli import decode_step as ds

P = ds.DECODE_PRESETS["Llama-3.1-8B"]

#: B200, W4A4, the checkpoint layout (the loader's default): 19 kernels per layer (alpha is derived once per
#: layer, not launched per call). The layer rewrites of the capture pass: each W4A4 GEMM fed by an RMSNorm takes
#: its activation from a fused norm + NVFP4 quantizer (nvgemm::rmsnorm_quantize_nvfp4, one Triton kernel), one
#: per distinct input_scale -- q, k, v and gate, up each hold their own here, so the norm runs once per GEMM;
#: the residual adds ride the o_proj and down_proj epilogues. o_proj (fed by attention) and down_proj (fed by
#: Inductor's SiLU * up) quantize their own input inside their op.
B200_W4A4_CHECKPOINT = (
    ("triton", "v_proj: input RMSNorm + NVFP4 quantize (nvgemm fused quantizer)"),
    ("gemm", "v_proj: CuTeDSL sm100 W4A4 GEMM (nvfp4_linear_prequant)"),
    ("triton", "write of v into the KV cache slot (Inductor)"),
    ("triton", "k_proj: input RMSNorm + quantize"), ("gemm", "k_proj: GEMM (prequant)"),
    ("triton", "RoPE of k + write of k into the KV cache slot (Inductor)"),
    ("triton", "q_proj: input RMSNorm + quantize"), ("gemm", "q_proj: GEMM (prequant)"),
    ("triton", "RoPE of q (Inductor)"),
    ("attention", "flash attention over the 1k cache"),
    ("triton", "o_proj: activation quantize (nvgemm Triton quantizer, in the launcher)"),
    ("gemm", "o_proj: GEMM + residual in the epilogue"),
    *[k for proj in ("gate_proj", "up_proj") for k in (
        ("triton", f"{proj}: post-attention RMSNorm + quantize (of o_proj's output, residual included)"),
        ("gemm", f"{proj}: GEMM (prequant)"))],
    ("triton", "SiLU(gate) * up (Inductor)"),
    ("triton", "down_proj: activation quantize"), ("gemm", "down_proj: GEMM + residual in the epilogue"),
)

#: H200, W4A16, the checkpoint layout held in the sm90 layout (the loader on Hopper): 14 kernels per layer. The
#: residual adds ride the o_proj and down_proj epilogues (no add kernel; the post-attention RMSNorm reads o_proj's
#: output); W4A16 GEMMs read bf16, so the norms stay Inductor's.
H200_W4A16_CHECKPOINT = (
    ("triton", "input RMSNorm"),
    ("gemm", "q_proj: CuTeDSL sm90 W4A16 GEMM (nvfp4_linear_sm90_prepared, an autotuned choice)"),
    ("gemm", "k_proj"),
    ("triton", "RoPE of k + KV cache write"),
    ("gemm", "v_proj"),
    ("triton", "v cache write"),
    ("triton", "RoPE of q"),
    ("attention", "flash attention"),
    ("gemm", "o_proj + residual in the epilogue"),
    ("triton", "post-attention RMSNorm"),
    ("gemm", "gate_proj"), ("gemm", "up_proj"),
    ("triton", "SiLU(gate) * up"),
    ("gemm", "down_proj + residual in the epilogue"),
)

EXPECTED = {"B200": B200_W4A4_CHECKPOINT, "H200": H200_W4A16_CHECKPOINT}

#: B200, W4A4, the fused layout (one qkv and one gate_up GEMM, the loader's default where the shards share
#: input_scale): 9 kernels per layer. RoPE of q and k and the KV-cache write of k and v are one launch,
#: nvgemm::rope_kv_write: the capture pass's rewrite of the layer's torch RoPE + index_copy_ chain on the fused
#: qkv output (integrations/inductor/rope_kv.py; Inductor alone needs three kernels).
B200_W4A4_FUSED = (
    ("triton", "input RMSNorm + NVFP4 quantize (nvgemm fused quantizer)"),
    ("gemm", "qkv: CuTeDSL sm100 W4A4 GEMM (nvfp4_linear_prequant)"),
    ("triton", "RoPE of q and k + KV-cache write of k and v (nvgemm::rope_kv_write)"),
    ("attention", "flash attention over the 1k cache"),
    ("triton", "o_proj: activation quantize (in the launcher)"),
    ("gemm", "o_proj: GEMM + residual in the epilogue"),
    ("triton", "post-attention RMSNorm + quantize"),
    ("gemm", "gate_up: GEMM + SwiGLU + NVFP4 requant in the epilogue (nvfp4_linear_prequant_requant)"),
    ("gemm", "down_proj: GEMM (prequant) + residual in the epilogue"),
)
#: H200, W4A16, the fused layout held in the sm90 layout: 8 kernels per layer.
H200_W4A16_FUSED = (
    ("triton", "input RMSNorm (Inductor)"),
    ("gemm", "qkv: CuTeDSL sm90 W4A16 GEMM"),
    ("triton", "RoPE of q and k + KV-cache write (nvgemm::rope_kv_write)"),
    ("attention", "flash attention"),
    ("gemm", "o_proj + residual in the epilogue"),
    ("triton", "post-attention RMSNorm (Inductor)"),
    ("gemm", "gate_up + SwiGLU in the epilogue"),
    ("gemm", "down_proj + residual in the epilogue"),
)
FUSED_EXPECTED = {"B200": B200_W4A4_FUSED, "H200": H200_W4A16_FUSED}


@pytest.fixture(scope="module")
def graphs():
    """The generated code of one layer per GPU (one compile each, shared by the tests here)."""
    return {gpu: ds.layer_graph(P, gpu) for gpu in EXPECTED}


def _listing(launches) -> str:
    return "\n".join(f"  {k.kind:9s} {k.name}  [{k.origin}]" for k in launches)


@pytest.mark.parametrize("gpu", sorted(EXPECTED))
def test_layer_kernels_pinned(graphs, gpu):
    launches, syncs = ds.replay(graphs[gpu], gpu)
    kinds = [k.kind for k in launches]
    want = [k for k, _ in EXPECTED[gpu]]
    assert kinds == want, f"{gpu}: {len(kinds)} kernels per layer (pinned {len(want)}); now:\n{_listing(launches)}"
    assert not syncs
    gemms = [k for k in launches if k.kind == "gemm"]
    # every GEMM of the layer, with the real shapes (N, K), at batch 1
    nk = sorted((k.gemm["n"], k.gemm["k"]) for k in gemms)
    assert nk == sorted([(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (14336, 4096),
                         (4096, 14336)])
    assert all(k.gemm["m"] == 1 for k in gemms)
    arch = "sm_100a" if gpu == "B200" else "sm_90a"
    assert all(k.gemm["arch"] == arch for k in gemms)


@pytest.fixture(scope="module")
def fused_graphs():
    return {gpu: ds.layer_graph(P, gpu, layout="fused") for gpu in FUSED_EXPECTED}


@pytest.mark.parametrize("gpu", sorted(FUSED_EXPECTED))
def test_fused_layer_kernels_pinned(fused_graphs, gpu):
    """The per-layer targets: <= 9 kernels on B200 W4A4, <= 8 on H200 W4A16, attention included."""
    launches, syncs = ds.replay(fused_graphs[gpu], gpu)
    kinds = [k.kind for k in launches]
    want = [k for k, _ in FUSED_EXPECTED[gpu]]
    assert kinds == want, f"{gpu}: {len(kinds)} kernels per layer (pinned {len(want)}); now:\n{_listing(launches)}"
    assert not syncs  # rope_kv_write's position check (a host sync) is skipped under capture
    rope = launches[2]
    assert rope.name == "rope_kv_write_kernel" and rope.origin == "nvgemm::rope_kv_write launcher" and rope.pdl
    # bytes: the qkv row, q, this position's cos / sin rows and the two cache slots -- not the 4 MB cache
    assert rope.bytes == 6144 * 2 + 4096 * 2 + 2 * 128 * 2 + 8 + 2 * 1024 * 2
    nk = sorted((k.gemm["n"], k.gemm["k"]) for k in launches if k.kind == "gemm")
    assert nk == sorted([(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])


def test_without_the_rope_rewrite_the_layer_misses_the_target(monkeypatch):
    """Mutation: the capture pass without its RoPE + KV-write rewrite leaves the chain to Inductor's three kernels:
    11 per layer on B200, above the pinned 9."""
    from nvgemm.integrations.inductor import rope_kv

    monkeypatch.setattr(rope_kv, "fuse_rope_kv_write", lambda graph, set_val: 0)
    launches, _ = ds.replay(ds.layer_graph(P, "B200", layout="fused"), "B200")
    assert len(launches) == len(B200_W4A4_FUSED) + 2, _listing(launches)
    assert sum(k.origin == "inductor" and k.kind == "triton" for k in launches) == 3


def test_helper_launch_in_a_launcher_is_counted(graphs, monkeypatch):
    """Mutation: a per-call helper kernel re-added to the sm100 host launcher (a copy of alpha) shows up once per
    GEMM, with no change to the generated code: the count comes from the launcher's code path."""
    from nvgemm.templates.sm100_w4a4 import launch

    base, _ = ds.replay(graphs["B200"], "B200")
    orig = launch.alpha_vector  # the per-call accessor of the derived alpha
    monkeypatch.setattr(launch, "alpha_vector", lambda *a, **k: orig(*a, **k).clone())
    mutated, _ = ds.replay(graphs["B200"], "B200")
    assert len(mutated) == len(base) + 7, _listing(mutated)
    assert sum(k.name == "aten.clone" for k in mutated) == 7


def test_removing_an_inductor_fusion_changes_the_count(monkeypatch):
    """Mutation: with Inductor's kernel fusion off, the same layer needs more kernels than pinned (the count is
    read from the scheduler's output, not from a hand list)."""
    orig = ds.generate_cuda_code

    def no_fusion(fn, inputs, gpu="B200", config_patches=None):
        return orig(fn, inputs, gpu=gpu, config_patches={**(config_patches or {}), "max_fusion_size": 1})

    monkeypatch.setattr(ds, "generate_cuda_code", no_fusion)
    launches, _ = ds.replay(ds.layer_graph(P, "H200"), "H200")
    assert len(launches) > len(H200_W4A16_CHECKPOINT), _listing(launches)


def test_model_figures_and_json(graphs, tmp_path):
    """The per-kernel model and the report's keys, on the pinned B200 layer (head not compiled: a stand-in)."""
    launches, _ = ds.replay(graphs["B200"], "B200")
    for k in launches:
        ds.model_launch(k, "B200")
        assert 0 < k.us[0] <= k.us[1], k
    gemm_us = sum(k.mid_us for k in launches if k.kind == "gemm")
    # the GEMMs stream 108 MB of NVFP4 weights per layer: above the 8 TB/s byte floor, below 10x it
    floor = sum(k.bytes for k in launches if k.kind == "gemm") / 8e12 * 1e6
    assert floor < gemm_us < 10 * floor
    att = next(k for k in launches if k.kind == "attention")
    assert att.attention["kv_len"] == 1024 and att.attention["kv_heads"] == 8
    assert att.bytes >= 2 * 8 * 1024 * 128 * 2  # K and V of the whole cache
    r = ds.StepReport(model=P.name, gpu="B200", format="W4A4", layout="checkpoint", tp=1, layers=32,
                      layer_kernels=launches, head_kernels=[], kernels_per_layer=len(launches),
                      kernels_per_step=32 * len(launches), ms_per_token_model=1.0, ms_per_token_model_range=(0.9, 1.1),
                      roofline_ms=0.6, roofline_fraction=0.6, weight_bytes_per_step=4.98e9, breakdown_us={},
                      goal_ms=1.0)
    j = ds.report_json(r)
    for key in ("kernels_per_layer", "kernels_per_step", "ms_per_token_model", "roofline_fraction", "kernels"):
        assert key in j
    assert len(j["kernels"]) == len(launches) and all("us_model" in k and "pdl" in k for k in j["kernels"])
    assert "model" in ds.report_text(r)


def test_weight_bytes_match_the_published_count():
    """NVFP4 decoder linears 6.98e9 params x 0.5625 B + bf16 lm_head 0.525e9 x 2 B (decode_e2e_anchors.md: 4.98 GB)."""
    nvfp4, lm = ds._weight_bytes(P, 1)
    assert abs((nvfp4 + lm) / 1e9 - 4.98) < 0.01
    assert ds._weight_bytes(ds.DECODE_PRESETS["Llama-3.1-70B"], 8)[0] * 8 == pytest.approx(
        ds._weight_bytes(ds.DECODE_PRESETS["Llama-3.1-70B"], 1)[0])


def test_bad_arguments_are_named():
    with pytest.raises(KeyError, match="known"):
        ds.decode_step("Llama-9B", "B200")
    with pytest.raises(KeyError, match="no hardware description"):
        ds.decode_step("Llama-3.1-8B", "V100")
    with pytest.raises(ValueError, match="--tp 3"):
        ds.decode_step("Llama-3.1-8B", "B200", tp=3)
    with pytest.raises(ValueError, match="--layers"):
        ds.decode_step("Llama-3.1-8B", "B200", layers=0)


# --------------------------------------------------------------------------- the W4A16 mma kernel's GPUs
#: On sm_120a (RTX 5090) and sm_89 (L40S) the loader holds the layers in the same prepared layout and the mma
#: kernel (backend cutedsl_mma_w4a16) serves them: the H200 layer's kernels, the GEMMs compiled for the GPU's arch,
#: PDL on sm_120a (griddepcontrol) and none on sm_89.
MMA_GPUS = {"RTX5090": ("sm_120a", True), "L40S": ("sm_89", False)}


@pytest.mark.parametrize("gpu", sorted(MMA_GPUS))
def test_mma_gpu_layer_kernels(gpu):
    arch, pdl = MMA_GPUS[gpu]
    launches, syncs = ds.replay(ds.layer_graph(P, gpu), gpu)
    kinds = [k.kind for k in launches]
    want = [k for k, _ in H200_W4A16_CHECKPOINT]
    assert kinds == want, f"{gpu}: {len(kinds)} kernels per layer (pinned {len(want)}); now:\n{_listing(launches)}"
    assert not syncs
    gemms = [k for k in launches if k.kind == "gemm"]
    assert all(k.gemm["arch"] == arch and k.gemm["config"].family == "mma" for k in gemms), _listing(gemms)
    assert all(k.pdl == pdl and k.gemm["config"].pdl == pdl for k in gemms), _listing(gemms)
    assert all("nvfp4_linear_sm90_prepared" in k.origin for k in gemms)
    if not pdl:  # no Triton kernel waits on a producer either
        assert not any(k.pdl for k in launches), _listing(launches)


# --------------------------------------------------------------------------- W4A4 on sm_120a / sm_121a
#: ``--format w4a4`` on the consumer-Blackwell GPUs: Inductor's lowering offers the sm120 W4A4 kernels
#: (backend ``cutedsl_sm120``) for every linear of the fused layer -- qkv and down fed by the fused RMSNorm
#: quantizer (prequant), o_proj (quantizes its own activation), gate_up with the SwiGLU + NVFP4 requant
#: epilogue -- compiled for the fake device's arch, PDL on. GB10 after RTX 5090 in one process: the sm120
#: launcher's per-device memo must not carry the first fake device's arch into the second.
SM120_W4A4 = {"RTX5090": "sm_120a", "GB10": "sm_121a"}


@pytest.mark.parametrize("gpu", ["RTX5090", "GB10"])
def test_sm120_w4a4_fused_layer_runs_the_sm120_kernels(gpu):
    from nvgemm.templates.sm120_w4a4.config import Sm120W4A4Config

    g = ds.layer_graph(P, gpu, layout="fused", fmt="w4a4")
    # the generated wrapper calls nvgemm's choice ops with the sm120 backend (Inductor's lowering chose it)
    assert g.code.count("'backend:cutedsl_sm120") == 4, g.code
    assert "nvfp4_linear_prequant_requant_choice" in g.code and "cutedsl_mma_w4a16" not in g.code
    launches, syncs = ds.replay(g, gpu)
    assert not syncs
    gemms = [k for k in launches if k.kind == "gemm"]
    assert [(k.gemm["m"], k.gemm["n"], k.gemm["k"]) for k in gemms] == [
        (1, 6144, 4096), (1, 4096, 4096), (1, 2 * 14336, 4096), (1, 4096, 14336)], _listing(gemms)
    assert all(isinstance(k.gemm["config"], Sm120W4A4Config) and k.gemm["arch"] == SM120_W4A4[gpu]
               and k.pdl and k.gemm["config"].pdl for k in gemms), _listing(gemms)
    assert gemms[2].gemm["epilogue"] == "silu_mul"
    assert all("sm90" not in k.origin for k in launches), _listing(launches)


def test_sm120_w4a4_step_model_and_refusals():
    r = ds.decode_step("Llama-3.1-8B", "RTX5090", layers=2, layout="fused", fmt="w4a4")
    assert r.format == "W4A4" and r.kernels_per_layer == 10
    # every GEMM priced by the perfmodel (the sm120 facts), none by the bytes + launch fallback
    gemms = [k for k in r.layer_kernels if k.kind == "gemm"]
    assert len(gemms) == 4 and all("no perfmodel facts" not in k.note for k in gemms)
    assert ds.decode_step("Llama-3.1-8B", "RTX5090", layers=1).format == "W4A16"  # auto keeps the mma kernel
    with pytest.raises(ValueError, match="runs W4A16 on H200"):
        ds.decode_step("Llama-3.1-8B", "H200", layers=1, fmt="w4a4")
    with pytest.raises(ValueError, match="W4A16 / W4A4 on RTX5090"):
        ds.decode_step("Llama-3.1-8B", "RTX5090", layers=1, fmt="fp8")


def test_sm120_w4a4_moe_layer_runs_the_sm120_grouped_kernels():
    """Qwen3-30B-A3B with ``--format w4a4`` on an RTX 5090: the routed experts go through Inductor's
    ``nvfp4_moe`` choice with backend ``cutedsl_sm120_moe``; its launcher runs the two grouped sm120 GEMMs
    (GEMM1 gated over 2 x 768 rows, K = 2048; GEMM2 2048 rows, K = 768) for sm_120a, priced by the sm120 MoE
    family's model on the routed experts' bytes (8 of 128 experts at M = 1)."""
    from nvgemm.templates.sm120_moe.config import Sm120MoeConfig

    q = ds.DECODE_PRESETS["Qwen3-30B-A3B"]
    g = ds.layer_graph(q, "RTX5090", fmt="w4a4")
    assert "'backend:cutedsl_sm120_moe'" in g.code
    launches, syncs = ds.replay(g, "RTX5090")
    assert not syncs
    moe = [k for k in launches if k.kind == "gemm" and k.gemm.get("moe")]
    assert [(k.gemm["n"], k.gemm["k"], k.gemm["epilogue"]) for k in moe] == [(1536, 2048, "silu_mul"),
                                                                            (2048, 768, "none")], _listing(moe)
    assert all(isinstance(k.gemm["config"], Sm120MoeConfig) and k.gemm["arch"] == "sm_120a" and k.pdl for k in moe)
    dense = [k for k in launches if k.kind == "gemm" and not k.gemm.get("moe") and not k.gemm.get("cublas")]
    assert len(dense) == 4 and all(k.gemm["config"].name().startswith("nvgemm_cutedsl_sm120_w4a4") for k in dense)
    for k in moe:
        ds.model_launch(k, "RTX5090")
        active = 128 * (1 - (1 - 8 / 128) ** 1)  # uniform routing, one token: its 8 distinct experts
        assert k.bytes == int(active * k.gemm["n"] * k.gemm["k"] * 0.5625) and "sm120 family model" in k.note
        assert k.bytes / 1.792e12 * 1e6 < k.us[0] < k.us[1]  # above the byte floor at the peak bandwidth


def test_mma_gpu_refuses_moe_presets_by_name(capsys):
    with pytest.raises(ValueError, match="no grouped MoE kernel for RTX5090"):
        ds.decode_step("Qwen3-30B-A3B", "RTX5090")
    from nvgemm.cli import main

    assert main(["bench", "decode-step", "--model", "Qwen3-30B-A3B", "--gpu", "L40S", "--no-measure"]) == 2
    assert "MoE preset" in capsys.readouterr().err


@pytest.mark.parametrize("gpu,fmt", [("H200", "sm90_w4a16"), ("B200", "sm100")])
def test_quantized_lm_head_is_an_nvgemm_gemm(gpu, fmt):
    """--quantize-lm-head: the head's GEMM in the generated code is nvgemm's NVFP4 kernel in the GPU's format
    (held in the sm90 layout on Hopper), no cuBLAS mm is left, and the roofline counts NVFP4 head bytes."""
    launches, _ = ds.replay(ds.head_graph(P, gpu, quantize_lm_head=True), gpu)
    gemms = [k for k in launches if k.kind == "gemm"]
    assert len(gemms) == 1 and gemms[0].origin.startswith("nvgemm::") and fmt in gemms[0].name, gemms
    assert gemms[0].gemm["n"] == P.vocab and gemms[0].gemm["k"] == P.hidden
    assert ds._weight_bytes(P, 1, True)[1] == P.vocab * P.hidden * (0.5 + 1 / 16)


# ---------------------------------------------------------------------------------------------- MoE

Q = ds.DECODE_PRESETS["Qwen3-30B-A3B"]

#: Qwen3-30B-A3B's attention half (q/k norm, GQA 32/4 x 128), checkpoint layout, then the routed-expert MLP.
_QWEN_ROUTER = (
    ("triton", "residual add + post-attention RMSNorm (Inductor)"),
    ("gemm", "router: bf16 [128, 2048] gate (cuBLAS)"),
    ("triton", "softmax in fp32 (Inductor)"),
    ("helper", "top-8 (aten.topk fallback)"),
    ("triton", "top-k ids -> int32 (Inductor)"),
    ("triton", "top-k weights renormalised (Inductor)"),
)
#: The routed experts at batch 1 (nvgemm::nvfp4_moe's launcher): the one prep kernel, GEMM1 (+SwiGLU, +NVFP4
#: requant on B200), GEMM2 with the top-k finalize in its last CTA per row tile.
MOE_CALL = (("triton", "prep: work list + per-slot activations (+ NVFP4 on B200, scale padding)"),
            ("gemm", "GEMM1: grouped gate/up"), ("gemm", "GEMM2: grouped down + top-k finalize"))
#: H200, one token: no work list (the grouped kernels read the routing from the ids).
MOE_CALL_H200 = (("gemm", "GEMM1"), ("gemm", "GEMM2 + finalize"))

#: B200 W4A4, Qwen3-30B-A3B: 22 kernels per layer (the routed experts 3 of them). k/v/q each: the input RMSNorm
#: fused with the activation quantize, the prequant GEMM, one Inductor kernel (q/k norm, RoPE, KV cache writes).
QWEN_B200 = (
    *[k for proj in ("k_proj", "v_proj", "q_proj") for k in (
        ("triton", f"{proj}: input RMSNorm + activation quantize"), ("gemm", f"{proj}: GEMM (prequant)"),
        ("triton", f"after {proj}: q/k norm, RoPE, KV cache write (Inductor)"))],
    ("attention", "flash attention"),
    ("triton", "o_proj: activation quantize"), ("gemm", "o_proj: GEMM"),
    *_QWEN_ROUTER, *MOE_CALL,
    ("triton", "residual add"),
)
#: H200 W4A16, Qwen3-30B-A3B (attention linears held in the sm90 layout): 18 kernels per layer.
QWEN_H200 = (
    ("triton", "input RMSNorm"), ("gemm", "k_proj"), ("gemm", "v_proj"),
    ("triton", "k norm + RoPE of k + KV cache write"), ("triton", "v cache write"),
    ("gemm", "q_proj"), ("triton", "q norm + RoPE of q"), ("attention", "flash attention"), ("gemm", "o_proj"),
    *_QWEN_ROUTER, *MOE_CALL_H200,
    ("triton", "residual add"),
)
QWEN_EXPECTED = {"B200": QWEN_B200, "H200": QWEN_H200}


@pytest.fixture(scope="module")
def qwen_graphs():
    return {gpu: ds.layer_graph(Q, gpu) for gpu in QWEN_EXPECTED}


@pytest.mark.parametrize("gpu", sorted(QWEN_EXPECTED))
def test_moe_layer_kernels_pinned(qwen_graphs, gpu):
    """Qwen3-30B-A3B: one layer's kernels from the generated code, the MoE block expanded by nvfp4_moe's launcher."""
    launches, syncs = ds.replay(qwen_graphs[gpu], gpu)
    kinds = [k.kind for k in launches]
    want = [k for k, _ in QWEN_EXPECTED[gpu]]
    assert kinds == want, f"{gpu}: {len(kinds)} kernels per layer (pinned {len(want)}); now:\n{_listing(launches)}"
    assert not syncs  # nvfp4_moe's id range check (a host sync) is skipped under capture
    moe = [k for k in launches if k.origin.startswith("nvgemm::nvfp4_moe")]
    assert len(moe) == len(MOE_CALL if gpu == "B200" else MOE_CALL_H200)
    grouped = [k for k in moe if k.kind == "gemm"]
    fam = "sm100_moe_nvfp4" if gpu == "B200" else "sm90_moe_mma"
    assert [(k.gemm["n"], k.gemm["k"]) for k in grouped] == [(2 * 768, 2048), (2048, 768)]
    assert all(k.gemm["moe"] == {"family": fam, "top_k": 8, "experts": 128} and k.gemm["m"] == 1 for k in grouped)


_QWEN_M1, _DSV3_TP8_M1, _QWEN_M16 = (1, 8, 128, 2048, 768), (1, 8, 256, 7168, 256), (16, 8, 128, 2048, 768)
#: the H200 launcher's one-time weight preparation (per expert, on FakeTensors) takes minutes for 256 experts
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("gpu,shape", [
    pytest.param("B200", _QWEN_M1, id="B200-qwen3-30b-a3b-m1"),
    pytest.param("B200", _DSV3_TP8_M1, id="B200-deepseek-v3-tp8-m1"),
    pytest.param("B200", _QWEN_M16, id="B200-qwen3-30b-a3b-m16"),
    pytest.param("H200", _QWEN_M1, id="H200-qwen3-30b-a3b-m1"),
    pytest.param("H200", _DSV3_TP8_M1, id="H200-deepseek-v3-tp8-m1", marks=_SLOW),
    pytest.param("H200", _QWEN_M16, id="H200-qwen3-30b-a3b-m16", marks=_SLOW),
])
def test_moe_call_launches_at_decode(gpu, shape):
    """One nvfp4_moe call at decode launches the prep and the two grouped GEMMs, GEMM2 running the top-k
    finalize (3) up to ``FUSED_FINALIZE_MAX_TOKENS`` tokens -- on H200 one token needs no prep (2); at 16 tokens
    the finalize is its own kernel (4, up to 128 routed pairs). A helper that comes back into the launcher (a zero fill, a gather, the work list
    as its own kernel) fails this."""
    from nvgemm.templates.sm90_moe.config import FUSED_FINALIZE_MAX_TOKENS

    launches = ds.moe_call_launches(gpu, *shape)
    fused = shape[0] <= FUSED_FINALIZE_MAX_TOKENS
    direct = gpu == "H200" and shape[0] == 1  # sm90, one token: the ids are the work list
    want = ([] if direct else ["triton"]) + ["gemm", "gemm"] + ([] if fused else ["triton"])
    assert [k.kind for k in launches] == want, _listing(launches)
    prep = [] if direct else ["_moe_prep_kernel" if gpu == "B200" else "_prep_kernel"]
    assert [k.name for k in launches if k.kind == "triton"] == prep + ([] if fused else ["_finalize_kernel"])
    gemm2 = [k for k in launches if k.kind == "gemm"][1]
    assert ("_fin_" in gemm2.name) == fused and ("_dir_" in gemm2.name) == direct, gemm2.name


def test_moe_call_launches_above_the_fused_prep():
    """Above 128 routed pairs the sm100 prep takes the work-list kernel first and gathers the output rows: 6."""
    launches = ds.moe_call_launches("B200", 17, 8, 128, 2048, 768)
    assert [k.name for k in launches if k.kind != "gemm"] == ["_prep_kernel", "_moe_prep_kernel", "aten.index",
                                                               "_finalize_kernel"], _listing(launches)


def test_moe_zero_fill_back_in_the_launcher_is_counted(monkeypatch):
    """Mutation: a zero fill re-added before the prep (GEMM1's input scale atoms zeroed, as the launcher once
    did) is one more launch of the call."""
    from nvgemm.templates.sm100_moe import prep_triton

    orig = prep_triton.moe_prep_triton

    def with_fill(x, *a, **k):
        out = orig(x, *a, **k)
        out.scales.view(torch.uint8).zero_()
        return out

    monkeypatch.setattr(prep_triton, "moe_prep_triton", with_fill)
    launches = ds.moe_call_launches("B200", 1, 8, 128, 2048, 768)
    assert len(launches) == len(MOE_CALL) + 1 and launches[1].name == "aten.zero_", _listing(launches)


def test_moe_routed_experts_model_and_bytes():
    """The MoE preset's weight bytes (attention NVFP4 + top-8 experts + bf16 router per layer) and the routed
    experts' modelled share of their byte floor, recomputed from the per-kernel model."""
    nvfp4, lm = ds._weight_bytes(Q, 1)
    per_layer = (2048 * (4096 + 2 * 512) + 4096 * 2048 + 8 * 3 * 2048 * 768) * 0.5625 + 2 * 128 * 2048
    assert nvfp4 == pytest.approx(48 * per_layer) and lm == 2 * 151936 * 2048
    launches = ds.moe_call_launches("B200", 1, 8, 128, 2048, 768)
    for k in launches:
        ds.model_launch(k, "B200")
        assert 0 < k.us[0] <= k.us[1], k
    grouped = [k for k in launches if k.kind == "gemm"]
    # the two grouped GEMMs read the 8 routed experts' NVFP4 weights (gate/up then down)
    assert sum(k.bytes for k in grouped) == pytest.approx(8 * 3 * 2048 * 768 * 0.5625, rel=1e-6)
    e = ds._routed_experts(Q, 1, "B200", launches)
    assert e["launches"] == 3 and e["gemms"] == 2
    assert e["floor_fraction_model"] == pytest.approx(e["floor_us"] / sum(k.mid_us for k in launches), rel=1e-3)
