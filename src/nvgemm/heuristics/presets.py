"""Model presets: the per-layer linear GEMM shapes (N = output features, K = input features) of
one transformer layer, from each model's published Hugging Face ``config.json``.

Fused projections as serving stacks run them: ``qkv`` = q, k and v stacked
((heads + 2 * kv_heads) * head_dim outputs), ``gate_up`` = gate and up stacked (2 * intermediate).
DeepSeek-V3's dense layers (the first three) use MLA attention: ``qkv_a`` = q_a_proj (1536) and
kv_a_proj_with_mqa (512 + 64) stacked, then ``q_b`` and ``kv_b``; its ``o`` takes
128 heads x v_head_dim 128.

MoE presets (:class:`MoePreset`) describe one MoE layer: routed experts, shared experts, attention,
and the expected routing at decode (active experts and tokens per active expert by M, uniform routing).
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

@dataclass(frozen=True)
class MoePreset:
    """One MoE layer: routed experts (gated: gate_up [2I, H], down [H, I] each), optional shared
    experts (dense NVFP4 GEMMs), and the layer's attention GEMMs. Routing statistics assume uniform
    routing: a token picks ``top_k`` distinct experts, each of the ``E`` equally likely."""

    name: str
    hidden: int
    expert_intermediate: int
    num_experts: int
    top_k: int
    shared_intermediate: int  # all shared experts together; 0 = none
    attention: tuple[LayerGemm, ...]
    source: str

    def expert_gemms(self) -> tuple[LayerGemm, ...]:
        h, i = self.hidden, self.expert_intermediate
        return LayerGemm("expert.gate_up", 2 * i, h), LayerGemm("expert.down", h, i)

    def dense_gemms(self) -> tuple[LayerGemm, ...]:
        """The layer's non-routed NVFP4 GEMMs (attention, shared experts): every token runs them."""
        shared = ()
        if self.shared_intermediate:
            shared = (LayerGemm("shared.gate_up", 2 * self.shared_intermediate, self.hidden),
                      LayerGemm("shared.down", self.hidden, self.shared_intermediate))
        return self.attention + shared

    def active_experts(self, m: int) -> float:
        """Expected distinct experts hit by ``m`` tokens: ``E * (1 - (1 - k/E)^m)``."""
        e = self.num_experts
        return e * (1.0 - (1.0 - self.top_k / e) ** m)

    def tokens_per_active_expert(self, m: int) -> float:
        """Mean routed tokens per active expert, ``m * k / A(m)`` (>= 1): the M each expert GEMM sees."""
        return m * self.top_k / self.active_experts(m)

    def expert_bytes(self) -> float:
        """NVFP4 bytes of one routed expert (0.5625 B per weight: 4-bit codes + an e4m3 scale per 16)."""
        return 3 * self.hidden * self.expert_intermediate * 0.5625

    def shared_bytes(self) -> float:
        return 3 * self.hidden * self.shared_intermediate * 0.5625


def _gqa(hidden, heads, kv_heads, head_dim) -> tuple[LayerGemm, ...]:
    return (LayerGemm("qkv", (heads + 2 * kv_heads) * head_dim, hidden), LayerGemm("o", hidden, heads * head_dim))


_MLA = (
    LayerGemm("qkv_a", 1536 + 512 + 64, 7168),
    LayerGemm("q_b", 128 * (128 + 64), 1536),
    LayerGemm("kv_b", 128 * (128 + 128), 512),
    LayerGemm("o", 7168, 128 * 128),
)

MOE_PRESETS: dict[str, MoePreset] = {
    p.name: p
    for p in (
        MoePreset("DeepSeek-V3", 7168, 2048, 256, 8, 2048, _MLA,
                  "transformers 5.24 DeepseekV3Config defaults: hidden 7168, 256 routed experts x I 2048, top-8, "
                  "1 shared expert (I 2048), MLA attention (MoE layers 4..61)"),
        MoePreset("Qwen3-30B-A3B", 2048, 768, 128, 8, 0, _gqa(2048, 32, 4, 128),
                  "transformers 5.24 Qwen3MoeConfig defaults: hidden 2048, 128 experts x I 768, top-8, 32 heads / "
                  "4 KV heads; head_dim 128 from the model card (unverified)"),
        MoePreset("Qwen3-235B-A22B", 4096, 1536, 128, 8, 0, _gqa(4096, 64, 4, 128),
                  "hidden 4096, 128 experts x I 1536, top-8, 64 heads / 4 KV heads x 128 (from memory; unverified)"),
        MoePreset("Llama-4-Scout", 5120, 8192, 16, 1, 8192, _gqa(5120, 40, 8, 128),
                  "transformers 5.24 Llama4TextConfig defaults: hidden 5120, 16 experts x I 8192, top-1 (router "
                  "weight on the input), 1 shared expert (I 8192), 40 heads / 8 KV heads x 128"),
        MoePreset("Mixtral-8x7B", 4096, 14336, 8, 2, 0, _gqa(4096, 32, 8, 128),
                  "transformers 5.24 MixtralConfig defaults: hidden 4096, 8 experts x I 14336, top-2, "
                  "32 heads / 8 KV heads x 128"),
    )
}

_MOE_ALIASES = {
    "deepseek-v3-moe": "DeepSeek-V3", "deepseek-r1": "DeepSeek-V3", "qwen3-30b-a3b": "Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen3-235B-A22B", "llama-4-scout": "Llama-4-Scout", "llama4-scout": "Llama-4-Scout",
    "mixtral": "Mixtral-8x7B", "mixtral-8x7b": "Mixtral-8x7B",
}


def get_moe_preset(name: str) -> MoePreset | None:
    """The MoE preset called ``name`` (case-insensitive aliases), or None."""
    key = _MOE_ALIASES.get(name.lower(), name)
    return MOE_PRESETS.get(key)


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
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join([*PRESETS, *MOE_PRESETS])}")
    return PRESETS[key]
