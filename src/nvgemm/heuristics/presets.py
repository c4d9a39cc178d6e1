"""Model presets: the per-layer linear GEMM shapes (N = output features, K = input features) of
one transformer layer, from each model's published Hugging Face ``config.json``.

Fused projections as serving stacks run them: ``qkv`` = q, k and v stacked
((heads + 2 * kv_heads) * head_dim outputs), ``gate_up`` = gate and up stacked (2 * intermediate).
DeepSeek-V3's dense layers (the first three) use MLA attention: ``qkv_a`` = q_a_proj (1536) and
kv_a_proj_with_mqa (512 + 64) stacked, then ``q_b`` and ``kv_b``; its ``o`` takes
128 heads x v_head_dim 128.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerGemm:
    name: str
    n: int
    k: int


@dataclass(frozen=True)
class ModelPreset:
    name: str
    layers: tuple[LayerGemm, ...]
    source: str


def _dense(name, hidden, heads, kv_heads, head_dim, inter, source) -> ModelPreset:
    return ModelPreset(
        name,
        (
            LayerGemm("qkv", (heads + 2 * kv_heads) * head_dim, hidden),
            LayerGemm("o", hidden, heads * head_dim),
            LayerGemm("gate_up", 2 * inter, hidden),
            LayerGemm("down", hidden, inter),
        ),
        source,
    )


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        _dense("Llama-3.1-8B", 4096, 32, 8, 128, 14336, "hidden 4096, 32 heads / 8 KV heads x 128, intermediate 14336"),
        _dense("Llama-3.3-70B", 8192, 64, 8, 128, 28672, "hidden 8192, 64 heads / 8 KV heads x 128, intermediate 28672"),
        _dense("Qwen3-32B", 5120, 64, 8, 128, 25600, "hidden 5120, 64 heads / 8 KV heads x 128, intermediate 25600"),
        _dense("Mistral-7B", 4096, 32, 8, 128, 14336, "hidden 4096, 32 heads / 8 KV heads x 128, intermediate 14336"),
        ModelPreset(
            "DeepSeek-V3-dense",
            (
                LayerGemm("qkv_a", 1536 + 512 + 64, 7168),
                LayerGemm("q_b", 128 * (128 + 64), 1536),
                LayerGemm("kv_b", 128 * (128 + 128), 512),
                LayerGemm("o", 7168, 128 * 128),
                LayerGemm("gate_up", 2 * 18432, 7168),
                LayerGemm("down", 7168, 18432),
            ),
            "hidden 7168, MLA (q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, 128 heads), dense intermediate 18432",
        ),
    )
}

_ALIASES = {
    "llama-3.1-8b": "Llama-3.1-8B",
    "llama3.1-8b": "Llama-3.1-8B",
    "llama-3.3-70b": "Llama-3.3-70B",
    "llama3.3-70b": "Llama-3.3-70B",
    "qwen3-32b": "Qwen3-32B",
    "mistral-7b": "Mistral-7B",
    "deepseek-v3": "DeepSeek-V3-dense",
    "deepseek-v3-dense": "DeepSeek-V3-dense",
}


def get_preset(name: str) -> ModelPreset:
    key = _ALIASES.get(name.lower(), name)
    if key not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[key]
