"""Gated MLPs of a loaded NVFP4 model -> :class:`NVFP4GatedMLP`: one gate_up GEMM (``[gate; up]``, SwiGLU
in its epilogue) and down through :func:`nvgemm.ops.fused.gated_mlp`, so where both are W4A4 the gate_up
GEMM emits down's NVFP4 input directly (``nvgemm::nvfp4_linear_requant`` -> ``nvfp4_linear_prequant``).

A module is patched when it is a transformers-style gated MLP: children exactly ``gate_proj``, ``up_proj``,
``down_proj`` (:class:`~nvgemm.NVFP4Linear`, activation none, checkpoint layout) and a SiLU ``act_fn``
(its forward is ``down(act(gate(x)) * up(x))``: Llama, Qwen2/3, Mistral, DeepSeek dense and shared-expert
MLPs). gate and up must share ``input_scale`` (one activation quantization; ModelOpt's export equalizes it).

Numerics: the patched MLP rounds once (``silu(g) * u`` in fp32 in the epilogue, then one rounding: the
contract of ``nvfp4_linear(..., activation="silu_mul")``) where the transformers forward rounds gate, up,
silu and the product to the model dtype separately; the results agree to a few model-dtype ulps. The
state_dict then holds ``gate_up_proj.*`` (the concatenated shards) instead of ``gate_proj.*`` / ``up_proj.*``.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from nvgemm.ops.fused import fused_mlp_reason, gated_mlp
from nvgemm.nn.linear import NVFP4Linear

log = logging.getLogger("nvgemm_cutedsl")

_SILU = ("SiLU", "SiLUActivation")
_CHILDREN = {"gate_proj", "up_proj", "down_proj", "act_fn"}


class NVFP4GatedMLP(nn.Module):
    """``down_proj(silu(gate) * up)`` with ``gate_up_proj`` = ``[gate; up]`` (activation ``silu_mul``)."""

    def __init__(self, gate_up_proj: NVFP4Linear, down_proj: NVFP4Linear):
        super().__init__()
        if gate_up_proj.activation != "silu_mul":
            raise ValueError(f"NVFP4GatedMLP: gate_up_proj must have activation 'silu_mul', got "
                             f"{gate_up_proj.activation!r}")
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_mlp(self.gate_up_proj, self.down_proj, x)

    def fused_reason(self, x: torch.Tensor) -> str | None:
        """None if ``forward(x)`` runs the fused requant chain, else why it runs the plain one."""
        return fused_mlp_reason(self.gate_up_proj, self.down_proj, x)


def gated_mlp_parts(mod: nn.Module) -> tuple[NVFP4Linear, NVFP4Linear, NVFP4Linear] | str:
    """(gate, up, down) of a patchable gated MLP, else why ``mod`` is not one."""
    parts = [getattr(mod, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, NVFP4Linear) for p in parts):
        return "gate_proj / up_proj / down_proj are not all NVFP4 layers"
    extra = {n for n, _ in mod.named_children()} - _CHILDREN
    if extra:
        return f"unknown children {sorted(extra)} (its forward may not be down(act(gate) * up))"
    act = getattr(mod, "act_fn", None)
    if type(act).__name__ not in _SILU:
        return f"activation {type(act).__name__} is not SiLU"
    gate, up, down = parts
    if any(p.activation != "none" or p.sm90_kind is not None for p in parts):
        return "a layer already carries an activation or is held in the sm90 layout"
    if gate.weight_only != up.weight_only:
        return "gate and up mix W4A16 and W4A4"
    if not gate.weight_only and not torch.equal(gate.input_scale, up.input_scale):
        return (f"gate and up have unequal input_scale ({float(gate.input_scale)} vs {float(up.input_scale)}): "
                "one activation quantization cannot serve both")
    return gate, up, down


def fuse_gated_mlps(model: nn.Module) -> dict[str, str | None]:
    """Replace every patchable gated MLP of ``model`` by :class:`NVFP4GatedMLP` (in place). Returns
    {module name: None if patched, else why not} for each module holding NVFP4 gate/up/down layers; logs
    one line with the counts (and how many run the fused requant chain: both W4A4)."""
    out: dict[str, str | None] = {}
    for name, mod in list(model.named_modules()):
        if not isinstance(getattr(mod, "down_proj", None), NVFP4Linear) or isinstance(mod, NVFP4GatedMLP):
            continue
        parts = gated_mlp_parts(mod)
        if isinstance(parts, str):
            out[name] = parts
            continue
        gate, up, down = parts
        gate_up = NVFP4Linear.fuse([gate, up])
        gate_up.activation = "silu_mul"
        new = NVFP4GatedMLP(gate_up, down)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        out[name] = None
    patched = [n for n, r in out.items() if r is None]
    if out:
        mlps = [model.get_submodule(n) for n in patched]
        w4a4 = sum(not m.down_proj.weight_only and not m.gate_up_proj.weight_only for m in mlps)
        skipped = {n: r for n, r in out.items() if r is not None}
        log.info("nvgemm: %d gated MLPs run one gate_up GEMM with SwiGLU in its epilogue (%d W4A4: gate_up emits "
                 "down's NVFP4 input, fused requant)%s", len(patched), w4a4,
                 f"; not patched: {skipped}" if skipped else "")
    return out
