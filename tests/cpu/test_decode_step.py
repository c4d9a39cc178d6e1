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
        ds.decode_step("Llama-3.1-8B", "A100")
    with pytest.raises(ValueError, match="--tp 3"):
        ds.decode_step("Llama-3.1-8B", "B200", tp=3)
    with pytest.raises(ValueError, match="--layers"):
        ds.decode_step("Llama-3.1-8B", "B200", layers=0)


@pytest.mark.parametrize("gpu,fmt", [("H200", "sm90_w4a16"), ("B200", "sm100")])
def test_quantized_lm_head_is_an_nvgemm_gemm(gpu, fmt):
    """--quantize-lm-head: the head's GEMM in the generated code is nvgemm's NVFP4 kernel in the GPU's format
    (held in the sm90 layout on Hopper), no cuBLAS mm is left, and the roofline counts NVFP4 head bytes."""
    launches, _ = ds.replay(ds.head_graph(P, gpu, quantize_lm_head=True), gpu)
    gemms = [k for k in launches if k.kind == "gemm"]
    assert len(gemms) == 1 and gemms[0].origin.startswith("nvgemm::") and fmt in gemms[0].name, gemms
    assert gemms[0].gemm["n"] == P.vocab and gemms[0].gemm["k"] == P.hidden
    assert ds._weight_bytes(P, 1, True)[1] == P.vocab * P.hidden * (0.5 + 1 / 16)
