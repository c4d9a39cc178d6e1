"""Linears that read the same input held as one NVFP4 GEMM: q/k/v of an attention block, gate/up of a gated MLP.

:func:`fuse_linear_shards` replaces sibling :class:`~nvgemm.NVFP4Linear` layers (``q_proj``, ``k_proj``,
``v_proj``; ``gate_proj``, ``up_proj``) by one :class:`NVFP4FusedShards` (registered beside them as
``qkv_proj`` / ``gate_up_proj``; the fused weight from
:meth:`NVFP4Linear.fuse`: concatenated along N, unequal ``weight_scale_2`` kept exact as a per-column alpha) and
puts an :class:`NVFP4LinearShard` in each old name, so the block's own forward (``self.q_proj(h)``, ...) runs
unchanged, with the split layers' numbers bit for bit. Exact only when one activation quantization serves every shard: the shards' ``input_scale`` must be
equal (or all absent: W4A16); otherwise the layers stay split.

How one GEMM serves three calls:

* eager: the first shard called with ``x`` runs the fused GEMM and keeps its output until every shard has read
  it (the same tensor object, unmodified); each shard returns its columns (a view);
* ``torch.compile``: each shard's call traces the fused GEMM on the same input, and nvgemm's capture pass
  (:mod:`nvgemm.integrations.inductor.capture`) merges identical nvgemm calls into one. Compiling without
  ``nvgemm.enable()`` leaves one GEMM call of the fused width per shard. There, a gated MLP's
  ``silu(gate) * up`` reads the two halves of one GEMM output: the capture pass's SwiGLU rewrites put it in the
  gate_up epilogue (W4A4: the fused requant chain).
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch
from torch import nn

from nvgemm.nn.linear import NVFP4Linear

log = logging.getLogger("nvgemm_cutedsl")

#: sibling names fused into one GEMM, and the name the fused module gets
SHARD_GROUPS = ((("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj"))


class NVFP4FusedShards(nn.Module):
    """One NVFP4 GEMM (``fused``) whose output columns are the shards' outputs, in order (``sizes``)."""

    def __init__(self, fused: NVFP4Linear, sizes: Sequence[int]):
        super().__init__()
        if sum(sizes) != fused.out_features:
            raise ValueError(f"NVFP4FusedShards: shard sizes {list(sizes)} do not add up to {fused.out_features}")
        self.fused = fused
        self.sizes = tuple(int(s) for s in sizes)
        self._x: torch.Tensor | None = None
        self._version = -1
        self._out: torch.Tensor | None = None
        self._unread = 0

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """The fused GEMM's output for ``x`` (eager: computed once per input for all shards)."""
        if torch.compiler.is_compiling():
            return self.fused(x)
        if self._x is not x or self._version != x._version or self._unread <= 0:
            self._out = self.fused(x)
            self._x, self._version, self._unread = x, x._version, len(self.sizes)
        out = self._out
        self._unread -= 1
        if self._unread <= 0:  # every shard has read it: hold nothing between steps
            self._x = self._out = None
        return out

    def extra_repr(self) -> str:
        return f"sizes={list(self.sizes)}"


class NVFP4LinearShard(nn.Module):
    """Columns ``[lo, hi)`` of an :class:`NVFP4FusedShards` output; holds no weight of its own."""

    def __init__(self, group: NVFP4FusedShards, index: int):
        super().__init__()
        object.__setattr__(self, "group", group)  # not a submodule: the group is registered once, beside the shards
        self.index = index
        self.lo = sum(group.sizes[:index])
        self.hi = self.lo + group.sizes[index]
        self.in_features = group.fused.in_features
        self.out_features = group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x)[..., self.lo:self.hi]

    def extra_repr(self) -> str:
        return f"columns [{self.lo}, {self.hi}) of the fused GEMM"


def shard_reason(layers: Sequence[nn.Module]) -> str | None:
    """None if ``layers`` fuse exactly into one GEMM, else why not."""
    if not all(isinstance(l, NVFP4Linear) for l in layers):
        return "not all NVFP4 layers"
    first = layers[0]
    if any(l.sm90_kind is not None or l.activation != "none" for l in layers):
        return "a layer is held in the sm90 layout or carries an activation"
    if any(l.in_features != first.in_features for l in layers):
        return "unequal in_features"
    if any(l.weight_only != first.weight_only for l in layers):
        return "W4A16 and W4A4 layers mixed"
    if any((l.bias is None) != (first.bias is None) or (l.bias is not None and l.bias.dtype != first.bias.dtype)
           for l in layers):
        return "biases differ in presence or dtype"
    if not first.weight_only and not all(torch.equal(l.input_scale, first.input_scale) for l in layers):
        scales = [float(l.input_scale) for l in layers]
        return f"unequal input_scale {scales}: one activation quantization cannot serve them exactly"
    return None


def fuse_linear_shards(model: nn.Module, groups=SHARD_GROUPS) -> dict[str, str | None]:
    """Fuse every group of sibling NVFP4 layers of ``model`` (in place; see the module docstring). Returns
    {"<parent module name>:<fused name>": None if fused, else why not} for each module holding all the group's
    names."""
    out: dict[str, str | None] = {}
    for name, mod in list(model.named_modules()):
        for names, fused_name in groups:
            layers = [getattr(mod, n, None) for n in names]
            if any(l is None for l in layers) or any(isinstance(l, NVFP4LinearShard) for l in layers):
                continue
            why = shard_reason(layers)
            if why is None and hasattr(mod, fused_name):
                why = f"the module already has an attribute {fused_name!r}"
            out[f"{name}:{fused_name}"] = why
            if why is not None:
                continue
            group = NVFP4FusedShards(NVFP4Linear.fuse(layers), [l.out_features for l in layers])
            setattr(mod, fused_name, group)
            for i, n in enumerate(names):
                setattr(mod, n, NVFP4LinearShard(group, i))
    fused = [n for n, r in out.items() if r is None]
    if out:
        skipped = {n: r for n, r in out.items() if r is not None}
        log.info("nvgemm: %d q/k/v or gate/up groups run as one NVFP4 GEMM each%s", len(fused),
                 f"; kept split: {skipped}" if skipped else "")
    return out


__all__ = ["NVFP4FusedShards", "NVFP4LinearShard", "SHARD_GROUPS", "fuse_linear_shards", "shard_reason"]
