"""How routed MoE experts are stored in NVFP4 checkpoints (ModelOpt exports), read from tensor headers only.

One naming rule for every reader: the ModelOpt loader (``nvgemm.integrations.modelopt.moe``) takes its
projection names from here, and ``nvgemm precompile`` / the serving plan use :func:`find_experts` to
tell an experts module's tensors from dense linears and to learn its shape without loading a tensor.
An experts module at checkpoint prefix ``P`` (its last name component is ``experts``) is stored as

* per-expert 2-D NVFP4 linears ``P.{e}.{gate_proj,up_proj,down_proj}.*`` or Mixtral's hub names
  ``P.{e}.{w1,w3,w2}.*`` (a dense NVFP4 linear's tensors per expert: uint8 ``.weight [N, K/2]`` with a
  ``.weight_scale``; non-gated experts have no gate projection), or
* stacked 3-D tensors ``P.gate_up_proj`` / ``P.down_proj`` (uint8, with ``_weight_scale``): untransposed
  ``[E, 2I, H/2]`` / ``[E, H, I/2]`` or Llama-4's transposed ``[E, H/2, 2I]`` / ``[E, I/2, H]`` (the two
  orientations never fit the same shapes, so the header decides).

A projection without an ``input_scale`` is weight-only (W4A16_NVFP4), as for dense linears.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: per-expert (gate, up, down) projection names: transformers / DeepSeek / Qwen names, Mixtral's hub names
EXPERT_PROJ_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
#: stacked (gated, non-gated up, down) tensor names of an experts module
STACKED_PROJ_NAMES = ("gate_up_proj", "up_proj", "down_proj")

_PER_EXPERT = re.compile(r"^(?P<prefix>(?:.+\.)?experts)\.(?P<e>\d+)\.(?P<proj>[A-Za-z0-9_]+)\.weight$")


@dataclass(frozen=True)
class ExpertsLayout:
    """One experts module of a checkpoint (full, unsharded sizes)."""

    prefix: str
    num_experts: int
    hidden: int  # H
    intermediate: int  # I (down projection's K)
    gated: bool  # gate and up projections (silu_mul); else up only
    weight_only: bool  # no input scales: W4A16_NVFP4
    stacked: bool
    #: the projections' tensor-name prefixes (``P.{e}.{proj}`` or ``P.{proj}``): every tensor under them
    #: belongs to this module, not to a dense linear
    members: tuple[str, ...]
    #: (gate, up) per-tensor ``weight_scale_2`` names per expert (per-expert layout; () when stacked or non-gated)
    gate_up_scale_2: tuple[tuple[str, str], ...] = ()


def _nvfp4_weight(tensors: dict, name: str, dims: int) -> list[int] | None:
    t = tensors.get(name)
    if not isinstance(t, dict) or t.get("dtype") != "U8" or len(t.get("shape", ())) != dims:
        return None
    return [int(d) for d in t["shape"]]


def _per_expert(tensors: dict, prefix: str, experts: list[int]) -> ExpertsLayout:
    if experts != list(range(len(experts))):
        missing = sorted(set(range(max(experts) + 1)) - set(experts))
        raise ValueError(f"experts {prefix}: expert ids {missing[:4]} missing (found {len(experts)} experts, "
                         f"ids up to {max(experts)})")
    for gate, up, down in EXPERT_PROJ_NAMES:
        names = (gate, up, down) if f"{prefix}.0.{gate}.weight" in tensors else (up, down)
        if all(f"{prefix}.0.{p}.weight" in tensors for p in names):
            break
    else:
        raise ValueError(f"experts {prefix}: expert 0 has neither gate_proj/up_proj/down_proj nor w1/w3/w2 "
                         "NVFP4 weights")
    gated = len(names) == 3
    e = len(experts)
    shapes = {}
    members = []
    for j in experts:
        for p in names:
            base = f"{prefix}.{j}.{p}"
            shape = _nvfp4_weight(tensors, f"{base}.weight", 2)
            if shape is None or f"{base}.weight_scale" not in tensors:
                raise ValueError(f"experts {prefix}: {base}.weight is missing or not NVFP4 (uint8 [N, K/2] with a "
                                 ".weight_scale)")
            shapes.setdefault(p, shape)
            if shape != shapes[p]:
                raise ValueError(f"experts {prefix}: {base}.weight is {shape}, expert 0's is {shapes[p]}")
            members.append(base)
    up_n, up_kh = shapes[names[-2]]
    h, i = up_kh * 2, up_n
    if shapes[names[-1]] != [h, i // 2] or (gated and shapes[names[0]] != [i, h // 2]):
        raise ValueError(f"experts {prefix}: projection shapes {shapes} do not form gate/up [I, H/2] and down "
                         f"[H, I/2]")
    weight_only = not any(f"{prefix}.{j}.{p}.input_scale" in tensors for j in experts for p in names)
    pairs = tuple((f"{prefix}.{j}.{names[0]}.weight_scale_2", f"{prefix}.{j}.{names[1]}.weight_scale_2")
                  for j in experts) if gated else ()
    return ExpertsLayout(prefix, e, h, i, gated, weight_only, False, tuple(members), pairs)


def _stacked(tensors: dict, prefix: str) -> ExpertsLayout | None:
    gated = f"{prefix}.gate_up_proj" in tensors
    up_name = "gate_up_proj" if gated else "up_proj"
    up = _nvfp4_weight(tensors, f"{prefix}.{up_name}", 3)
    down = _nvfp4_weight(tensors, f"{prefix}.down_proj", 3)
    if up is None or down is None or f"{prefix}.{up_name}_weight_scale" not in tensors:
        return None
    rows = 2 if gated else 1
    (e, a, b), (e2, c, d) = up, down
    if e != e2:
        raise ValueError(f"experts {prefix}: {up_name} has {e} experts, down_proj {e2}")
    if a == rows * 2 * d and c == 2 * b:  # [E, R, H/2], [E, H, I/2]
        h, i = 2 * b, 2 * d
    elif b == rows * 2 * c and d == 2 * a:  # transposed: [E, H/2, R], [E, I/2, H]
        h, i = 2 * a, 2 * c
    else:
        raise ValueError(f"experts {prefix}: stacked {up_name} {up} and down_proj {down} fit neither [E, R, H/2] / "
                         "[E, H, I/2] nor the transposed layout")
    weight_only = f"{prefix}.{up_name}_input_scale" not in tensors and f"{prefix}.down_proj_input_scale" not in tensors
    return ExpertsLayout(prefix, e, h, i, gated, weight_only, True,
                         (f"{prefix}.{up_name}", f"{prefix}.down_proj"))


def find_experts(tensors: dict) -> list[ExpertsLayout]:
    """The NVFP4 experts modules of a checkpoint, from its merged safetensors headers (``name -> {"dtype",
    "shape", ...}``), sorted by prefix. ValueError naming the module when one is stored inconsistently."""
    per_expert: dict[str, set[int]] = {}
    for name in tensors:
        m = _PER_EXPERT.match(name)
        if m and m["proj"] in {p for names in EXPERT_PROJ_NAMES for p in names}:
            per_expert.setdefault(m["prefix"], set()).add(int(m["e"]))
    out = [_per_expert(tensors, p, sorted(ids)) for p, ids in per_expert.items()]
    for name in tensors:
        if name.endswith(".down_proj") and name.rsplit(".", 1)[0].rsplit(".", 1)[-1] == "experts":
            lay = _stacked(tensors, name[: -len(".down_proj")])
            if lay is not None:
                out.append(lay)
    return sorted(out, key=lambda x: x.prefix)


def expert_tensors(layouts: list[ExpertsLayout]):
    """A predicate: whether a checkpoint tensor name belongs to one of ``layouts`` (not to a dense linear)."""
    per = {m for lay in layouts if not lay.stacked for m in lay.members}
    stacked = tuple(m for lay in layouts if lay.stacked for m in lay.members)

    def belongs(name: str) -> bool:
        return name.rsplit(".", 1)[0] in per or any(name == m or name.startswith(m + "_") for m in stacked)

    return belongs


__all__ = ["EXPERT_PROJ_NAMES", "STACKED_PROJ_NAMES", "ExpertsLayout", "expert_tensors", "find_experts"]
