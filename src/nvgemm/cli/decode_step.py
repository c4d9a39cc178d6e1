"""``nvgemm bench decode-step``: the kernels of one batch-1 decode step, counted from Inductor's generated code.

A decode step is modelled from what ``nvgemm.enable()`` + ``torch.compile(mode="max-autotune")`` really emits
for a preset on a GPU, without that GPU:

1. **The graphs.** One decoder layer at the preset's real dimensions (:class:`DecoderLayer`: RMSNorm, q/k/v,
   RoPE from rotary tables read at the position, a write of the new K/V into a static 1k KV cache (with the
   fused qkv GEMM the capture pass makes both one ``nvgemm::rope_kv_write``), flash attention over the cache, o_proj + residual,
   RMSNorm, gate/up, SiLU-and-mul, down + residual), built from nvgemm's own modules the way the loader
   builds them (``NVFP4Linear``; ``--layout fused``: q/k/v stacked with ``NVFP4Linear.fuse`` and the MLP
   patched by :func:`nvgemm.nn.mlp.fuse_gated_mlps`, as ``load_modelopt_checkpoint(fuse_gated_mlp=True)``;
   on Hopper every layer held in the sm90 layout, ``prepare_for_sm90``, as the loader does on an sm_90 GPU, and
   likewise on the W4A16 ``mma`` kernel's GPUs, sm_120a / sm_121a / sm_89 / sm_86 / sm_80: dense presets only,
   nvgemm has no grouped MoE kernel there). ``--format w4a4`` on sm_120a / sm_121a keeps the checkpoint layout
   and the sm120 W4A4 kernels (``cutedsl_sm120``) serve the linears.
   A MoE preset (Qwen3-30B-A3B) replaces the MLP by :class:`SparseMoeBlock`: the bf16 router, softmax + top-k
   (+ renormalisation) as a serving engine runs them, and nvgemm's ``NVFP4Experts`` (``nvgemm::nvfp4_moe``:
   the sm90 grouped W4A16 kernels on Hopper, the sm100 grouped W4A4 kernels on Blackwell).
   And the head: the next step's embedding gather, the final RMSNorm, the bf16 ``lm_head`` (with
   ``--quantize-lm-head`` the NVFP4Linear ``load_modelopt_checkpoint(quantize_lm_head=True)`` builds) and a greedy
   argmax. Each graph's CUDA code is generated on a fake device of the GPU's arch
   (:func:`nvgemm.integrations.inductor.codegen.generate_cuda_code`); nvgemm's lowering takes the policy's
   first pick (nothing to time), Inductor's own GEMMs (``lm_head``) are ATen (cuBLAS).
2. **The launches.** The generated wrapper's ``call`` is replayed on FakeTensors (:func:`replay`): every
   Triton kernel it runs, every extern kernel (cuBLAS, flash attention) and every ``nvgemm::`` op. An
   ``nvgemm::`` op is expanded by running **its own host launcher** (the op's Python body, down to the
   backend's ``prepare_*_args`` and ``launch``) with every device launch recorded: the AOT GEMM
   (``AotKernel.launch``), Triton kernels (``JITFunction.run``) and each ATen op that would run a CUDA
   kernel (a ``TorchDispatchMode``: everything but views and allocations). A helper kernel removed from
   a launcher, or a fusion added to the capture pass, changes the count with no edit here. The call runs
   twice: a warm-up (eager: memos and workspaces filled, value checks run) and the counted step, replayed
   as a CUDA graph capture sees it (``torch.cuda.is_current_stream_capturing()`` is true, so work the
   launchers skip under capture -- ``nvfp4_moe``'s id range check, a host sync -- is not counted).
3. **The model** (every figure a MODEL; ``nvgemm.heuristics.perfmodel``): nvgemm GEMMs at their config
   (``estimate(...).gemm_us``: kernel + launch); grouped MoE GEMMs by their family's model
   (``templates/sm100_moe/perf.py``, ``templates/sm90_moe/perf.py``: uniform routing of the step's token);
   cuBLAS GEMMs by ``bf16_baseline``; Triton and helper
   kernels as a launch (``hardware.launch_us``; ``aux_kernel_us`` for the launchers' tiny ATen helpers)
   plus their bytes at the achievable bandwidth; flash attention as a launch plus the K/V bytes of the
   whole cache streamed by one CTA per (batch, KV head, 128 query rows) at the per-SM fabric rate
   (SDPA's flash kernel does not split the KV sequence at decode), capped by the achievable bandwidth. PDL
   (a Triton kernel compiled with ``gdc_wait``, a GEMM config with ``pdl``) takes
   ``hardware.pdl_saving_us`` off its launch. Low and high ends of every range give the step's range;
   ``ms_per_token_model`` is its middle. Per step = ``layers`` x the layer + the head (one layer compiled,
   scaled by the layer count). Tensor parallelism adds one all-reduce after o_proj and after down_proj
   (not in the generated code: the fake device has no process group; charged :data:`ALLREDUCE_US`).

On a GPU the same command builds ``--layers`` layers with random NVFP4 weights, compiles them with nvgemm
and times the step under a CUDA graph (:func:`measure_on_gpu`), printed beside the model.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import unittest.mock as um
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from nvgemm.aot import cache as cache_mod
from nvgemm.dispatch import registry
from nvgemm.heuristics.perfmodel import bf16_baseline, estimate, get_hardware
from nvgemm.integrations.inductor.codegen import fake_cuda_device, generate_cuda_code, policy_pick_only
from nvgemm.integrations.inductor.registration import disable as nvgemm_disable, enable as nvgemm_enable, \
    enabled as nvgemm_enabled
from nvgemm.core.formats import blocked_shape
from nvgemm.nn.experts import NVFP4Experts
from nvgemm.nn.linear import NVFP4Linear, prepare_for_sm90
from nvgemm.nn.mlp import fuse_gated_mlps
from nvgemm.ops.prepared import sm90_weight_of
from nvgemm.templates.sm100_moe import perf as sm100_moe_perf
from nvgemm.templates.sm100_moe.config import moe_config_from_name as sm100_moe_config_from_name
from nvgemm.templates.sm90_moe import perf as sm90_moe_perf
from nvgemm.templates.sm90_moe.perf import byte_floor_us


# =============================================================================================
# presets
# =============================================================================================


@dataclass(frozen=True)
class DecodePreset:
    """One model's decode-relevant dimensions (from its Hugging Face ``config.json``, ``source``)."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    source: str
    context: int = 1024  # KV tokens attended per step (a static cache of this length)
    eps: float = 1e-5
    # MoE (experts > 0): every layer's MLP is a routed-expert block (router + top-k softmax + experts)
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k probabilities (Qwen3-MoE's ``norm_topk_prob``)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)

    @property
    def moe(self) -> bool:
        return self.experts > 0


#: Model presets (batch 1, bf16 activations, NVFP4 linears, bf16 embedding / lm_head).
DECODE_PRESETS: dict[str, DecodePreset] = {p.name: p for p in (
    DecodePreset("Llama-3.1-8B", 4096, 14336, 32, 8, 128, 128256, 32,
                 "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json"),
    DecodePreset("Llama-3.1-70B", 8192, 28672, 64, 8, 128, 128256, 80,
                 "https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json"),
    # every layer sparse (decoder_sparse_step 1, mlp_only_layers []): the dense intermediate_size (6144) is unused
    DecodePreset("Qwen3-30B-A3B", 2048, 0, 32, 4, 128, 151936, 48,
                 "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (hidden_size 2048, "
                 "num_hidden_layers 48, num_attention_heads 32, num_key_value_heads 4, head_dim 128, num_experts 128, "
                 "num_experts_per_tok 8, moe_intermediate_size 768, norm_topk_prob true, rms_norm_eps 1e-6, "
                 "vocab_size 151936, tie_word_embeddings false)",
                 eps=1e-6, experts=128, top_k=8, moe_intermediate=768, norm_topk_prob=True, qk_norm=True),
)}

#: Modelled-step goals (ms per token, batch 1) by (preset, GPU).
GOALS_MS = {("Llama-3.1-8B", "H200"): 1.35, ("Llama-3.1-8B", "B200"): 1.0}

#: One decode all-reduce of a hidden-sized bf16 vector over NVLink (one-shot custom all-reduce), us:
#: an assumption (latency-bound; NCCL's ring all-reduce at this size is slower). Not in the generated code.
ALLREDUCE_US = (4.0, 8.0)

#: The archs where the W4A16 ``mma`` kernel alone serves the dense layers (backend ``cutedsl_mma_w4a16``): GeForce /
#: workstation Blackwell, DGX Spark, Ada, Ampere. nvgemm has no grouped MoE kernel for them.
MMA_ARCHS = ("sm_120a", "sm_121a", "sm_89", "sm_86", "sm_80")
ARCH_FORMAT = {"sm_90a": "W4A16", "sm_100a": "W4A4", "sm_103a": "W4A4", "sm_100f": "W4A4",
               **{a: "W4A16" for a in MMA_ARCHS}}


#: The archs where another format may be asked for (``--format``): the sm120 W4A4 kernels (``cutedsl_sm120``,
#: ``cutedsl_sm120_moe``) serve sm_120a / sm_121a beside the W4A16 ``mma`` kernel.
ARCH_FORMATS = {"sm_120a": ("W4A16", "W4A4"), "sm_121a": ("W4A16", "W4A4")}


def gpu_format(gpu: str, fmt: Optional[str] = None) -> str:
    """The step's NVFP4 format on ``gpu``: ``fmt`` (``W4A4`` / ``W4A16``) where the arch runs it, else the arch's
    own (``None`` / ``auto``)."""
    arch = get_hardware(gpu).arch
    if fmt is None or fmt.lower() == "auto":
        return ARCH_FORMAT[arch]
    allowed = ARCH_FORMATS.get(arch, (ARCH_FORMAT[arch],))
    if fmt.upper() not in allowed:
        raise ValueError(f"--format {fmt}: nvgemm runs {' / '.join(allowed)} on {gpu} ({arch})")
    return fmt.upper()


# =============================================================================================
# the layer, as a serving engine runs it
# =============================================================================================


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n, dtype=torch.bfloat16, device=device), requires_grad=False)

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def attention(q, k_cache, v_cache, scale: float):
    """SDPA's flash kernel over the whole static cache (what the step runs on a GPU; CUDA only)."""
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k_cache, v_cache, 0.0, False, False, scale=scale)[0]


