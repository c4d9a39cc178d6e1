"""A tiny NVFP4 Llama decode step (pure torch) for the Inductor tests.

``TinyNvfp4Llama(cfg).decode_step(ids[B], k_cache, v_cache)`` runs one decode token per
sequence against a KV cache of ``T`` past tokens: RMSNorm -> q/k/v (NVFP4) -> RoPE -> GQA
attention over cache + new token -> o (NVFP4) -> residual -> RMSNorm -> SwiGLU MLP (NVFP4
gate/up/down) -> residual; final norm and a bf16 ``lm_head``. ``TinyLlamaConfig(fused=True)`` holds q/k/v and
gate/up as one NVFP4 GEMM each (``NVFP4Linear.fuse``: per-column alpha, one shared ``input_scale``). All batch-dependent shapes come
from ``ids``, so ``torch.compile(dynamic=True)`` serves any batch size with one graph.

Two spellings of each NVFP4 linear (``linear="op"`` / ``"scaled_mm"``):

* ``op``: ``nvgemm.NVFP4Linear`` (``torch.ops.nvgemm.nvfp4_linear``);
* ``scaled_mm``: what torchao-style / hand-written code produces, ``nvgemm.quantize_nvfp4`` ->
  ``torch._scaled_mm(fp4, fp4, swizzled e4m3 scales)`` -> ``* alpha`` (-> ``+ bias``). It only
  runs eagerly on Blackwell GPUs (cuBLASLt); on CPU it runs only after nvgemm's capture pass
  has rewritten it.

Weights are quantized with nvgemm's ModelOpt-exact recipe from a seeded bf16 model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.core.validation import alpha_of
from nvgemm.nn.linear import NVFP4Linear


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab: int = 256
    hidden: int = 128
    intermediate: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    cache_len: int = 8
    qkv_bias: bool = False  # Qwen2-style biases on q/k/v
    weight_only: bool = False  # W4A16 instead of W4A4
    share_input_scales: bool = False  # q/k/v share one input_scale, gate/up another (ModelOpt's fused-export rule)
    fused: bool = False  # hold q/k/v and gate/up as one NVFP4Linear each (NVFP4Linear.fuse; shares the scales)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class ScaledMmNvfp4Linear(nn.Module):
    """NVFP4 linear written as ``quantize -> torch._scaled_mm -> * alpha (+ bias)`` (W4A4 only)."""

    def __init__(self, weight, weight_scale, weight_scale_2, input_scale, bias=None, alpha_form: str = "tensor"):
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("input_scale", input_scale)
        self.register_buffer("alpha", alpha_of(weight_scale_2, input_scale).reshape(()))
        self.register_buffer("bias", bias)
        self.alpha_form = alpha_form
        self.alpha_float = float(self.alpha)

    def forward(self, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        qx, sx = torch.ops.nvgemm.quantize_nvfp4(x2, self.input_scale)
        fp4 = torch.float4_e2m1fn_x2
        y = torch._scaled_mm(qx.view(fp4), self.weight.view(fp4).t(), sx, self.weight_scale,
                             out_dtype=torch.bfloat16)
        if self.alpha_form == "float":
            y = y * self.alpha_float
        elif self.alpha_form == "vec1":
            y = self.alpha.reshape(1) * y
        else:
            y = y * self.alpha
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, y.shape[-1])


def _nvfp4_linear_cls():
    return NVFP4Linear


def make_linear(w: torch.Tensor, bias: torch.Tensor | None, input_scale: float | None, linear: str,
                alpha_form: str = "tensor") -> nn.Module:
    q = quantize_weight(w.float())
    ins = None if input_scale is None else torch.tensor(input_scale, dtype=torch.float32)
    if linear == "scaled_mm":
        if ins is None:
            raise ValueError("the _scaled_mm spelling needs W4A4 (an input_scale)")
        return ScaledMmNvfp4Linear(q.packed, to_blocked(q.scale).reshape(-1), q.global_scale, ins, bias, alpha_form)
    return _nvfp4_linear_cls().from_tensors(q.packed, q.scale, q.global_scale, ins, bias)


def _rms(x, w, eps=1e-6):
    """Hugging Face ``LlamaRMSNorm``: normalise in fp32, round to x's dtype, multiply by the weight (x's dtype)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # [..., d/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def _share_input_scale(first: nn.Module, *rest: nn.Module) -> None:
    """Give ``rest`` the ``input_scale`` of ``first`` (W4A4 only; weight-only layers have none)."""
    if getattr(first, "input_scale", None) is None:
        return
    for mod in rest:
        if isinstance(mod, ScaledMmNvfp4Linear):
            raise ValueError("shared input scales are built for linear='op' only")
        mod.input_scale = first.input_scale.clone()


