"""Load a Hugging Face folder exported by ModelOpt into a transformers model with NVFP4Linear layers.

Understood layouts:
  * ModelOpt unified HF export: ``hf_quant_config.json`` and/or ``config.json``'s
    ``quantization_config`` with ``quant_algo`` NVFP4 (W4A4), W4A16_NVFP4 (weight-only) or
    MIXED_PRECISION (per-layer ``quantized_layers`` map); ``exclude_modules`` / ``ignore`` honoured
    (fnmatch wildcards). Tensors per layer: ``weight`` uint8 [N, K/2], ``weight_scale`` e4m3
    [N, K/16] (linear), ``weight_scale_2`` fp32, ``input_scale`` fp32 (W4A4 only), ``bias``.
  * compressed-tensors ``nvfp4-pack-quantized``: ``weight_packed``, ``weight_scale``,
    ``weight_global_scale`` and ``input_global_scale`` are *divisors*; they are converted to
    ModelOpt's multipliers as ``1 / divisor`` in fp32 (one rounding, <= 0.5 ulp relative).
  * MoE layers (``nvgemm.integrations.modelopt.moe``): transformers 5 fused experts and Llama-4 BMM experts become
    ``NVFP4Experts`` (per-expert or stacked checkpoint tensors, per-expert scales kept exact); routers
    stay unquantized; shared experts and dense MLPs are ordinary ``NVFP4Linear`` layers.
  * Already-swizzled 1-D scales (TensorRT-LLM style) are loaded only when the caller says so
    (``swizzled_scales=True``): a flattened *linear* matrix has exactly the swizzled size whenever
    N % 128 == 0 and K % 64 == 0, so the bytes cannot tell. They are then un-swizzled with the
    exact inverse and the conversion is logged; without the flag any 1-D scale is refused.

Everything else (other quant_algos in a mixed map, nibble-swapped producers we cannot detect,
missing / extra / mis-shaped tensors) raises ``CheckpointError`` naming the layer or tensor.
Tensors are streamed one at a time with safetensors; nothing is dequantized at load, so no
fp32 temporary of any layer is created.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from nvgemm.core.formats import NVFP4, blocked_numel, check_block_scales, from_blocked
from nvgemm.nn.linear import NVFP4Linear, prepare_for_sm90
from nvgemm.nn.experts import NVFP4Experts
from nvgemm.nn.lm_head import quantize_lm_head as _quantize_lm_head
from nvgemm.ops.prepared import one_copy_wanted
from nvgemm.core.files import read_json, safetensors_files
from nvgemm.integrations.modelopt.moe import ckpt_name, replace_moe_layers
from nvgemm.nn.mlp import fuse_gated_mlps
from nvgemm.nn.shards import fuse_linear_shards

log = logging.getLogger("nvgemm_cutedsl")

SUPPORTED_ALGOS = ("NVFP4", "W4A16_NVFP4")


class CheckpointError(ValueError):
    """A checkpoint nvgemm cannot load exactly; the message names the layer / tensor / format."""


@dataclass
class QuantConfig:
    producer: str  # "modelopt" | "compressed-tensors"
    quant_algo: str  # NVFP4 | W4A16_NVFP4 | MIXED_PRECISION
    group_size: int = 16
    exclude: list[str] = field(default_factory=list)
    per_layer: dict[str, str] = field(default_factory=dict)  # MIXED_PRECISION: layer -> algo
    ct_targets: list[tuple[list[str], str]] = field(default_factory=list)  # compressed-tensors groups

    def algo_for(self, name: str) -> str | None:
        """The quant algo of module ``name`` (None = not quantized)."""
        if any(_matches(name, p) for p in self.exclude):
            return None
        if self.producer == "compressed-tensors":
            for targets, algo in self.ct_targets:
                if any(t == "Linear" or _matches(name, t) for t in targets):
                    return algo
            return None
        if self.quant_algo == "MIXED_PRECISION":
            return self.per_layer.get(name)
        return self.quant_algo


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        import re

        return re.fullmatch(pattern[3:], name) is not None or re.match(pattern[3:], name) is not None
    return name == pattern or fnmatch.fnmatchcase(name, pattern) or name.startswith(pattern + ".")


def read_quant_config(ckpt: str | Path) -> QuantConfig:
    """Read the quantization description of an exported folder (see the module docstring)."""
    ckpt = Path(ckpt)
    cfg_path, hfq_path = ckpt / "config.json", ckpt / "hf_quant_config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{ckpt}: no config.json; is this a Hugging Face export folder?")
    config = _json_object(cfg_path)
    qc = config.get("quantization_config")
    if hfq_path.exists():
        q = _json_object(hfq_path).get("quantization")
        if not isinstance(q, dict):
            raise CheckpointError(f"{hfq_path}: the 'quantization' section is {_json_kind(q)}, "
                                  "expected a JSON object")
        algo = q.get("quant_algo")
        return _modelopt_config(algo, q.get("group_size", 16), q.get("exclude_modules") or [],
                                q.get("quantized_layers") or {}, str(hfq_path))
    if not qc:
        raise CheckpointError(f"{ckpt}: neither hf_quant_config.json nor config.json:quantization_config; "
                              "not a quantized export")
    if not isinstance(qc, dict):
        raise CheckpointError(f"{cfg_path}: quantization_config is {_json_kind(qc)}, expected a JSON object")
    method = qc.get("quant_method")
    if method == "modelopt":
        return _modelopt_config(qc.get("quant_algo"), 16, qc.get("ignore") or qc.get("exclude_modules") or [],
                                qc.get("quantized_layers") or {}, str(cfg_path))
    if method == "compressed-tensors":
        fmt = qc.get("format")
        if fmt != "nvfp4-pack-quantized":
            raise CheckpointError(f"{cfg_path}: compressed-tensors format {fmt!r} is not NVFP4 "
                                  "('nvfp4-pack-quantized'); nvgemm cannot load it")
        groups = []
        for gname, g in (qc.get("config_groups") or {}).items():
            w = g.get("weights") or {}
            if w.get("num_bits") != 4 or w.get("type") != "float" or w.get("group_size") != 16:
                raise CheckpointError(f"{cfg_path}: compressed-tensors group {gname} is not NVFP4 (4-bit float, group 16)")
            algo = "NVFP4" if g.get("input_activations") else "W4A16_NVFP4"
            groups.append((list(g.get("targets") or []), algo))
        return QuantConfig("compressed-tensors", "MIXED_PRECISION" if len({a for _, a in groups}) > 1 else
                           (groups[0][1] if groups else "NVFP4"), 16, list(qc.get("ignore") or []), {}, groups)
    raise CheckpointError(f"{cfg_path}: quant_method {method!r} is not a format nvgemm loads "
                          "(expected 'modelopt' or compressed-tensors 'nvfp4-pack-quantized')")


def _json_kind(value) -> str:
    """How a JSON value reads in an error message: its JSON type and a short repr."""
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
    text = repr(value)
    return f"{kind} ({text[:60] + '...' if len(text) > 60 else text})"


def _json_object(path: Path) -> dict:
    """``path`` parsed as JSON, which must be an object (a list or a scalar is a broken export)."""
    value = read_json(path, CheckpointError)
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: holds {_json_kind(value)}, expected a JSON object")
    return value


def _modelopt_config(algo, group_size, exclude, quantized_layers, where) -> QuantConfig:
    if algo not in (*SUPPORTED_ALGOS, "MIXED_PRECISION"):
        raise CheckpointError(f"{where}: quant_algo {algo!r} is not NVFP4; nvgemm loads {SUPPORTED_ALGOS} "
                              "and MIXED_PRECISION maps of them")
    if group_size != 16 or type(group_size) is not int:
        raise CheckpointError(f"{where}: group_size {group_size!r} ({type(group_size).__name__}) must be the "
                              "integer 16; NVFP4 uses 16-element blocks")
    garbled = [p for p in exclude if "\x00" in p]
    if garbled:  # ModelOpt 0.47 on NemotronH writes "lm_head.\x00backbone.pt_name_sentinel": the name is before NUL
        log.warning("nvgemm_cutedsl: %s: exclude_modules %s hold a NUL-separated suffix (a ModelOpt export artifact); "
                    "using the module names before it", where, garbled)
        exclude = [p.split("\x00")[0].rstrip(".") if "\x00" in p else p for p in exclude]
    if not isinstance(quantized_layers, dict):
        raise CheckpointError(f"{where}: quantized_layers is {_json_kind(quantized_layers)}, expected a JSON "
                              "object (layer name -> quant_algo)")
    per_layer = {}
    for name, lc in quantized_layers.items():
        la = lc.get("quant_algo") if isinstance(lc, dict) else lc
        if la not in SUPPORTED_ALGOS:
            raise CheckpointError(f"{where}: layer {name} uses quant_algo {la!r}; nvgemm loads only {SUPPORTED_ALGOS}")
        if isinstance(lc, dict) and (lc.get("group_size", 16) not in (16, 0, None)
                                     or type(lc.get("group_size", 16)) not in (int, type(None))):
            raise CheckpointError(f"{where}: layer {name} has group_size {lc.get('group_size')!r} "
                                  f"({type(lc.get('group_size')).__name__}); must be the integer 16")
        per_layer[name] = la
    return QuantConfig("modelopt", algo, 16, list(exclude), per_layer)


# --------------------------------------------------------------------------- tensors


class _TensorIndex:
    """Lazy access to every tensor of a (possibly sharded) safetensors folder."""

    def __init__(self, ckpt: Path):
        from safetensors import safe_open

        files = safetensors_files(ckpt, CheckpointError)  # regular files only: a FIFO would hang
        self._handles = {}
        self.where: dict[str, Path] = {}
        for f in files:
            try:
                h = safe_open(str(f), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types for corrupt files
                raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from None
            self._handles[f] = h
            for k in h.keys():
                if k in self.where:
                    raise CheckpointError(f"tensor {k} appears in both {self.where[k].name} and {f.name}")
                self.where[k] = f
        self.used: set[str] = set()
        self._prefixes: set[str] | None = None

    def has_prefix(self, prefix: str) -> bool:
        """Whether some tensor is named ``prefix.<...>``."""
        if self._prefixes is None:
            self._prefixes = {k[:i] for k in self.where for i in range(len(k)) if k[i] == "."}
        return prefix in self._prefixes

    def __contains__(self, key: str) -> bool:
        return key in self.where

    def get(self, key: str) -> torch.Tensor:
        if key not in self.where:
            raise CheckpointError(f"missing tensor {key}")
        self.used.add(key)
        return self._handles[self.where[key]].get_tensor(key)

    def unused(self) -> list[str]:
        return sorted(set(self.where) - self.used)


def _expect(t: torch.Tensor, name: str, dtype: torch.dtype | tuple, shape: tuple | None) -> torch.Tensor:
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    if t.dtype not in dtypes:
        raise CheckpointError(f"tensor {name}: dtype {t.dtype}, expected {' or '.join(map(str, dtypes))}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"tensor {name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t


def _scalar(t: torch.Tensor, name: str) -> torch.Tensor:
    _expect(t, name, (torch.float32, torch.bfloat16, torch.float16), None)
    if t.numel() != 1:
        raise CheckpointError(f"tensor {name}: shape {tuple(t.shape)}, expected a scalar (0-dim or [1])")
    v = t.float().reshape(())
    if not bool(torch.isfinite(v)) or float(v) <= 0:
        raise CheckpointError(f"tensor {name}: value {float(v)} is not a positive finite scale")
    return v


def load_nvfp4_linear(idx: _TensorIndex, prefix: str, linear: nn.Module, algo: str, cfg: QuantConfig,
                      swizzled_scales: bool = False) -> NVFP4Linear:
    """Build the NVFP4Linear replacing ``linear`` (named ``prefix``) from its checkpoint tensors.

    ``swizzled_scales``: 1-D ``weight_scale`` tensors are pre-swizzled 128x4 bytes (see the module
    docstring); otherwise a 1-D scale is refused."""
    n, k = linear.out_features, linear.in_features
    if k % NVFP4.block_size:
        raise CheckpointError(f"layer {prefix}: in_features={k} is not a multiple of 16")
    kb = k // NVFP4.block_size
    ct = cfg.producer == "compressed-tensors"
    w_key = f"{prefix}.weight_packed" if ct else f"{prefix}.weight"
    weight = _expect(idx.get(w_key), w_key, torch.uint8, (n, k // 2))
    s_key = f"{prefix}.weight_scale"
    scale = idx.get(s_key)
    if scale.dim() == 1:
        if not swizzled_scales:
            raise CheckpointError(
                f"tensor {s_key}: 1-D block scales ({scale.numel()} bytes) where the linear [{n}, {kb}] matrix is "
                "expected; a flattened linear matrix and pre-swizzled (128x4) bytes can have the same size, so "
                "nvgemm does not guess: pass swizzled_scales=True if this export stores swizzled scales")
        if scale.numel() != blocked_numel(n, kb):
            raise CheckpointError(
                f"tensor {s_key}: 1-D scales of {scale.numel()} bytes do not have the 128x4 swizzled size of a "
                f"[{n}, {kb}] matrix ({blocked_numel(n, kb)} bytes)"
            )
        _expect(scale, s_key, (torch.uint8, torch.float8_e4m3fn), None)
        log.info("nvgemm_cutedsl: %s holds pre-swizzled (128x4) 1-D scales (swizzled_scales=True); "
                 "un-swizzling exactly", s_key)
        scale = from_blocked(scale.view(torch.float8_e4m3fn), n, kb)
    scale = _expect(scale, s_key, torch.float8_e4m3fn, (n, kb))
    try:
        check_block_scales(scale, f"tensor {s_key}")  # the same byte rule as the vLLM path
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if ct:
        ws2 = 1.0 / _scalar(idx.get(f"{prefix}.weight_global_scale"), f"{prefix}.weight_global_scale")
    else:
        ws2 = _scalar(idx.get(f"{prefix}.weight_scale_2"), f"{prefix}.weight_scale_2")
    in_key = f"{prefix}.input_global_scale" if ct else f"{prefix}.input_scale"
    if algo == "NVFP4":
        ins = _scalar(idx.get(in_key), in_key)
        if ct:
            ins = 1.0 / ins
    else:
        if in_key in idx:
            raise CheckpointError(f"tensor {in_key}: present, but layer {prefix} is {algo} (weight-only)")
        ins = None
    bias = None
    if f"{prefix}.bias" in idx:
        bias = _expect(idx.get(f"{prefix}.bias"), f"{prefix}.bias", (torch.bfloat16, torch.float16, torch.float32), (n,))
    elif getattr(linear, "bias", None) is not None:
        raise CheckpointError(f"missing tensor {prefix}.bias (the model's layer has a bias)")
    for extra in ("weight_zero_point", "pre_quant_scale", "svdquant_lora_a", "weight_scale_inv"):
        if f"{prefix}.{extra}" in idx:
            raise CheckpointError(f"tensor {prefix}.{extra}: not part of plain NVFP4; nvgemm cannot apply it")
    return NVFP4Linear.from_tensors(weight, scale, ws2, ins, bias)


# --------------------------------------------------------------------------- model


def load_modelopt_checkpoint(
    ckpt: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16, *,
    sm90_one_copy: bool | None = None,
    swizzled_scales: bool = False, trust_remote_code: bool = False, fuse_gated_mlp: bool = False,
    fuse_shards: bool = True,
    quantize_lm_head: bool | str = False, lm_head_input_scale: float | None = None,
) -> nn.Module:
    """Load an exported NVFP4 checkpoint folder into a transformers causal LM with NVFP4Linear layers.

    Non-quantized weights (embeddings, norms, ``lm_head``) keep the checkpoint's values cast to
    ``dtype``. ``swizzled_scales=True`` declares that 1-D ``weight_scale`` tensors are pre-swizzled
    128x4 bytes (refused otherwise). Code shipped in the checkpoint folder (``auto_map``) runs only
    with ``trust_remote_code=True``. Raises ``CheckpointError`` for anything it cannot load exactly.

    On an sm_90 GPU the layers the sm90 kernels will serve are then held once, in the kernels'
    layout (:func:`nvgemm.nn.linear.prepare_for_sm90`; one log line per layer and a total);
    ``sm90_one_copy=False`` (or ``NVGEMM_SM90_ONE_COPY=0`` when not given) keeps the checkpoint
    layout, and the kernels' prepared copy beside it at the first call.

    The decode layout is the default where it is exact: ``fuse_shards=True`` makes each attention block's
    ``q_proj`` / ``k_proj`` / ``v_proj`` one GEMM and each MLP's ``gate_proj`` / ``up_proj`` another
    (:func:`nvgemm.nn.shards.fuse_linear_shards`: per-column alpha for unequal ``weight_scale_2``) when the
    shards share ``input_scale`` (one activation quantization; ModelOpt's export equalizes it); otherwise they
    stay split. The model computes the split layers' numbers bit for bit; under ``torch.compile`` with
    ``nvgemm.enable()`` the SwiGLU then goes into the gate_up epilogue. The state_dict holds
    ``qkv_proj.fused.*`` / ``gate_up_proj.fused.*`` for the fused groups.

    ``fuse_gated_mlp=True`` (before the shards) replaces each gated MLP with NVFP4 gate/up/down by
    :class:`nvgemm.nn.mlp.NVFP4GatedMLP`: one gate_up GEMM with SwiGLU in its epilogue also in eager mode, and
    where gate_up and down are W4A4 the fused requant chain (gate_up emits down's NVFP4 input); see that
    module for the numerics (one rounding instead of four) and the state_dict keys (``gate_up_proj``).

    ``model.nvgemm_fused_mlps`` / ``model.nvgemm_fused_shards`` list the modules fused.

    ``quantize_lm_head`` (off by default: it changes the logits) quantizes the checkpoint's bf16
    ``lm_head`` at load with ModelOpt's NVFP4 weight recipe (:mod:`nvgemm.nn.lm_head`): ``True`` /
    ``"auto"`` picks W4A4 on an sm_100-family GPU and W4A16 elsewhere (the sm90 kernels on Hopper, the
    emulated path on CPU); ``"w4a16"`` / ``"w4a4"`` choose explicitly. W4A4 quantizes the head's input
    with a static scale: ``lm_head_input_scale`` (a calibrated ``amax(x) / 2688``) or, by default, the
    bound of the final norm's output, which cannot saturate. ``model.nvgemm_lm_head`` names the mode
    (None when off).
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    ckpt = Path(ckpt)
    qcfg = read_quant_config(ckpt)
    try:
        config = AutoConfig.from_pretrained(str(ckpt), trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError) as e:  # unknown model_type, remote code refused, bad config
        hint = ("; the folder ships its own model code (auto_map): nvgemm runs it only with "
                "trust_remote_code=True" if not trust_remote_code and "auto_map" in read_json(ckpt / "config.json",
                                                                                               CheckpointError) else "")
        raise CheckpointError(f"{ckpt / 'config.json'}: transformers cannot build the model config "
                              f"({str(e).splitlines()[0] if str(e) else type(e).__name__}){hint}") from None
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # nvgemm applies the quantization itself
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    idx = _TensorIndex(ckpt)

    moe_layers, routers = replace_moe_layers(model, idx, qcfg, load_nvfp4_linear, CheckpointError)
    replaced = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or name in routers:  # MoE routers stay unquantized
            continue
        ck = ckpt_name(idx, name)
        algo = qcfg.algo_for(ck)  # the config names checkpoint modules
        if algo is None:
            continue
        if f"{ck}.weight_scale" not in idx:
            raise CheckpointError(f"missing tensor {ck}.weight_scale (the quantization config makes layer "
                                  f"{name} {algo}; is exclude_modules complete?)")
        new = load_nvfp4_linear(idx, ck, mod, algo, qcfg, swizzled_scales).to(device)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        replaced.append(name)

    state = {}
    expected = dict(model.named_parameters())
    expected.update({k: v for k, v in model.named_buffers() if not _is_nvfp4_buffer(model, k)})
    persistent = set(model.state_dict().keys())
    for key, ref in expected.items():
        if key not in persistent:
            continue  # non-persistent buffers (rotary tables) were built for real by the config
        ck = ckpt_name(idx, key)
        if ck not in idx:
            continue
        t = idx.get(ck)
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"tensor {key}: shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if t.dtype == torch.uint8 or t.dtype == torch.float8_e4m3fn:
            raise CheckpointError(f"tensor {key}: quantized dtype {t.dtype} for a layer nvgemm treats as unquantized")
        state[key] = t.to(ref.dtype) if t.is_floating_point() else t  # the model's dtype (fp32 routers stay fp32)
    model.load_state_dict(state, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False) or getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    missing = [k for k, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if missing:
        raise CheckpointError(f"missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    unused = idx.unused()
    if unused:
        raise CheckpointError(f"unexpected tensor {unused[0]} in the checkpoint" +
                              (f" (and {len(unused) - 1} more)" if len(unused) > 1 else "") +
                              "; nvgemm does not know what to do with it")
    model.to(device)
    model.eval()
    model.nvgemm_lm_head = None
    if quantize_lm_head:
        try:
            _quantize_lm_head(model, quantize_lm_head, input_scale=lm_head_input_scale, device=device)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        log.info("nvgemm: lm_head quantized to NVFP4 at load (%s, quantize_lm_head=%r)", model.nvgemm_lm_head,
                 quantize_lm_head)
    elif lm_head_input_scale is not None:
        raise CheckpointError("lm_head_input_scale is given but quantize_lm_head is off")
    model.nvgemm_fused_mlps = []
    if fuse_gated_mlp:
        model.nvgemm_fused_mlps = [n for n, why in fuse_gated_mlps(model).items() if why is None]
    model.nvgemm_fused_shards = []
    if fuse_shards:
        model.nvgemm_fused_shards = [n for n, why in fuse_linear_shards(model).items() if why is None]
    kind = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    if kind is not None and one_copy_wanted(sm90_one_copy):
        prepare_for_sm90(model, kind, log=log)  # layer by layer: one layer's two copies at a time
    model.nvgemm_quant_config = qcfg
    model.nvgemm_quantized_layers = replaced
    model.nvgemm_moe_layers = moe_layers
    return model


def _is_nvfp4_buffer(model: nn.Module, key: str) -> bool:
    parent, _, _ = key.rpartition(".")
    try:
        return isinstance(model.get_submodule(parent), (NVFP4Linear, NVFP4Experts))
    except AttributeError:
        return False