def rope_tables(positions: int, head_dim: int, theta: float = 500000.0, device=None):
    """bf16 rotary tables [positions, head_dim]: rows ``cat(f, f)`` of ``cos`` / ``sin`` of ``pos * theta**(-2i/D)``
    (Llama's; a rope scaling would be folded into the frequencies here)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None]
    ang = torch.cat((ang, ang), -1)
    return ang.cos().to(torch.bfloat16).to(device), ang.sin().to(torch.bfloat16).to(device)


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


class Attention(nn.Module):
    """Self-attention at batch-1 decode over a static KV cache, as a serving engine writes it (vLLM's form: rotary
    tables read at the position, ``rotate_half`` RoPE, ``index_copy_`` into the cache). With the fused qkv GEMM
    the capture pass turns RoPE + the cache writes into ``nvgemm::rope_kv_write`` (one kernel;
    :mod:`nvgemm.integrations.inductor.rope_kv`); otherwise Inductor fuses them into its own kernels."""

    def __init__(self, p: DecodePreset, tp: int, lin, fused: bool):
        super().__init__()
        self.nh, self.kvh, self.d = p.heads // tp, max(1, p.kv_heads // tp), p.head_dim
        q, k, v = lin(p.hidden, self.nh * self.d), lin(p.hidden, self.kvh * self.d), lin(p.hidden, self.kvh * self.d)
        if fused:
            self.qkv_proj = NVFP4Linear.fuse([q, k, v])
        else:
            self.q_proj, self.k_proj, self.v_proj = q, k, v
        self.o_proj = lin(self.nh * self.d, p.hidden)
        if p.qk_norm:  # Qwen3: RMSNorm over each head's q and k before RoPE
            self.q_norm, self.k_norm = RMSNorm(self.d, p.eps, q.weight.device), RMSNorm(self.d, p.eps, q.weight.device)

    def forward(self, h, k_cache, v_cache, pos, cos, sin):
        """``cos`` / ``sin``: the rotary tables [positions, head_dim] (any rope scaling folded in), read at ``pos``."""
        nh, kvh, d = self.nh, self.kvh, self.d
        if hasattr(self, "qkv_proj"):
            q, k, v = self.qkv_proj(h).split([nh * d, kvh * d, kvh * d], -1)
        else:
            q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        # GQA at decode: each KV head's query group is its query rows (no repeat of K/V)
        q, k, v = q.view(1, kvh, nh // kvh, d), k.view(1, kvh, 1, d), v.view(1, kvh, 1, d)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        c, s = cos[pos], sin[pos]  # [1, head_dim]: this token's row
        q, k = _rope(q, c, s), _rope(k, c, s)
        k_cache.index_copy_(2, pos, k)  # the static cache: this token's slot
        v_cache.index_copy_(2, pos, v)
        o = attention(q, k_cache, v_cache, d ** -0.5)
        return self.o_proj(o.reshape(1, nh * d))


class GatedMLP(nn.Module):
    """transformers' ``LlamaMLP`` shape: children gate_proj / up_proj / down_proj / act_fn (what the loader patches)."""

    def __init__(self, p: DecodePreset, tp: int, lin):
        super().__init__()
        i = p.intermediate // tp
        self.gate_proj, self.up_proj, self.down_proj = lin(p.hidden, i), lin(p.hidden, i), lin(i, p.hidden)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def meta_experts(p: DecodePreset, tp: int, weight_only: bool) -> NVFP4Experts:
    """The layer's routed experts as the loader holds them (``NVFP4Experts``: stacked checkpoint layout, gate/up
    fused per expert; per-expert input scales for W4A4), with meta tensors of the real shapes (TP shards I)."""
    e, h, i = p.experts, p.hidden, p.moe_intermediate // tp
    u8, f32 = torch.uint8, torch.float32

    def t(shape, dtype=u8):
        return torch.empty(shape, dtype=dtype, device="meta")

    ins = None if weight_only else t((e,), f32)
    return NVFP4Experts(t((e, 2 * i, h // 2)), t((e, *blocked_shape(2 * i, h // 16)), torch.float8_e4m3fn),
                        t((e,), f32), ins, t((e, h, i // 2)), t((e, *blocked_shape(h, i // 16)), torch.float8_e4m3fn),
                        t((e,), f32), None if ins is None else t((e,), f32), "silu_mul")


class SparseMoeBlock(nn.Module):
    """A routed-expert MLP as a serving engine runs it at decode: the bf16 router (ModelOpt leaves it
    unquantized), softmax in fp32, top-k, renormalised (``norm_topk_prob``), then nvgemm's
    ``NVFP4Experts`` (``nvgemm::nvfp4_moe``) on the routed ids / fp32 weights."""

    def __init__(self, p: DecodePreset, tp: int, weight_only: bool, device="meta"):
        super().__init__()
        self.top_k, self.norm_topk_prob = p.top_k, p.norm_topk_prob
        self.gate = nn.Parameter(torch.empty(p.experts, p.hidden, dtype=torch.bfloat16, device=device),
                                 requires_grad=False)
        self.experts = meta_experts(p, tp, weight_only)

    def forward(self, x):
        probs = torch.softmax(torch.nn.functional.linear(x, self.gate), -1, dtype=torch.float32)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
        return self.experts(x, ids, w)


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer at batch 1 (transformers' Llama / Qwen3-MoE layer, KV cache static)."""

    def __init__(self, p: DecodePreset, tp: int = 1, weight_only: bool = False, layout: str = "checkpoint",
                 device="meta"):
        super().__init__()

        def lin(k, n):
            return NVFP4Linear(k, n, weight_only=weight_only, device=device)

        self.input_layernorm = RMSNorm(p.hidden, p.eps, device)
        self.self_attn = Attention(p, tp, lin, fused=layout == "fused")
        self.post_attention_layernorm = RMSNorm(p.hidden, p.eps, device)
        self.mlp = SparseMoeBlock(p, tp, weight_only, device) if p.moe else GatedMLP(p, tp, lin)
        if layout == "fused" and not p.moe:
            fuse_gated_mlps(self)

    def forward(self, x, k_cache, v_cache, pos, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), k_cache, v_cache, pos, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Head(nn.Module):
    """The step's model-level kernels: the embedding gather of this token, the final norm, the lm_head, argmax.

    ``lm_head``: bf16 (the checkpoint's), or with ``quantize_lm_head`` an NVFP4Linear in the GPU's format, as
    ``load_modelopt_checkpoint(quantize_lm_head=True)`` builds it (W4A16 on Hopper, W4A4 on Blackwell)."""

    def __init__(self, p: DecodePreset, tp: int = 1, device="meta", quantize_lm_head: bool = False,
                 weight_only: bool = False):
        super().__init__()
        self.embed = nn.Parameter(torch.empty(p.vocab, p.hidden, dtype=torch.bfloat16, device=device),
                                  requires_grad=False)
        self.norm = RMSNorm(p.hidden, p.eps, device)
        if quantize_lm_head:
            self.lm_head = NVFP4Linear(p.hidden, p.vocab // tp, weight_only=weight_only, device=device)
        else:
            self.lm_head = nn.Parameter(torch.empty(p.vocab // tp, p.hidden, dtype=torch.bfloat16, device=device),
                                        requires_grad=False)

    def forward(self, ids, x):
        h0 = self.embed[ids]
        if isinstance(self.lm_head, NVFP4Linear):
            logits = self.lm_head(self.norm(x))
        else:
            logits = torch.nn.functional.linear(self.norm(x), self.lm_head)
        return h0, logits.argmax(-1)


def prepare_like_loader(layer: nn.Module, gpu: str, fmt: Optional[str] = None) -> None:
    """On Hopper (and on the ``mma`` kernel's archs, :data:`MMA_ARCHS`) the loader holds every NVFP4 layer the
    W4A16 kernels serve in their layout only (``NVFP4Linear.prepare_for_sm90``). The layer here has meta weights (no values to re-encode), so the
    same module state is set directly: the checkpoint buffers dropped, ``sm90_weight`` / ``sm90_scale`` of the
    prepared shapes (those ``nvgemm::nvfp4_linear_sm90_prepared`` checks), ``sm90_kind``."""
    if get_hardware(gpu).arch not in ("sm_90a", *MMA_ARCHS) or gpu_format(gpu, fmt) != "W4A16":
        return

    for mod in layer.modules():
        if isinstance(mod, NVFP4Linear) and mod.sm90_kind is None and mod.in_features % 32 == 0:
            e = torch.empty(0, dtype=torch.uint8, device="meta")
            p = sm90_weight_of(e, e, mod.weight_scale_2, mod.out_features, mod.in_features, "bf16")
            mod.weight = None
            mod.weight_scale = None
            mod.register_buffer("sm90_weight", torch.empty(p.n_tiles, p.n_chunks * 512, dtype=torch.uint8,
                                                           device="meta"), persistent=False)
            mod.register_buffer("sm90_scale", torch.empty(p.n_tiles, p.n_chunks * 64, dtype=torch.uint8,
                                                          device="meta"), persistent=False)
            mod.sm90_kind = "bf16"


# =============================================================================================
# code generation on a fake device
# =============================================================================================


@dataclass
class Graph:
    name: str
    code: str
    inputs: list  # FakeTensors, in the wrapper's argument order
    fake_mode: Any


def _fake_inputs(module: nn.Module, fm, extra: list[tuple[tuple, torch.dtype]]):
    named = {k: v for k, v in list(module.named_parameters()) + list(module.named_buffers()) if v is not None}
    with fm:
        ex = [torch.empty(s, dtype=d, device="cuda") for s, d in extra]
        ws = [torch.empty(v.shape, dtype=v.dtype, device="cuda") for v in named.values()]
    names = list(named)

    def fn(*args):
        return torch.func.functional_call(module, dict(zip(names, args[len(ex):])), tuple(args[:len(ex)]))

    return fn, ex + ws


def _fake_mode():
    """A FakeTensorMode with a (static) shape environment, as ``make_fx`` makes one: lowerings that trace a
    helper symbolically (the M-range dispatch of an autotuned choice) need the ambient mode's ShapeEnv."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)


def layer_graph(p: DecodePreset, gpu: str, tp: int = 1, layout: str = "checkpoint", fm=None,
                fmt: Optional[str] = None) -> Graph:
    """The generated code of one decoder layer of ``p`` on fake ``gpu`` under ``nvgemm.enable()``."""
    fm = fm or _fake_mode()
    # fusing shards reads their scales (NVFP4Linear.fuse checks input_scale equality): built on the CPU with
    # the default (zero code, unit scale) values, then only the shapes are kept
    layer = DecoderLayer(p, tp, weight_only=gpu_format(gpu, fmt) == "W4A16", layout=layout,
                         device="cpu" if layout == "fused" else "meta").to("meta")
    prepare_like_loader(layer, gpu, fmt)  # on meta tensors: shapes only
    kvh, d = max(1, p.kv_heads // tp), p.head_dim
    bf = torch.bfloat16
    fn, inputs = _fake_inputs(layer, fm, [((1, p.hidden), bf), ((1, kvh, p.context, d), bf),
                                          ((1, kvh, p.context, d), bf), ((1,), torch.long),
                                          ((p.context, d), bf), ((p.context, d), bf)])
    with warnings.catch_warnings(), nvgemm_enabled(), policy_pick_only():
        warnings.simplefilter("ignore")
        code = generate_cuda_code(fn, inputs, gpu=gpu)
    return Graph("layer", code, inputs, fm)


def head_graph(p: DecodePreset, gpu: str, tp: int = 1, fm=None, quantize_lm_head: bool = False,
               fmt: Optional[str] = None) -> Graph:
    fm = fm or _fake_mode()
    head = Head(p, tp, quantize_lm_head=quantize_lm_head, weight_only=gpu_format(gpu, fmt) == "W4A16")
    prepare_like_loader(head, gpu, fmt)  # an NVFP4 head is held in the sm90 layout on Hopper, like the layers
    fn, inputs = _fake_inputs(head, fm, [((1,), torch.long), ((1, p.hidden), torch.bfloat16)])
    with warnings.catch_warnings(), nvgemm_enabled(), policy_pick_only():
        warnings.simplefilter("ignore")
        code = generate_cuda_code(fn, inputs, gpu=gpu)
    return Graph("head", code, inputs, fm)


# =============================================================================================
# replaying the generated wrapper: every launch
# =============================================================================================


@dataclass
class Launch:
    """One device kernel of the step."""

    name: str
    kind: str  # gemm | triton | attention | helper
    origin: str  # where it comes from: "inductor", "nvgemm::<op> launcher", "cuBLAS", ...
    bytes: int = 0
    pdl: bool = False
    gemm: Optional[dict] = None  # config, m, n, k of an nvgemm / cuBLAS GEMM
    attention: Optional[dict] = None
    us: tuple[float, float] = (0.0, 0.0)
    note: str = ""

    @property
    def mid_us(self) -> float:
        return 0.5 * (self.us[0] + self.us[1])


#: ATen ops that launch no kernel (allocations, views, metadata).
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh", "detach",
              "alias", "view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand", "unsqueeze",
              "squeeze", "reshape", "slice", "select", "split", "split_with_sizes", "unbind", "view_as",
              "is_same_size", "_reshape_alias", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
              "set_", "resize_", "_has_compatible_shallow_copy_type", "is_nonzero"}


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _tensors(obj) -> list:
    out = []
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            out.extend(_tensors(o))
    elif isinstance(obj, dict):
        for o in obj.values():
            out.extend(_tensors(o))
    return out


class _Recorder:
    """Collects the launches; ``origin`` names the op whose launcher runs."""

    def __init__(self):
        self.launches: list[Launch] = []
        self.origin = "inductor"
        self.syncs: list[str] = []
        self.moe: Optional[dict] = None  # (m, top_k, experts) of the nvfp4_moe call being expanded
        self.capturing = False  # the steady step is replayed as a CUDA graph capture sees it

    def add(self, launch: Launch) -> None:
        self.launches.append(launch)


def _aten_recorder(rec: _Recorder):
    from torch.utils._python_dispatch import TorchDispatchMode

    class AtenLaunches(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
            ns = getattr(func, "namespace", "")
            if name == "_local_scalar_dense":  # a FakeTensor has no value: 0 stands in (a value check passes)
                rec.syncs.append(f"{rec.origin}: .item() (a device-to-host sync)")
                return 0
            out = func(*args, **kwargs)
            if ns == "aten" and name.rstrip("_") not in _NO_KERNEL and name not in _NO_KERNEL \
                    and not getattr(func, "is_view", False) \
                    and any(t.device.type == "cuda" for t in _tensors(out)):  # .to("meta") etc. launch nothing
                nb = sum(_nbytes(t) for t in _tensors(args) + _tensors(kwargs)) + sum(_nbytes(t) for t in _tensors(out))
                if name in ("zero_", "fill_", "zeros", "arange", "full"):  # writes only
                    nb = sum(_nbytes(t) for t in _tensors(out))
                rec.add(Launch(f"aten.{name}", "helper", rec.origin, nb))
            return out

    return AtenLaunches()


class _FakeKernel:
    """Stands in for a loaded ``AotKernel``: records its launch (the spec names the config)."""

    def __init__(self, rec: _Recorder, spec):
        self.rec, self.spec = rec, spec

    def launch(self, *values):
        ts = [v for v in values if isinstance(v, torch.Tensor)]
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        cfg = self.spec.config
        act = getattr(self.spec.epilogue, "activation", "none")
        if "moe" in self.spec.template_id:
            self._launch_moe(values, ts, cfg, act)
            return
        if self.spec.template_id.startswith("sm120"):  # sm120 ABI: x [M, K/2] codes, x scales, weight [N, K/2], ...
            m, n, k = values[0].shape[0], values[2].shape[0], values[2].shape[-1] * 2
        elif len(ints) >= 3:  # sm100 ABI: ..., m, n, k (the MMA frame; swap-AB puts the tokens in n)
            m_k, n_k, k = ints[-3], ints[-2], ints[-1]
            m, n = (n_k, m_k) if getattr(cfg, "swap_ab", False) else (m_k, n_k)
        else:  # sm90 ABI: x [M, K], ..., out [M, N_out] (N = 2 N_out with the gated epilogue)
            x, out = values[0], values[6]
            m, k = x.shape[0], x.shape[-1]
            n = out.shape[-1] * (2 if act == "silu_mul" else 1)
        self.rec.add(Launch(self.spec.name(), "gemm", self.rec.origin, sum(_nbytes(t) for t in ts),
                            pdl=bool(getattr(cfg, "pdl", False)),
                            gemm={"config": cfg, "m": m, "n": n, "k": k, "arch": self.spec.arch, "epilogue": act}))

    def bind(self, values, per_call):
        """A bound launch (``AotKernel.bind``): a call passes the stream (always the last argument), then the
        tensors of the other ``per_call`` positions; each call is recorded as :meth:`launch` records it."""
        last = len(values) - 1
        positions = [i for i in per_call if i != last]

        def launch(stream, *tensors):
            v = list(values)
            for i, t in zip(positions, tensors):
                v[i] = t
            v[last] = stream
            self.launch(*v)
        return launch


    def _launch_moe(self, values, ts, cfg, act):
        """A grouped MoE GEMM: (tokens, top_k, experts) of the op being expanded, weight rows per expert and K
        from the ABI (sm100: ``Sm100MoeGemmArgs.abi_values``, m = rows; sm90: ``x, rows, tiles, weight, ..., out``)."""
        ctx = self.rec.moe or {}
        if self.spec.template_id.startswith("sm100"):
            # a, b, sfa, sfb, c, alpha, tiles, res, ws, cnt, final, shared, resid, y_rows, wts, flags, m, n, k, ...
            rows, k = values[16], values[18]
        elif self.spec.template_id.startswith("sm120"):  # x, x_scale, weight [E, rows, K/2], ..., rows, rows_padded
            rows, k = values[10], values[2].shape[-1] * 2
        else:
            x, out = values[0], values[6]
            k = x.shape[-1]
            rows = out.shape[-1] * (2 if act == "silu_mul" else 1)
        # bytes: what the grouped kernel can touch at most is every expert; the model charges the routed ones
        self.rec.add(Launch(self.spec.name(), "gemm", self.rec.origin, sum(_nbytes(t) for t in ts),
                            pdl=bool(getattr(cfg, "pdl", False)),
                            gemm={"config": cfg, "m": ctx.get("m", 1), "n": rows, "k": k, "arch": self.spec.arch,
                                  "epilogue": act, "moe": {"family": self.spec.template_id,
                                                           "top_k": ctx.get("top_k", 1),
                                                           "experts": ctx.get("experts", 1)}}))


def _opdef_impl(qualname: str):
    from torch._library.custom_ops import OPDEFS

    d = OPDEFS.get(qualname)
    return None if d is None else d._init_fn


@contextlib.contextmanager
def record_launches(gpu: str, rec: _Recorder):
    """Run nvgemm ops' host launchers on FakeTensors of fake ``gpu``, recording every device launch."""
    import triton.runtime.jit as tjit

    # lazy: triton import cost
    from nvgemm.templates.sm100_moe import backend as sm100_moe_backend
    from nvgemm.templates.sm100_w4a4 import backend as sm100_backend
    from nvgemm.templates.sm120_moe import backend as sm120_moe_backend
    from nvgemm.templates.sm120_w4a4 import backend as sm120_backend
    from nvgemm.templates.sm90_moe import backend as sm90_moe_backend
    from nvgemm.templates.sm90_w4a16 import backend as sm90_backend
    from nvgemm.templates.triton import _common as tcommon

    def jit_run(self, *args, grid=None, warmup=False, **kwargs):
        src = getattr(self, "src", "") or ""
        ts = _tensors(list(args)) + _tensors(kwargs)
        # a kernel that touches a few rows of a large operand (the KV cache) names its bytes
        touched = getattr(sys.modules.get(self.fn.__module__), "launch_bytes", None)
        nb = touched(self.fn.__name__, args) if touched is not None else None
        rec.add(Launch(self.fn.__name__, "triton", rec.origin, nb if nb is not None else sum(_nbytes(t) for t in ts),
                       pdl=bool(kwargs.get("launch_pdl")) or bool(kwargs.get("USE_GDC")), note=src[:0]))

    def cache_get(self, spec, *a, **k):
        return _FakeKernel(rec, spec)

    stream = type("S", (), {"cuda_stream": 0, "synchronize": lambda self: None})()
    decisions = dict(registry._DECISIONS)
    with contextlib.ExitStack() as st:
        st.enter_context(fake_cuda_device(gpu))
        st.enter_context(um.patch.dict(os.environ, {"NVGEMM_SELFCHECK": "0"}))  # the first-use check runs once, not per step
        st.enter_context(um.patch.object(tjit.JITFunction, "run", jit_run))
        st.enter_context(um.patch.object(cache_mod.KernelCache, "get", cache_get))
        st.enter_context(um.patch.object(sm100_backend, "resolve_max_active_clusters", lambda *a, **k: 0))
        st.enter_context(um.patch("torch.cuda.current_stream", lambda *a, **k: stream))
        # the warm-up step runs eagerly; the steady step is the one a CUDA graph captures (value checks and
        # first-use work that the launchers skip under capture are not part of it)
        st.enter_context(um.patch("torch.cuda.is_current_stream_capturing", lambda *a, **k: rec.capturing))
        plans, bindings = dict(registry._PLANS), dict(registry._BINDINGS)

        def clear():  # per-problem memos that hold a kernel (here: a recorder's stand-in) or a decision
            tcommon._capability.cache_clear()
            sm90_backend._kernel_for.cache_clear()
            sm90_moe_backend._kernel_for.cache_clear()
            sm100_moe_backend._kernel_for.cache_clear()
            sm100_backend.launch_plan.cache_clear()
            sm100_backend.device_target.cache_clear()
            sm120_backend.launch_plan.cache_clear()
            sm120_backend.device_target.cache_clear()
            sm120_moe_backend._kernel_for.cache_clear()
            registry._DECISIONS.clear()
            registry._PLANS.clear()
            registry._BINDINGS.clear()

        clear()
        try:
            yield
        finally:
            clear()
            registry._DECISIONS.update(decisions)
            registry._PLANS.update(plans)
            registry._BINDINGS.update(bindings)


@contextlib.contextmanager
def _own_device_memos():
    """The split-K workspace pool empty for one replay: its pairs are FakeTensors of this replay's mode, and a
    later replay (another mode) must not meet them. Kept across the warm-up and the counted step, as a process
    keeps it across steps. (The launchers' per-device index memos are per fake mode already:
    ``templates.common.derived.device_memo``.)"""
    from nvgemm.templates.common.workspace import WORKSPACES  # lazy: only the pool object, patched per replay

    with um.patch.dict(WORKSPACES._current, clear=True), um.patch.dict(WORKSPACES._capture, clear=True):
        yield


class _TorchProxy:
    """``torch`` for the replayed wrapper: ``torch.ops.<ns>.<op>.<overload>`` and ``torch.cuda`` are intercepted."""

    def __init__(self, ops):
        self.ops = ops
        self.cuda = type("C", (), {"_DeviceGuard": staticmethod(lambda i: contextlib.nullcontext()),
                                   "set_device": staticmethod(lambda i: None)})()

    def __getattr__(self, name):
        return getattr(torch, name)


class _OpsProxy:
    def __init__(self, call):
        self._call = call

    def __getattr__(self, ns):
        call = self._call

        class Ns:
            def __getattr__(self, op):
                class Op:
                    def __getattr__(self, overload):
                        return lambda *a, **k: call(ns, op, overload, a, k)

                    def __call__(self, *a, **k):
                        return call(ns, op, "default", a, k)

                return Op()

        return Ns()


def _triton_sources(code: str) -> dict[str, str]:
    return {m.group(1): m.group(3) for m in
            re.finditer(r"(\w+) = async_compile\.triton\('(\w+)', '''(.*?)'''", code, re.S)}


def replay(graph: Graph, gpu: str) -> tuple[list[Launch], list[str]]:
    """Every device launch of ``graph``'s generated ``call`` in the steady state (its second run), in order,
    nvgemm ops expanded by their launchers."""
    from torch._inductor import async_compile as ac

    rec = _Recorder()
    fm = graph.fake_mode
    srcs = _triton_sources(graph.code)
    aten_mode = _aten_recorder(rec)

    class TritonKernel:
        def __init__(self, name):
            self.name, self.src = name, srcs.get(name, "")

        def run(self, *args, stream=None, **kw):
            ts = [a for a in args if isinstance(a, torch.Tensor)]
            ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
            numel = math.prod(ints) if ints else 0
            # each pointer argument is read or written once over the launch's elements (at most the tensor)
            nb = sum(min(_nbytes(t), numel * t.element_size()) if numel else _nbytes(t) for t in ts)
            nb += sum(min(_nbytes(t), numel * t.element_size()) for t, nm in zip(ts, self._ptr_names()) if
                      nm.startswith("in_out_ptr"))
            rec.add(Launch(self.name, "triton", "inductor", nb, pdl="gdc_wait" in self.src))

        def _ptr_names(self):
            m = re.search(r"def \w+\((.*?)\)", self.src, re.S)
            return [a.strip().split(":")[0] for a in m.group(1).split(",")] if m else []

    def extern(name):
        def run(*args, out=None, **kw):
            a, b = args[0], args[1]
            if name in ("mm", "addmm", "bmm"):
                if name == "addmm":
                    a, b = args[1], args[2]
                m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
                batch = a.shape[0] if name == "bmm" else 1
                rec.add(Launch(f"cuBLAS {name}", "gemm", "inductor (extern)", 2 * batch * (m * k + k * n + m * n),
                               gemm={"cublas": True, "m": m, "n": n * batch, "k": k}))
            else:
                rec.add(Launch(f"extern {name}", "helper", "inductor (extern)",
                               sum(_nbytes(t) for t in _tensors(args))))
            return out
        return run

    def op_call(ns, op, overload, args, kwargs):
        fn = getattr(getattr(getattr(torch.ops, ns), op), overload)
        if ns == "nvgemm":
            impl = _opdef_impl(f"nvgemm::{op}")
            rec.origin = f"nvgemm::{op} launcher"
            if "moe" in op:
                rec.moe = {"m": args[0].shape[0], "top_k": args[1].shape[1], "experts": args[3].shape[0]}
            try:
                with fm, record_launches(gpu, rec), aten_mode:
                    res = impl(*args, **kwargs)
            finally:
                rec.origin = "inductor"
                rec.moe = None
            return res
        with fm:
            res = fn(*args, **kwargs)
        if "attention" in op:
            q, k = args[0], args[1]
            rec.add(Launch(f"aten.{op}", "attention", "inductor (extern)",
                           sum(_nbytes(t) for t in _tensors(args[:3])) + _nbytes(_tensors(res)[0]),
                           attention={"batch": q.shape[0], "q_heads": q.shape[1], "q_len": q.shape[2],
                                      "kv_heads": k.shape[1], "kv_len": k.shape[2], "head_dim": q.shape[3]}))
        else:
            rec.add(Launch(f"{ns}.{op}", "helper", "inductor (fallback)",
                           sum(_nbytes(t) for t in _tensors(args) + _tensors(res))))
        return res

    def empty_strided(size, stride, dtype=torch.float32, *a, **k):
        with fm:
            return torch.empty_strided(size, stride, dtype=dtype, device="cuda")

    def reinterpret(t, size, stride, offset=0):
        with fm:
            return t.as_strided(size, stride, t.storage_offset() + offset)

    def noop(*a, **k):
        return None

    ns: dict[str, Any] = {"__name__": "nvgemm_decode_step_replay"}
    with um.patch.object(ac.AsyncCompile, "triton", lambda self, name, *a, **k: TritonKernel(name)), \
            um.patch.object(ac.AsyncCompile, "wait", lambda self, scope: None), \
            um.patch.object(ac.AsyncCompile, "__init__", lambda self: None):
        exec(compile(graph.code, f"<generated {graph.name}>", "exec"), ns)
    ops = _OpsProxy(op_call)
    ns.update(torch=_TorchProxy(ops), aten=getattr(ops, "aten"), empty_strided_cuda=empty_strided,
              reinterpret_tensor=reinterpret, assert_size_stride=noop, assert_alignment=noop,
              assert_tensor_metadata=noop, get_raw_stream=lambda i: 0,
              extern_kernels=type("E", (), {"__getattr__": lambda self, n: extern(n)})())
    with warnings.catch_warnings(), _own_device_memos():
        warnings.simplefilter("ignore")
        ns["call"](list(graph.inputs))  # the first step fills the launchers' memos and workspace pools
        rec.launches.clear()
        rec.syncs.clear()
        rec.capturing = True
        ns["call"](list(graph.inputs))  # steady state: what every later step (and a CUDA graph) launches
    return rec.launches, rec.syncs


def moe_call_launches(gpu: str, m: int, top_k: int, experts: int, hidden: int, inter: int) -> list[Launch]:
    """The device launches of one ``nvgemm::nvfp4_moe`` call (W4A16 on Hopper, W4A4 on Blackwell) in the
    steady state, from its host launcher on fake ``gpu`` (as :func:`replay` expands the op: a warm-up call,
    then the call a CUDA graph captures). Routing: token ``t`` slot ``s`` -> expert ``(t * top_k + s) %
    experts`` (the ids' values do not change the launches: the grid is fixed per (M, top_k, E))."""
    p = DecodePreset("moe-call", hidden, 0, 1, 1, 128, 16, 1, "", experts=experts, top_k=top_k,
                     moe_intermediate=inter)
    ex = meta_experts(p, 1, weight_only=gpu_format(gpu) == "W4A16")
    fm = _fake_mode()
    with fm:
        ws = [None if t is None else torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in ex.tensors()]
        x = torch.empty(m, hidden, dtype=torch.bfloat16, device="cuda")
        ids = torch.empty(m, top_k, dtype=torch.int32, device="cuda")
        wts = torch.empty(m, top_k, dtype=torch.float32, device="cuda")
    rec = _Recorder()
    rec.origin = "nvgemm::nvfp4_moe launcher"
    rec.moe = {"m": m, "top_k": top_k, "experts": experts}
    impl = _opdef_impl("nvgemm::nvfp4_moe")
    with warnings.catch_warnings(), _own_device_memos():
        warnings.simplefilter("ignore")
        for capturing in (False, True):
            rec.launches.clear()
            rec.capturing = capturing
            with fm, record_launches(gpu, rec), _aten_recorder(rec):
                impl(x, ids, wts, *ws, "silu_mul", False, None, None, None, None)
    return list(rec.launches)


# =============================================================================================
# the model
# =============================================================================================


def _stream_us(nbytes: float, hw) -> tuple[float, float]:
    lo, hi = hw.achievable_bw_range
    return (nbytes / hi * 1e6, nbytes / lo * 1e6)


def _launch_us(hw, pdl: bool, aux: bool = False) -> tuple[float, float]:
    base = hw.aux_kernel_us if aux else hw.launch_us
    if pdl:
        return (max(0.0, base[0] - hw.pdl_saving_us[1]), max(0.0, base[1] - hw.pdl_saving_us[0]))
    return base


def _model_moe_gemm(launch: Launch, gpu: str) -> None:
    """A grouped MoE GEMM by its family's model (uniform routing: the expected active experts and work slots of
    ``m`` tokens x top-k over the layer's experts); its bytes become the routed experts' weight bytes."""
    g, mo = launch.gemm, launch.gemm["moe"]
    cfg = g["config"]
    g["config"] = cfg.name() if hasattr(cfg, "name") else str(cfg)
    perf = sm100_moe_perf if mo["family"].startswith("sm100") else sm90_moe_perf
    active = perf.expected_active_experts(g["m"], mo["top_k"], mo["experts"])
    launch.bytes = int(active * g["n"] * g["k"] * (0.5 + 1 / 16))
    if mo["family"].startswith("sm120"):  # the sm120 grouped kernels: their family's model (templates/sm120_moe/perf.py)
        from nvgemm.templates.sm120_moe.perf import gemm_range_us  # lazy: only for sm_120 / sm_121 steps

        hw = get_hardware(gpu)
        launch.us = gemm_range_us(cfg, g["m"], mo["top_k"], mo["experts"], g["n"], g["k"], g["epilogue"] == "silu_mul",
                                  hw.arch, hw.sm_count, hw.name)
        launch.note = (f"grouped: {g['m']} token(s) x top-{mo['top_k']} of {mo['experts']} experts ({active:.1f} "
                       f"active), {g['n']} rows x K={g['k']} per expert, {g['config']} (sm120 family model)")
        return
    est = perf.moe_gemm_estimate(cfg, g["m"], mo["top_k"], mo["experts"], g["n"], g["k"], gpu)
    if est is not None:
        launch.us = est.us
        launch.note = (f"grouped: {g['m']} token(s) x top-{mo['top_k']} of {mo['experts']} experts ({active:.1f} "
                       f"active), {g['n']} rows x K={g['k']} per expert, {g['config']}")
        if getattr(cfg, "finalize", False):  # GEMM2 runs the top-k finalize: its last CTA's serial tail
            rounds = None if mo["family"].startswith("sm100") else sm90_moe_perf.sm90_finalize_rounds(g["m"], cfg)
            tail = sm90_moe_perf.fused_finalize_tail_us(g["m"], mo["top_k"], gpu, rounds)
            launch.us = (launch.us[0] + tail[0], launch.us[1] + tail[1])
            launch.note += f" + the fused top-k finalize ({tail[0]:.2f}-{tail[1]:.2f} us tail)"
    else:
        s = _stream_us(launch.bytes, get_hardware(gpu))
        lu = _launch_us(get_hardware(gpu), launch.pdl)
        launch.us = (lu[0] + s[0], lu[1] + s[1])
        launch.note = f"grouped {g['config']} (no perfmodel facts: routed weight bytes + launch)"


def _model_moe_prefetch(launches: list, gpu: str) -> None:
    """Re-price each sm100 grouped (GEMM1, GEMM2) pair of a layer on the decode L2-prefetch timeline where the
    runtime prefetches (``templates/sm100_moe/perf.py``: the prep prefetches GEMM1's routed weights when the
    call's routed weights fit the L2 bound, GEMM1 with ``prefetch_next`` GEMM2's); a MODEL, like the rest."""
    moe = [k for k in launches if k.kind == "gemm" and k.gemm and k.gemm.get("moe")
           and k.gemm["moe"]["family"].startswith("sm100")]
    for g1, g2 in zip(moe[0::2], moe[1::2]):
        mo = g1.gemm["moe"]
        c1, c2 = (sm100_moe_config_from_name(g["config"]) for g in (g1.gemm, g2.gemm))
        m, top_k, experts = g1.gemm["m"], mo["top_k"], mo["experts"]
        dims = (g1.gemm["n"], g1.gemm["k"], g2.gemm["n"], g2.gemm["k"])
        prep = sm100_moe_perf.prefetch_fits_l2(m * top_k, experts, *dims, get_hardware(gpu).l2_mb * 1e6)
        pf2 = c1.prefetch_next
        if not (prep or pf2):
            continue
        us = sm100_moe_perf.prefetched_pair_us(c1, c2, m, top_k, experts, *dims, gpu, prep_prefetch=prep,
                                               gemm1_prefetch=pf2)
        if us is None:
            continue
        tail = (0.0, 0.0)
        if c2.finalize:
            tail = sm90_moe_perf.fused_finalize_tail_us(m, top_k, gpu)
        g1.us = us[0]
        g2.us = (us[1][0] + tail[0], us[1][1] + tail[1])
        what = " and ".join(w for w, on in (("the prep", prep), ("GEMM1 (prefetch_next)", pf2)) if on)
        g1.note += f"; L2-prefetch timeline ({what} prefetch the routed weights)"
        g2.note += "; L2-prefetch timeline"


def model_launch(launch: Launch, gpu: str, tp: int = 1) -> None:
    """Fill ``launch.us`` (the model's (low, high) microseconds) and the GEMM's (M, N, K)."""
    hw = get_hardware(gpu)
    if launch.kind == "gemm" and launch.gemm and launch.gemm.get("cublas"):
        g = launch.gemm
        b = bf16_baseline(g["m"], g["n"], g["k"], gpu)
        pdl_back = (hw.pdl_saving_us[1], hw.pdl_saving_us[0])  # cuBLAS from Inductor: no PDL
        launch.us = (b.total_us[0] + pdl_back[0], b.total_us[1] + pdl_back[1])
        launch.note = f"bf16 M={g['m']} N={g['n']} K={g['k']} (bf16_baseline)"
        return
    if launch.kind == "gemm" and launch.gemm.get("moe"):
        _model_moe_gemm(launch, gpu)
        return
    if launch.kind == "gemm":
        cfg = launch.gemm["config"]
        m, n, k = launch.gemm["m"], launch.gemm["n"], launch.gemm["k"]
        launch.gemm["config"] = cfg.name() if hasattr(cfg, "name") else str(cfg)
        act = "silu_mul" if launch.gemm.get("epilogue") == "silu_mul" else "none"
        est = None
        try:
            est = estimate(cfg, m, n, k, gpu, activation=act)
        except (ValueError, KeyError, TypeError):
            est = None
        if est is not None:
            launch.us = est.gemm_us
            launch.note = f"M={m} N={n} K={k} {launch.gemm['config']}"
        else:  # the model has no facts for it: bytes + launch
            s = _stream_us(launch.bytes, hw)
            lu = _launch_us(hw, launch.pdl)
            launch.us = (lu[0] + s[0], lu[1] + s[1])
            launch.note = f"M={m} N={n} K={k} {launch.gemm['config']} (no perfmodel facts: bytes + launch)"
        return
    if launch.kind == "attention":
        a = launch.attention
        ctas = a["batch"] * a["kv_heads"] * max(1, -(-a["q_len"] // 128))
        fabric = ctas * hw.sm_fabric_bytes_per_clk * hw.clock_hz
        lo_bw, hi_bw = hw.achievable_bw_range
        eff = (min(fabric, hi_bw), min(fabric, lo_bw))
        lu = hw.launch_us
        launch.us = (lu[0] + launch.bytes / eff[0] * 1e6, lu[1] + launch.bytes / eff[1] * 1e6)
        launch.note = (f"{a['kv_heads']} KV heads x {a['kv_len']} tokens, {ctas} CTAs at "
                       f"{hw.sm_fabric_bytes_per_clk:.0f} B/clk each")
        return
    aux = launch.kind == "helper" and launch.origin.startswith("nvgemm::")
    s = _stream_us(launch.bytes, hw)
    lu = _launch_us(hw, launch.pdl, aux=aux)
    launch.us = (lu[0] + s[0], lu[1] + s[1])


def _weight_bytes(p: DecodePreset, tp: int, quantize_lm_head: bool = False) -> tuple[float, float]:
    """(weight bytes a batch-1 step must read per GPU besides the lm_head, lm_head bytes: bf16, or NVFP4 codes +
    e4m3 scales): the NVFP4 decoder linears; for MoE the top-k routed experts (one token reads top_k distinct
    experts) and the bf16 router instead of the dense MLP."""
    i, q, kv = p.intermediate // tp, p.heads // tp * p.head_dim, max(1, p.kv_heads // tp) * p.head_dim
    mlp = p.top_k * 3 * p.hidden * (p.moe_intermediate // tp) if p.moe else 3 * p.hidden * i
    params = p.hidden * (q + 2 * kv) + q * p.hidden + mlp
    per_layer = params * (0.5 + 1 / 16) + (2.0 * p.experts * p.hidden if p.moe else 0.0)
    return per_layer * p.layers, (0.5 + 1 / 16 if quantize_lm_head else 2.0) * (p.vocab // tp) * p.hidden


@dataclass
class StepReport:
    model: str
    gpu: str
    format: str
    layout: str
    tp: int
    layers: int
    layer_kernels: list
    head_kernels: list
    kernels_per_layer: int
    kernels_per_step: int
    ms_per_token_model: float
    ms_per_token_model_range: tuple
    roofline_ms: float
    roofline_fraction: float
    weight_bytes_per_step: float
    breakdown_us: dict
    goal_ms: Optional[float]
    syncs: list = field(default_factory=list)
    measured: Optional[dict] = None
    lm_head: str = "bf16"
    source: str = ""
    routed_experts: Optional[dict] = None  # MoE: the nvfp4_moe op's launches per layer against its byte floor


def _classify(layer: list[Launch]) -> dict:
    """us per layer (mid) by what sets it: GEMM, attention, Triton glue, helpers inside nvgemm ops, collectives."""
    out: dict[str, float] = {}
    for k in layer:
        key = {"gemm": "gemm", "attention": "attention", "triton": "triton"}.get(k.kind, "helper")
        if k.kind == "triton" and k.origin.startswith("nvgemm::"):
            key = "nvgemm op Triton (quantize, ...)"
        if k.kind == "helper" and k.origin.startswith("nvgemm::"):
            key = "nvgemm op helpers (ATen)"
        if k.origin == "collective":
            key = "all-reduce"
        out[key] = out.get(key, 0.0) + k.mid_us
    return out


def _routed_experts(p: DecodePreset, tp: int, gpu: str, layer: list[Launch]) -> dict:
    """The routed experts of one MoE layer (the launches of the ``nvgemm::nvfp4_moe`` op's launcher) against
    the byte floor of the experts one token reads (top-k x 3 x H x I NVFP4 at the achievable bandwidth)."""
    ks = [k for k in layer if k.origin.startswith("nvgemm::nvfp4_moe")]
    us = sum(k.mid_us for k in ks)
    floor = byte_floor_us(1, p.top_k, p.experts, p.hidden, p.moe_intermediate // tp, 0, gpu)
    return {"launches": len(ks), "gemms": sum(k.kind == "gemm" for k in ks), "us_model": round(us, 3),
            "us_model_range": [round(sum(k.us[0] for k in ks), 3), round(sum(k.us[1] for k in ks), 3)],
            "floor_us": round(floor, 3), "floor_fraction_model": round(floor / us, 4) if us else None}


def decode_step(model: str, gpu: str, tp: int = 1, layers: Optional[int] = None, layout: str = "checkpoint",
                quantize_lm_head: bool = False, fmt: Optional[str] = None) -> StepReport:
    """Model one batch-1 decode step of preset ``model`` on ``gpu`` (see the module docstring)."""
    if model not in DECODE_PRESETS:
        raise KeyError(f"unknown decode-step preset {model!r}; known: {', '.join(DECODE_PRESETS)}")
    p = DECODE_PRESETS[model]
    hw = get_hardware(gpu)  # KeyError names the known GPUs
    fmt = gpu_format(gpu, fmt)  # ValueError names the formats the arch runs
    if p.moe and hw.arch in MMA_ARCHS and fmt != "W4A4":
        raise ValueError(f"{model} is a MoE preset: nvgemm has no grouped MoE kernel for {gpu} ({hw.arch}) in {fmt} "
                         f"(the grouped W4A16 kernels are sm_90a; grouped W4A4: sm_100a, and sm_120a / sm_121a with "
                         f"--format w4a4), so its step cannot be modelled there; dense presets only")
    if tp < 1 or p.heads % tp or p.intermediate % tp or p.moe_intermediate % tp or p.vocab % tp:
        raise ValueError(f"--tp {tp} does not divide {model}'s heads ({p.heads}), intermediate and vocab")
    if layout not in ("checkpoint", "fused"):
        raise ValueError(f"--layout must be checkpoint or fused, got {layout!r}")
    n_layers = layers if layers is not None else p.layers
    if n_layers < 1:
        raise ValueError(f"--layers must be >= 1, got {n_layers}")
    lg = layer_graph(p, gpu, tp, layout, fmt=fmt)
    layer, syncs = replay(lg, gpu)
    hg = head_graph(p, gpu, tp, quantize_lm_head=quantize_lm_head, fmt=fmt)
    head, syncs2 = replay(hg, gpu)
    if tp > 1:
        for after in ("o_proj", "down_proj"):
            layer.append(Launch(f"all_reduce after {after} (TP {tp})", "helper", "collective",
                                2 * p.hidden * (tp - 1) // tp * 2, us=ALLREDUCE_US,
                                note="not in the generated code; assumed one-shot NVLink all-reduce"))
        head.append(Launch(f"all_gather logits (TP {tp})", "helper", "collective", 2 * p.vocab,
                           us=ALLREDUCE_US, note="not in the generated code; assumed"))
    for k in layer + head:
        if k.origin != "collective":
            model_launch(k, gpu, tp)
    _model_moe_prefetch(layer, gpu)
    lo = n_layers * sum(k.us[0] for k in layer) + sum(k.us[0] for k in head)
    hi = n_layers * sum(k.us[1] for k in layer) + sum(k.us[1] for k in head)
    mid_ms = 0.5 * (lo + hi) / 1e3
    nvfp4, lm = _weight_bytes(p, tp, quantize_lm_head)
    nvfp4 = nvfp4 / p.layers * n_layers
    roof_ms = (nvfp4 + lm) / (hw.peak_bw_tbs * 1e12) * 1e3
    bd = {k: v * n_layers for k, v in _classify(layer).items()}
    for k, v in _classify(head).items():
        key = "lm_head" if k == "gemm" else f"head {k}"
        bd[key] = bd.get(key, 0.0) + v
    return StepReport(
        routed_experts=_routed_experts(p, tp, gpu, layer) if p.moe else None,
        model=model, gpu=hw.name, format=fmt, layout=layout, tp=tp, layers=n_layers,
        layer_kernels=layer, head_kernels=head, kernels_per_layer=len(layer),
        kernels_per_step=n_layers * len(layer) + len(head), ms_per_token_model=mid_ms,
        ms_per_token_model_range=(lo / 1e3, hi / 1e3), roofline_ms=roof_ms, roofline_fraction=roof_ms / mid_ms,
        weight_bytes_per_step=nvfp4 + lm, breakdown_us=bd,
        goal_ms=GOALS_MS.get((model, hw.name)) if tp == 1 and n_layers == p.layers else None,
        syncs=syncs + syncs2, source=p.source, lm_head=f"NVFP4 {fmt}" if quantize_lm_head else "bf16")


# =============================================================================================
# output
# =============================================================================================


def _kernel_row(k: Launch) -> dict:
    d = {"name": k.name, "kind": k.kind, "origin": k.origin, "bytes": int(k.bytes), "us_model": round(k.mid_us, 3),
         "us_model_range": [round(k.us[0], 3), round(k.us[1], 3)], "pdl": k.pdl, "note": k.note}
    if k.gemm:
        d["gemm"] = {a: k.gemm[a] for a in ("m", "n", "k", "config") if a in k.gemm}
    return d


def report_json(r: StepReport) -> dict:
    return {
        "model": r.model, "gpu": r.gpu, "format": r.format, "layout": r.layout, "tp": r.tp, "layers": r.layers,
        "lm_head": r.lm_head,
        "batch": 1, "context": DECODE_PRESETS[r.model].context, "source": r.source,
        "kernels_per_layer": r.kernels_per_layer, "kernels_per_step": r.kernels_per_step,
        "ms_per_token_model": round(r.ms_per_token_model, 4),
        "ms_per_token_model_range": [round(v, 4) for v in r.ms_per_token_model_range],
        "roofline_ms": round(r.roofline_ms, 4), "roofline_fraction": round(r.roofline_fraction, 4),
        "weight_bytes_per_step": int(r.weight_bytes_per_step), "goal_ms": r.goal_ms,
        "breakdown_us_model": {k: round(v, 2) for k, v in r.breakdown_us.items()},
        "host_syncs": r.syncs,
        "kernels": [dict(_kernel_row(k), where="layer") for k in r.layer_kernels]
        + [dict(_kernel_row(k), where="head") for k in r.head_kernels],
        "measured": r.measured,
        "routed_experts": r.routed_experts,
        "label": "every *_model figure is nvgemm's CPU performance model, not a measurement",
    }


def report_text(r: StepReport) -> str:
    out = [f"{r.model} batch-1 decode step on {r.gpu} ({r.format}, {r.layout} layout, {r.lm_head} lm_head"
           f"{f', TP {r.tp}' if r.tp > 1 else ''}), {r.layers} layers, KV context {DECODE_PRESETS[r.model].context}",
           "kernels from Inductor's generated code on a fake device; nvgemm ops expanded by their host launchers; "
           "times are MODELS (nvgemm perfmodel)", ""]
    hdr = f"{'#':>3} {'kernel':58s} {'kind':9s} {'from':34s} {'bytes':>12s} {'us (model)':>11s} {'PDL':>4s}"
    for title, ks in (("one decoder layer", r.layer_kernels), ("head (once per step)", r.head_kernels)):
        out += [f"-- {title}: {len(ks)} kernels", hdr]
        for i, k in enumerate(ks):
            out.append(f"{i:>3} {k.name[:58]:58s} {k.kind:9s} {k.origin[:34]:34s} {k.bytes:>12,d} "
                       f"{k.mid_us:>11.2f} {'yes' if k.pdl else '-':>4s}")
        out.append(f"    sum {sum(k.mid_us for k in ks):.1f} us (model)")
        out.append("")
    out.append(f"kernels per layer: {r.kernels_per_layer}; per step: {r.kernels_per_step} "
               f"({r.layers} x {r.kernels_per_layer} + {len(r.head_kernels)} head)")
    lo, hi = r.ms_per_token_model_range
    out.append(f"ms/token (model): {r.ms_per_token_model:.3f} (range {lo:.3f}-{hi:.3f})")
    out.append(f"weight bytes/step {r.weight_bytes_per_step / 1e9:.2f} GB -> roofline {r.roofline_ms:.3f} ms at "
               f"{get_hardware(r.gpu).peak_bw_tbs} TB/s peak; share of the roofline (model): {r.roofline_fraction:.0%}")
    if r.goal_ms is not None:
        verdict = "meets" if hi <= r.goal_ms else ("meets only at the optimistic end" if lo <= r.goal_ms else "misses")
        out.append(f"goal <= {r.goal_ms} ms: {verdict} (model)")
    out.append("time by part, per step (model, us): " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                                 sorted(r.breakdown_us.items(), key=lambda kv: -kv[1])))
    if r.routed_experts:
        e = r.routed_experts
        out.append(f"routed experts per layer (nvgemm::nvfp4_moe): {e['launches']} launches ({e['gemms']} GEMMs), "
                   f"{e['us_model']:.1f} us (model) against a {e['floor_us']:.1f} us byte floor: "
                   f"{e['floor_fraction_model']:.0%} of the floor (model)")
    if r.syncs:
        out.append("host syncs inside the step: " + "; ".join(r.syncs))
    if r.measured:
        m = r.measured
        out.append(f"MEASURED on {m['device']}: {m['ms_per_step']:.3f} ms per step of {m['layers']} layers under a "
                   f"CUDA graph (model for the same layers: {m['model_ms']:.3f} ms)")
    return "\n".join(out)


# =============================================================================================
# GPU: the real step under a CUDA graph
# =============================================================================================


def random_layer(p: DecodePreset, tp: int, weight_only: bool, layout: str, seed: int, device="cuda") -> nn.Module:
    """A decoder layer on ``device`` (the GPU) with random NVFP4 weights (ModelOpt recipe) and unit norms."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    layer = DecoderLayer(p, tp, weight_only=weight_only, layout="checkpoint", device="cpu")
    for name, mod in list(layer.named_modules()):
        if isinstance(mod, NVFP4Linear):
            w = (torch.randn(mod.out_features, mod.in_features, generator=g) * 0.02).to(torch.bfloat16)
            lin = nn.Linear(mod.in_features, mod.out_features, bias=False, dtype=torch.bfloat16)
            lin.weight.data.copy_(w)
            new = NVFP4Linear.from_linear(lin, None if weight_only else 0.01)
            parent, _, child = name.rpartition(".")
            setattr(layer.get_submodule(parent), child, new)
    if p.moe:  # random experts quantized on the GPU (ModelOpt recipe), a random bf16 router
        e, h, i = p.experts, p.hidden, p.moe_intermediate // tp
        gd = torch.Generator(device=device).manual_seed(seed)
        w13 = torch.randn(e, 2 * i, h, generator=gd, device=device) * 0.02
        w2 = torch.randn(e, h, i, generator=gd, device=device) * 0.02
        scale = None if weight_only else 0.01
        layer.mlp.experts = NVFP4Experts.from_float(w13, w2, scale, scale)
        del w13, w2
        layer.mlp.gate.data = (torch.randn(e, h, generator=g) * 0.02).to(torch.bfloat16)
    if layout == "fused":
        a = layer.self_attn
        a.qkv_proj = NVFP4Linear.fuse([a.q_proj, a.k_proj, a.v_proj])
        del a.q_proj, a.k_proj, a.v_proj
        if not p.moe:
            fuse_gated_mlps(layer)
    return layer.to(device)


def measure_on_gpu(p: DecodePreset, gpu_model: StepReport, n_layers: int, layout: str, tp: int,
                   iters: int = 20) -> dict:
    """Time ``n_layers`` layers + the head, compiled with nvgemm (max-autotune), replayed as one CUDA graph."""

    weight_only = gpu_model.format == "W4A16"
    layers = nn.ModuleList([random_layer(p, tp, weight_only, layout, seed=i) for i in range(n_layers)])
    head = Head(p, tp, device="cuda")
    torch.nn.init.normal_(head.embed, std=0.02)
    torch.nn.init.normal_(head.lm_head, std=0.02)
    if gpu_model.lm_head != "bf16":  # the loader's quantize_lm_head: ModelOpt's recipe on the bf16 head
        lin = nn.Linear(p.hidden, p.vocab // tp, bias=False, dtype=torch.bfloat16, device="cuda")
        lin.weight.data.copy_(head.lm_head)
        head.lm_head = NVFP4Linear.from_linear(lin, None if weight_only else 0.01)
    prepare_for_sm90(layers)  # the loader's Hopper step (no-op elsewhere)
    prepare_for_sm90(head)
    kvh, d = max(1, p.kv_heads // tp), p.head_dim
    caches = [(torch.zeros(1, kvh, p.context, d, dtype=torch.bfloat16, device="cuda"),
               torch.zeros(1, kvh, p.context, d, dtype=torch.bfloat16, device="cuda")) for _ in range(n_layers)]
    ids = torch.zeros(1, dtype=torch.long, device="cuda")
    pos = torch.full((1,), p.context - 1, dtype=torch.long, device="cuda")
    cos, sin = rope_tables(p.context, d, device="cuda")

    def step(ids):
        x, _ = head.embed[ids], None
        for layer, (kc, vc) in zip(layers, caches):
            x = layer(x, kc, vc, pos, cos, sin)
        return head(ids, x)

    nvgemm_enable()
    try:
        fn = torch.compile(step, mode="max-autotune-no-cudagraphs", fullgraph=True)
        with torch.no_grad():
            for _ in range(3):
                fn(ids)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn(ids)
            graph.replay()
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(iters):
                graph.replay()
            e1.record()
            e1.synchronize()
    finally:
        nvgemm_disable()
    ms = e0.elapsed_time(e1) / iters
    model_ms = (n_layers * sum(k.mid_us for k in gpu_model.layer_kernels)
                + sum(k.mid_us for k in gpu_model.head_kernels)) / 1e3
    return {"device": torch.cuda.get_device_name(), "layers": n_layers, "ms_per_step": ms, "model_ms": model_ms,
            "iters": iters, "note": "random NVFP4 weights; embedding gather, layers, final norm, lm_head, argmax"}


# =============================================================================================
# CLI
# =============================================================================================


def add_arguments(p) -> None:
    p.add_argument("--model", default="Llama-3.1-8B", help=f"preset: {', '.join(DECODE_PRESETS)} (default Llama-3.1-8B)")
    p.add_argument("--gpu", default="H200",
                   help="GPU to model: H100, H200 (W4A16), B200, GB200, B300 (W4A4); the W4A16 mma kernel's GPUs "
                        "RTX5090, RTX5080, RTXPRO6000, GB10, L40S, RTX4090, A10, RTX3090, A100 (dense presets only in "
                        "W4A16; --format w4a4 on the sm_120a / sm_121a ones runs MoE presets too); "
                        "default H200")
    p.add_argument("--format", default="auto", choices=("auto", "w4a4", "w4a16"),
                   help="NVFP4 format of the step: auto = the GPU's (W4A16 on Hopper and on the mma kernel's GPUs, W4A4 "
                        "on B200-class); w4a4 on sm_120a / sm_121a (RTX5090, RTX5080, RTXPRO6000, GB10) runs the "
                        "sm120 W4A4 kernels (cutedsl_sm120)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--layers", type=int, default=None, help="layers per step (default: the preset's)")
    p.add_argument("--layout", default="checkpoint", choices=("checkpoint", "fused"),
                   help="checkpoint: q/k/v, gate/up as the checkpoint stores them "
                        "(load_modelopt_checkpoint(fuse_shards=False)); fused: one qkv and one gate_up GEMM per layer, "
                        "the loader's default where the shards share input_scale (stacked qkv + fuse_gated_mlps)")
    p.add_argument("--quantize-lm-head", action="store_true",
                   help="model an NVFP4 lm_head in the GPU's format (load_modelopt_checkpoint(quantize_lm_head=True)) "
                        "instead of the checkpoint's bf16 one")
    p.add_argument("--json", type=Path, default=None, help="write the report as JSON to this path")
    p.add_argument("--no-measure", action="store_true", help="on a GPU: model only, do not time the step")


def run(args) -> int:
    try:
        r = decode_step(args.model, args.gpu, args.tp, args.layers, args.layout,
                        getattr(args, "quantize_lm_head", False), getattr(args, "format", None))
    except (KeyError, ValueError) as e:
        print(f"nvgemm bench decode-step: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    if torch.cuda.is_available() and not args.no_measure:
        p = DECODE_PRESETS[args.model]
        r.measured = measure_on_gpu(p, r, r.layers, args.layout, args.tp)
    elif not args.no_measure:
        print("nvgemm bench decode-step: no CUDA GPU here: model only (on a GPU the step is also timed under a "
              "CUDA graph)", file=sys.stderr)
    print(report_text(r))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report_json(r), indent=1, default=str))
        print(f"nvgemm bench decode-step: wrote {args.json}", file=sys.stderr)
    return 0


__all__ = ["DECODE_PRESETS", "DecodePreset", "DecoderLayer", "Launch", "SparseMoeBlock", "StepReport", "decode_step",
           "head_graph", "layer_graph", "moe_call_launches", "replay", "report_json", "report_text"]