class TinyNvfp4Llama(nn.Module):
    def __init__(self, cfg: TinyLlamaConfig = TinyLlamaConfig(), seed: int = 0, linear: str = "op",
                 alpha_form: str = "tensor"):
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed)

        def w(n, k, scale=0.08):
            return (torch.randn(n, k, generator=g) * scale).to(torch.bfloat16)

        def ins():
            return None if cfg.weight_only else float(torch.rand((), generator=g) * 0.002 + 0.001)

        H, I, D = cfg.hidden, cfg.intermediate, cfg.head_dim
        self.embed = nn.Parameter(torch.randn(cfg.vocab, H, generator=g).to(torch.bfloat16), requires_grad=False)
        self.layers = nn.ModuleList()
        for _ in range(cfg.layers):
            layer = nn.Module()
            b = (lambda n: (torch.randn(n, generator=g) * 0.1).to(torch.bfloat16)) if cfg.qkv_bias else (lambda n: None)
            layer.q = make_linear(w(cfg.heads * D, H), b(cfg.heads * D), ins(), linear, alpha_form)
            layer.k = make_linear(w(cfg.kv_heads * D, H), b(cfg.kv_heads * D), ins(), linear, alpha_form)
            layer.v = make_linear(w(cfg.kv_heads * D, H), b(cfg.kv_heads * D), ins(), linear, alpha_form)
            layer.o = make_linear(w(H, cfg.heads * D), None, ins(), linear, alpha_form)
            layer.gate = make_linear(w(I, H), None, ins(), linear, alpha_form)
            layer.up = make_linear(w(I, H), None, ins(), linear, alpha_form)
            layer.down = make_linear(w(H, I), None, ins(), linear, alpha_form)
            if cfg.share_input_scales or cfg.fused:
                _share_input_scale(layer.q, layer.k, layer.v)
                _share_input_scale(layer.gate, layer.up)
            if cfg.fused:
                if linear != "op":
                    raise ValueError("TinyLlamaConfig(fused=True) needs linear='op' (NVFP4Linear.fuse)")
                layer.qkv = NVFP4Linear.fuse([layer.q, layer.k, layer.v])
                layer.gate_up = NVFP4Linear.fuse([layer.gate, layer.up])
                for name in ("q", "k", "v", "gate", "up"):
                    delattr(layer, name)
            layer.register_buffer("ln1", (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16))
            layer.register_buffer("ln2", (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16))
            self.layers.append(layer)
        self.register_buffer("norm", (1 + 0.1 * torch.randn(H, generator=g)).to(torch.bfloat16))
        self.register_buffer("lm_head", w(cfg.vocab, H))

    def make_cache(self, batch: int, seed: int = 1):
        c = self.cfg
        g = torch.Generator().manual_seed(seed)
        shape = (c.layers, batch, c.kv_heads, c.cache_len, c.head_dim)
        k = (torch.randn(shape, generator=g) * 0.5).to(torch.bfloat16)
        v = (torch.randn(shape, generator=g) * 0.5).to(torch.bfloat16)
        return k, v

    def forward(self, ids: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
        """ids [B], caches [L, B, KV, T, D] -> (logits [B, vocab] fp32, new_k [L, B, KV, 1, D], new_v)."""
        c = self.cfg
        B = ids.shape[0]
        x = self.embed[ids].unsqueeze(1)  # [B, 1, H]
        pos = torch.full((1,), c.cache_len, device=ids.device, dtype=torch.long)
        new_k, new_v = [], []
        for li, layer in enumerate(self.layers):
            h = _rms(x, layer.ln1)
            if c.fused:
                q, k, v = layer.qkv(h).split([c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                              c.kv_heads * c.head_dim], dim=-1)
            else:
                q, k, v = layer.q(h), layer.k(h), layer.v(h)
            q = q.reshape(B, 1, c.heads, c.head_dim).transpose(1, 2)
            k = k.reshape(B, 1, c.kv_heads, c.head_dim).transpose(1, 2)
            v = v.reshape(B, 1, c.kv_heads, c.head_dim).transpose(1, 2)
            q, k = _rope(q, pos), _rope(k, pos)
            new_k.append(k)
            new_v.append(v)
            keys = torch.cat((k_cache[li], k), dim=2)
            vals = torch.cat((v_cache[li], v), dim=2)
            attn = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, enable_gqa=True)
            x = x + layer.o(attn.transpose(1, 2).reshape(B, 1, c.heads * c.head_dim))
            h = _rms(x, layer.ln2)
            if c.fused:
                gu = layer.gate_up(h)
                act = torch.nn.functional.silu(gu[..., :c.intermediate]) * gu[..., c.intermediate:]
            else:
                act = torch.nn.functional.silu(layer.gate(h)) * layer.up(h)
            x = x + layer.down(act)
        logits = _rms(x, self.norm)[:, 0].float() @ self.lm_head.float().t()
        return logits, torch.stack(new_k), torch.stack(new_v)
