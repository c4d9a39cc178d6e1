"""MoE layers of ModelOpt exports -> ``NVFP4Experts`` (used by :func:`load_modelopt_checkpoint`).

Model side (transformers 5): fused experts modules (3-D ``gate_up_proj [E, 2I, H]`` /
``down_proj [E, H, I]``, called as ``experts(x, top_k_index, top_k_weights)``: Qwen3-MoE, Mixtral,
DeepSeek-V3, ...) are replaced by an ``NVFP4Experts``; Llama-4's BMM experts
(``gate_up_proj [E, H, 2I]``, input pre-multiplied by the router score) are replaced together with
their ``Llama4TextMoe`` block by :class:`Llama4MoeNVFP4`, which keeps the router and shared expert.

Checkpoint side, per experts module at checkpoint prefix ``P``:
  * per-expert 2-D tensors ``P.{e}.{gate_proj,up_proj,down_proj}.*`` or Mixtral's ``P.{e}.{w1,w3,w2}.*``
    (exactly a dense NVFP4 linear's tensors per expert; compressed-tensors names work too);
  * stacked 3-D tensors ``P.gate_up_proj`` / ``P.down_proj`` packed along the module's input
    dimension, with ``_weight_scale`` (same orientation, K/16), ``_weight_scale_2`` and
    ``_input_scale`` (scalar or per expert): Llama-4's transposed ``[E, H/2, 2I]`` (checked with
    ModelOpt 0.47) and the untransposed fused layout ``[E, 2I, H/2]``.
``weight_scale_2`` per expert (unequal gate/up values become an exact per-row alpha) and
``input_scale`` per expert (unequal values across experts stay exact). Routers are never quantized,
whatever ``exclude_modules`` says (ModelOpt < 0.45 left them out of it).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from nvgemm.core.experts_layout import EXPERT_PROJ_NAMES
from nvgemm.core.formats import NVFP4, check_block_scales, to_blocked
from nvgemm.nn.experts import NVFP4Experts

#: checkpoint-name aliases of transformers 5 module names (hub names ModelOpt restores on export):
#: (regex on the module name, replacement); Mixtral's block_sparse_moe, NemotronH's backbone
NAME_ALIASES = ((r"\.mlp\.", ".block_sparse_moe."), (r"^model\.", "backbone."))
#: transformers activation classes -> nvfp4_moe activations (gated experts must be SiLU)
_ACTIVATIONS = {"SiLU": "silu", "SiLUActivation": "silu", "ReLUSquaredActivation": "relu2",
                "GELUTanh": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh"}


def ckpt_name(idx, name: str) -> str:
    """The checkpoint spelling of module/tensor ``name`` (itself, or a hub-name alias present in ``idx``)."""
    if name in idx or idx.has_prefix(name):
        return name
    import re

    for model_part, ckpt_part in NAME_ALIASES:
        alt = re.sub(model_part, ckpt_part, name, count=1)
        if alt != name and (alt in idx or idx.has_prefix(alt)):
            return alt
    return name


def experts_kind(mod: nn.Module) -> str | None:
    """"fused" (transformers 5 grouped experts, gated ``gate_up_proj`` or non-gated ``up_proj``), "bmm"
    (Llama-4 style) or None (not an experts module)."""
    up = getattr(mod, "gate_up_proj", None)
    up = up if isinstance(up, torch.Tensor) else getattr(mod, "up_proj", None)
    down = getattr(mod, "down_proj", None)
    if not (isinstance(up, torch.Tensor) and isinstance(down, torch.Tensor) and up.dim() == 3 and down.dim() == 3):
        return None
    n_args = len(inspect.signature(mod.forward).parameters)
    return "fused" if n_args >= 3 else "bmm"


def _activation(mod: nn.Module, name: str, gated: bool, error) -> str:
    act = _ACTIVATIONS.get(type(getattr(mod, "act_fn", None)).__name__)
    if gated and act != "silu" or act is None:
        raise error(f"experts {name}: activation {type(getattr(mod, 'act_fn', None)).__name__} is not served "
                    f"({'gated experts need SiLU' if gated else 'non-gated: ' + ', '.join(sorted(set(_ACTIVATIONS.values())))})")
    return "silu_mul" if gated else act


def load_experts(idx, name: str, mod: nn.Module, kind: str, qcfg, loader, error) -> NVFP4Experts | None:
    """NVFP4Experts for the experts module ``name`` (None when the config leaves it unquantized).

    ``loader(idx, prefix, shape_holder, algo, qcfg)`` is the dense per-projection loader.
    """
    gated = isinstance(getattr(mod, "gate_up_proj", None), torch.Tensor)
    activation = _activation(mod, name, gated, error)
    up = mod.gate_up_proj if gated else mod.up_proj
    e = up.shape[0]
    if kind == "fused":  # [E, 2I | I, H], [E, H, I]
        r13, h = up.shape[1:]
        i = mod.down_proj.shape[2]
    else:  # bmm: [E, H, 2I], [E, I, H]
        h, r13 = up.shape[1:]
        i = mod.down_proj.shape[1]
    if r13 != (2 * i if gated else i):
        raise error(f"experts {name}: {'gate_up_proj' if gated else 'up_proj'} has {r13} rows per expert, "
                    f"expected {'2 * ' if gated else ''}{i}")
    prefix = ckpt_name(idx, name)
    up_name = "gate_up_proj" if gated else "up_proj"
    if f"{prefix}.{up_name}" in idx:
        algo = qcfg.algo_for(f"{prefix}.{up_name}") or qcfg.algo_for(prefix)
        if algo is None:
            return None
        return _load_stacked(idx, prefix, e, h, i, kind == "bmm", algo, activation, error)
    if not gated:
        return _load_per_expert(idx, prefix, name, e, h, i, ("up_proj", "down_proj"), qcfg, loader, activation, error)
    for names in EXPERT_PROJ_NAMES:
        if f"{prefix}.0.{names[0]}.weight" in idx or f"{prefix}.0.{names[0]}.weight_packed" in idx:
            break
    else:
        raise error(f"missing tensor {prefix}.0.gate_proj.weight (experts {name}: found neither per-expert "
                    f"{{gate,up,down}}_proj / w1,w3,w2 tensors nor stacked {prefix}.gate_up_proj)")
    return _load_per_expert(idx, prefix, name, e, h, i, names, qcfg, loader, activation, error)


def _load_per_expert(idx, prefix, name, e, h, i, names, qcfg, loader, activation, error) -> NVFP4Experts | None:
    """Per-expert 2-D tensors ``prefix.{j}.{proj}.*``; ``names`` = (gate, up, down) or (up, down)."""
    if f"{prefix}.0.{names[0]}.weight" not in idx and f"{prefix}.0.{names[0]}.weight_packed" not in idx:
        raise error(f"missing tensor {prefix}.0.{names[0]}.weight (experts {name}: found neither per-expert "
                    f"{'/'.join(names)} tensors nor stacked ones)")
    algos = {qcfg.algo_for(f"{prefix}.{j}.{p}") for j in range(e) for p in names}
    if algos == {None}:
        return None
    if len(algos) != 1:
        raise error(f"experts {name}: projections mix quantization algorithms {sorted(map(str, algos))}; "
                    "nvgemm needs one per MoE layer")
    algo = algos.pop()
    layers = []
    for j in range(e):
        ups = [loader(idx, f"{prefix}.{j}.{p}", _Shape(i, h), algo, qcfg) for p in names[:-1]]
        down = loader(idx, f"{prefix}.{j}.{names[-1]}", _Shape(h, i), algo, qcfg)
        layers.append((ups[0] if len(ups) == 2 else None, ups[-1], down))
    try:
        return NVFP4Experts.from_linears(layers, activation)
    except ValueError as err:
        raise error(f"experts {prefix}: {err}") from None


class _Shape:
    """Stands in for an ``nn.Linear`` when loading one projection of one expert."""

    bias = None

    def __init__(self, out_features: int, in_features: int):
        self.out_features, self.in_features = out_features, in_features


def _expert_scalars(idx, key: str, e: int, error) -> torch.Tensor:
    """A scale stored once for all experts (``()``/``[1]``) or per expert (``[E]``) -> fp32 ``[E]``."""
    t = idx.get(key)
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) or t.numel() not in (1, e):
        raise error(f"tensor {key}: {t.dtype} {tuple(t.shape)}, expected a float scalar or one value per expert ({e})")
    v = t.float().reshape(-1).expand(e).contiguous()
    if not bool(torch.isfinite(v).all()) or bool((v <= 0).any()):
        raise error(f"tensor {key}: values {v.tolist()} are not positive finite scales")
    return v


def _load_stacked(idx, prefix, e, h, i, transposed, algo, activation, error) -> NVFP4Experts:
    out = []
    gated = activation == "silu_mul"
    for proj, n, k in (("gate_up_proj" if gated else "up_proj", 2 * i if gated else i, h), ("down_proj", h, i)):
        key = f"{prefix}.{proj}"
        kb = k // NVFP4.block_size
        w, s = idx.get(key), idx.get(f"{key}_weight_scale")
        w_shape, s_shape = ((e, k // 2, n), (e, kb, n)) if transposed else ((e, n, k // 2), (e, n, kb))
        for t, tk, dt, shape in ((w, key, torch.uint8, w_shape), (s, f"{key}_weight_scale", torch.float8_e4m3fn, s_shape)):
            if t.dtype != dt or tuple(t.shape) != shape:
                raise error(f"tensor {tk}: {t.dtype} {tuple(t.shape)}, expected {dt} {shape}"
                            f"{' (stacked, transposed: K packed along dim 1)' if transposed else ''}")
        try:
            check_block_scales(s, f"tensor {key}_weight_scale")  # the dense loader's and vLLM's byte rule
        except ValueError as e:
            raise error(str(e)) from None
        if transposed:  # byte [e, c, n] holds K = 2c (low nibble), 2c+1 of column n: repack row-major
            w, s = w.transpose(1, 2), s.transpose(1, 2)
        g2 = _expert_scalars(idx, f"{key}_weight_scale_2", e, error)
        ins = None
        if algo == "NVFP4":
            ins = _expert_scalars(idx, f"{key}_input_scale", e, error)
        elif f"{key}_input_scale" in idx:
            raise error(f"tensor {key}_input_scale: present, but {prefix} is {algo} (weight-only)")
        out.append((w.contiguous(), torch.stack([to_blocked(s[j].contiguous()) for j in range(e)]), g2, ins))
    (w13, s13, g13, i13), (w2, s2, g2_, i2) = out
    return NVFP4Experts(w13, s13, g13, i13, w2, s2, g2_, i2, activation)


class Llama4MoeNVFP4(nn.Module):
    """Llama-4's MoE block on ``nvfp4_moe``: top-k of the router logits, the sigmoid score multiplies the
    expert input (``router_weight_on_input``, top-1), the shared expert's output is added before the
    op's single rounding. Returns ``(out, router_logits)`` like ``Llama4TextMoe``."""

    def __init__(self, block: nn.Module, experts: NVFP4Experts):
        super().__init__()
        self.top_k = block.top_k
        self.hidden_dim = block.hidden_dim
        self.router = block.router
        self.shared_expert = block.shared_expert
        experts.router_weight_on_input = True
        self.experts = experts

    def forward(self, hidden_states: torch.Tensor):
        x = hidden_states.reshape(-1, self.hidden_dim)
        router_scores, router_logits = self.router(x)
        ids = torch.topk(router_logits, self.top_k, dim=1).indices
        weights = router_scores.gather(1, ids)
        return self.experts(x, ids, weights, shared_out=self.shared_expert(x)), router_logits


def replace_moe_layers(model: nn.Module, idx, qcfg, loader, error) -> tuple[list[str], set[str]]:
    """Replace every quantized experts module; return (replaced names, router module names)."""
    replaced, routers = [], set()
    for name, mod in list(model.named_modules()):
        kind = experts_kind(mod)
        if kind is None:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        for r in ("gate", "router"):
            if isinstance(getattr(parent, r, None), nn.Module):
                routers.add(f"{parent_name}.{r}" if parent_name else r)
        new = load_experts(idx, name, mod, kind, qcfg, loader, error)
        if new is None:
            continue
        if kind == "bmm":
            gp_name, _, pchild = parent_name.rpartition(".")
            if type(parent).__name__ != "Llama4TextMoe":
                raise error(f"experts {name}: BMM experts inside {type(parent).__name__}; nvgemm serves the "
                            "Llama-4 block (Llama4TextMoe) only")
            setattr(model.get_submodule(gp_name) if gp_name else model, pchild, Llama4MoeNVFP4(parent, new))
        else:
            setattr(parent, child, new)
        replaced.append(name)
    return replaced, routers

