"""``NVFP4Experts``: an inference ``nn.Module`` holding stacked NVFP4 expert weights, calling ``nvgemm::nvfp4_moe``."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from nvgemm.core.formats import NVFP4, dequantize, from_blocked, quantize_weight, to_blocked
from nvgemm.core.validation import aligned
from nvgemm.nn.linear import NVFP4Linear
from nvgemm.dispatch.moe import last_moe_selected
from nvgemm.ops.moe import check_moe_args

_BUFFERS = ("w13", "w13_scale", "w13_scale_2", "w13_input_scale", "w2", "w2_scale", "w2_scale_2", "w2_input_scale")


class NVFP4Experts(nn.Module):
    """Routed experts of one MoE layer; ``forward(x, topk_ids, topk_weights)`` like transformers 5's experts.

    Buffers (the op's stacked layout; ``nvgemm.ops.moe`` documents it):
      w13 uint8 [E, R13, H/2]       per expert [gate; up] rows (gated, R13 = 2I) or up rows (R13 = I)
      w13_scale e4m3 [E, S13]       per-expert 128x4-swizzled block scales
      w13_scale_2 fp32 [E] | [E, R13]   per expert; per row where gate and up scales differ (exact)
      w13_input_scale fp32 [E] | None   per expert (unequal values stay exact); None = W4A16
      w2 uint8 [E, H, I/2], w2_scale e4m3 [E, S2], w2_scale_2 fp32 [E], w2_input_scale fp32 [E] | None
      expert_map int32 [E_global] | None  global id -> local index or -1 (expert parallelism)

    ``router_weight_on_input`` (Llama-4, top-1) multiplies the input by the router weight instead
    of the output. ``last_path`` names the backend the most recent eager forward ran on.
    """

    def __init__(self, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2, w2_input_scale,
                 activation: str = "silu_mul", router_weight_on_input: bool = False,
                 expert_map: torch.Tensor | None = None):
        super().__init__()
        self.activation = activation
        self.router_weight_on_input = router_weight_on_input
        vals = (w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2, w2_input_scale)
        for name, t in zip(_BUFFERS, vals):
            self.register_buffer(name, None if t is None else aligned(t))  # kernels read them in place
        self.register_buffer("expert_map", expert_map)
        self.num_experts, self.hidden_size = w13.shape[0], w2.shape[1]
        self.intermediate_size = w2.shape[2] * 2
        self.last_path: str | None = None
        self._validate()

    @property
    def weight_only(self) -> bool:
        return self.w13_input_scale is None

    def _validate(self) -> None:
        meta = [None if t is None else t.to("meta") for t in self.tensors()]
        x = torch.empty((1, self.hidden_size), dtype=torch.bfloat16, device="meta")
        k = 1
        ids = torch.empty((1, k), dtype=torch.int32, device="meta")
        wts = torch.empty((1, k), dtype=torch.float32, device="meta")
        emap = None if self.expert_map is None else self.expert_map.to("meta")
        check_moe_args(x, ids, wts, *meta, self.activation, self.router_weight_on_input, emap, None, None, None)

    def tensors(self) -> tuple:
        return tuple(getattr(self, n) for n in _BUFFERS)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_linears(cls, experts: Sequence[tuple[NVFP4Linear | None, NVFP4Linear, NVFP4Linear]],
                     activation: str = "silu_mul", **kw) -> "NVFP4Experts":
        """Stack per-expert ``(gate, up, down)`` NVFP4Linears (``gate`` None for non-gated experts), exactly.

        gate/up are fused with ``NVFP4Linear.fuse``: unequal ``weight_scale_2`` become a per-row alpha;
        their ``input_scale`` must be equal (same input). Experts may have different input scales.
        """
        if not experts:
            raise ValueError("NVFP4Experts.from_linears needs at least one expert")
        gated = activation == "silu_mul"
        w13s, downs = [], []
        for j, (gate, up, down) in enumerate(experts):
            if (gate is not None) != gated:
                raise ValueError(f"NVFP4Experts: expert {j}: activation {activation!r} "
                                 f"{'needs' if gated else 'takes no'} gate projection")
            try:
                w13s.append(NVFP4Linear.fuse([gate, up]) if gated else up)
            except ValueError as err:
                raise ValueError(f"NVFP4Experts: expert {j} gate/up: {err}") from None
            downs.append(down)
        for j, l in enumerate(w13s + downs):
            if l.bias is not None:
                raise ValueError(f"NVFP4Experts: projection {j} has a bias; nvfp4_moe has no expert biases")
            if l.weight_only != w13s[0].weight_only:
                raise ValueError("NVFP4Experts: mixing weight-only (W4A16) and W4A4 expert projections")

        def g2(ls, vector_ok):
            if vector_ok and any(l.weight_scale_2.dim() == 1 for l in ls):
                return torch.stack([l.weight_scale_2.expand(l.out_features) for l in ls])
            return torch.stack([l.weight_scale_2.reshape(()) for l in ls])

        def ins(ls):
            return None if ls[0].weight_only else torch.stack([l.input_scale.reshape(()) for l in ls])

        return cls(torch.stack([l.weight for l in w13s]), torch.stack([l.weight_scale for l in w13s]),
                   g2(w13s, True), ins(w13s), torch.stack([l.weight for l in downs]),
                   torch.stack([l.weight_scale for l in downs]), g2(downs, False), ins(downs), activation, **kw)

    @classmethod
    def from_float(cls, w13: torch.Tensor, w2: torch.Tensor, w13_input_scale=None, w2_input_scale=None,
                   activation: str = "silu_mul", **kw) -> "NVFP4Experts":
        """Quantize float experts ``w13 [E, R13, H]``, ``w2 [E, H, I]`` with nvgemm's ModelOpt-exact recipe."""
        def stack(w):
            qs = [quantize_weight(w[j].detach().float()) for j in range(w.shape[0])]
            return (torch.stack([q.packed for q in qs]), torch.stack([to_blocked(q.scale) for q in qs]),
                    torch.stack([q.global_scale.reshape(()) for q in qs]))

        def ins(v, e):
            return None if v is None else torch.as_tensor(v, dtype=torch.float32).expand(e).clone()

        e = w13.shape[0]
        return cls(*stack(w13), ins(w13_input_scale, e), *stack(w2), ins(w2_input_scale, e), activation, **kw)

    def slice_experts(self, local: Sequence[int]) -> "NVFP4Experts":
        """This rank's experts for expert parallelism: experts ``local`` (global ids) with their own
        scales (per-expert input scales are sliced with the weights, never replaced by the layer's
        max) and an ``expert_map`` sending every other global id to -1."""
        if self.expert_map is not None:
            raise ValueError("NVFP4Experts.slice_experts: already a slice (has an expert_map)")
        idx = torch.as_tensor(list(local), dtype=torch.long)
        if idx.numel() == 0 or int(idx.min()) < 0 or int(idx.max()) >= self.num_experts or idx.unique().numel() != idx.numel():
            raise ValueError(f"NVFP4Experts.slice_experts: local experts {idx.tolist()} must be distinct ids in "
                             f"[0, {self.num_experts})")
        emap = torch.full((self.num_experts,), -1, dtype=torch.int32, device=self.w13.device)
        emap[idx.to(emap.device)] = torch.arange(idx.numel(), dtype=torch.int32, device=emap.device)
        ts = [None if t is None else t[idx.to(t.device)] for t in self.tensors()]
        return NVFP4Experts(*ts, self.activation, self.router_weight_on_input, emap)

    # ------------------------------------------------------------------ compute

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                shared_out: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., H]``, ``topk_ids`` / ``topk_weights [..., K]`` (any int / float dtype: cast exactly
        to int32 / fp32); returns ``[..., H]`` in x's dtype."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        k = topk_ids.shape[-1]
        ids = topk_ids.reshape(-1, k)
        if ids.dtype != torch.int32:
            if ids.is_floating_point():
                raise TypeError(f"NVFP4Experts: topk_ids must be integers, got {ids.dtype}")
            ids = ids.to(torch.int32)
        wts = topk_weights.reshape(-1, topk_weights.shape[-1]).float()
        flat = [None if t is None else t.reshape(-1, shape[-1]) for t in (shared_out, residual)]
        out = torch.ops.nvgemm.nvfp4_moe(x2, ids, wts, *self.tensors(), self.activation,
                                         self.router_weight_on_input, self.expert_map, *flat, None)
        if not torch.compiler.is_compiling():
            self.last_path = last_moe_selected()
        return out.reshape(shape)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(W13 [E, R13, H], W2 [E, H, I])`` = E2M1 * block scale * weight_scale_2 (reference weights)."""
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        r13 = self.w13.shape[1]

        def deq(w, s, g, rows, k):
            return torch.stack([dequantize(w[j], from_blocked(s[j].view(torch.float8_e4m3fn), rows, k // NVFP4.block_size),
                                           g[j]) for j in range(e)])

        return deq(self.w13, self.w13_scale, self.w13_scale_2, r13, h), deq(self.w2, self.w2_scale, self.w2_scale_2, h, i)

    def extra_repr(self) -> str:
        mode = "W4A16" if self.weight_only else "W4A4"
        return (f"num_experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.intermediate_size}, "
                f"{mode}, activation={self.activation}, router_weight_on_input={self.router_weight_on_input}")

