"""``nvgemm::nvfp4_moe``: routed NVFP4 experts (W4A4 or W4A16) for already-routed tokens.

Routing (softmax/sigmoid, grouped top-k, correction bias, renormalisation, scaling factors) stays
with the caller: the op takes ``topk_ids`` / ``topk_weights``. Arguments (schema order)::

    x               [M, H] bf16 | fp16
    topk_ids        [M, K] int32   expert ids; -1 = empty slot (contributes nothing)
    topk_weights    [M, K] fp32
    w13             [E, R13, H/2] uint8   per expert [gate; up] rows (gated, R13 = 2I) or up (R13 = I)
    w13_scale       [E, *S13] e4m3 (or raw uint8)  per-expert 128x4-swizzled block scales in their
                    tiled shape S13 = blocked_shape(R13, H/16) (nvgemm.core.formats.to_blocked of each
                    [R13, H/16]); a flat or linear scale is refused (it cannot be told from the bytes)
    w13_scale_2     [E] fp32, or [E, R13] fp32 when an expert's gate/up scales differ (exact per-row alpha)
    w13_input_scale [E] fp32 (W4A4) | None (W4A16)
    w2              [E, H, I/2] uint8, w2_scale [E, *blocked_shape(H, I/16)], w2_scale_2 [E] fp32,
    w2_input_scale  [E] fp32 (W4A4) | None (W4A16)
    activation      "silu_mul" (gated) | "silu" | "relu2" | "gelu_tanh" (non-gated)
    router_weight_on_input  bool: top-1 only (Llama-4); the weight multiplies the input instead
    expert_map      [E_global] int32 | None: global id -> local expert index or -1 (expert parallelism)
    shared_out, residual  [M, H] | None: added to the routed sum before the one rounding
    out_dtype       None (= x.dtype) | bf16 | fp16 | fp32

Numerics contract (every backend is tested against the emulated one, which *is* this
contract; ``shared/research/moe_nvfp4.md`` 7.1). Per token t and slot k with local expert e:

    1. xin = x[t]; with router_weight_on_input: xin = round_dtype(x[t] * w), w := 1
    2. W4A4: xin is quantized with w13_input_scale[e] (nvgemm.core.formats); W4A16: used as is
    3. h = round_dtype(act(acc13 * alpha13[e]))        == nvfp4_linear(xin, w13[e], ..., act)
    4. y = acc2 * alpha2[e] in fp32                      == nvfp4_linear(h, w2[e], ..., out_dtype=fp32)
    5. out[t] = round_out( sum_{k=0..K-1} w*y  (+ shared_out[t]) (+ residual[t]) )
       fp32, slots in order 0..K-1, one rounding; an empty / unmapped slot is skipped.
"""

from __future__ import annotations

from typing import Optional

import torch

from nvgemm.epilogues import apply_activation_ref
from nvgemm.core.formats import NVFP4, blocked_shape
from nvgemm.core.validation import X_DTYPES
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.core.backend import MOE, Backend, MoeProblem
from nvgemm.dispatch.moe import select_moe_backend
from nvgemm.dispatch.registry import register_backend

MOE_ACTIVATIONS = ("silu_mul", "silu", "relu2", "gelu_tanh")
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_W = "nvgemm.nvfp4_moe"


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_stack(w, s, g, ins, name: str, e: int, rows: int, k: int, row_alpha_ok: bool) -> None:
    if w.dtype != torch.uint8 or w.dim() != 3:
        raise TypeError(f"{_W}: {name} must be packed uint8 [E, rows, K/2], got {w.dtype} {_shape(w)}")
    if _shape(w) != (e, rows, k // 2):
        raise ValueError(f"{_W}: {name} has shape {_shape(w)}, expected {(e, rows, k // 2)}")
    if s.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"{_W}: {name}_scale must be float8_e4m3fn (or raw uint8), got {s.dtype}")
    want = (e, *blocked_shape(rows, k // NVFP4.block_size))
    if _shape(s) != want:
        raise ValueError(f"{_W}: {name}_scale must have shape {want} (each expert's [{rows}, {k // 16}] block "
                         f"scales, 128x4-swizzled by nvgemm.core.formats.to_blocked, in its tiled shape), got {_shape(s)}")
    shapes = ((e,), (e, rows)) if row_alpha_ok else ((e,),)
    if g.dtype != torch.float32 or _shape(g) not in shapes:
        raise ValueError(f"{_W}: {name}_scale_2 must be float32 of shape "
                         f"{' or '.join(map(str, shapes))}, got {g.dtype} {_shape(g)}")
    if ins is not None and (ins.dtype != torch.float32 or _shape(ins) != (e,)):
        raise ValueError(f"{_W}: {name}_input_scale must be float32 of shape ({e},), got {ins.dtype} {_shape(ins)}")


def check_moe_args(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                   w2_scale_2, w2_input_scale, activation, router_weight_on_input, expert_map, shared_out,
                   residual, out_dtype) -> MoeProblem:
    """Validate one ``nvfp4_moe`` call from shapes/dtypes only; return its problem. Raises with a named cause."""
    if x.dtype not in X_DTYPES:
        raise TypeError(f"{_W}: x must be bfloat16 or float16, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{_W}: x must be 2-D [M, H], got shape {_shape(x)}")
    m, h = x.shape
    if topk_ids.dtype != torch.int32:
        raise TypeError(f"{_W}: topk_ids must be int32, got {topk_ids.dtype} (cast with .to(torch.int32))")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m:
        raise ValueError(f"{_W}: topk_ids must be [M={m}, top_k], got shape {_shape(topk_ids)}")
    k = topk_ids.shape[1]
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"{_W}: topk_weights must be float32, got {topk_weights.dtype}")
    if _shape(topk_weights) != _shape(topk_ids):
        raise ValueError(f"{_W}: topk_weights has shape {_shape(topk_weights)} but topk_ids has "
                         f"{_shape(topk_ids)} (top-k mismatch)")
    if k < 1:
        raise ValueError(f"{_W}: top_k must be >= 1, got topk_ids shape {_shape(topk_ids)}")
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"{_W}: activation must be one of {MOE_ACTIVATIONS}, got {activation!r}")
    if router_weight_on_input and k != 1:
        raise ValueError(f"{_W}: router_weight_on_input needs top_k == 1 (the weight scales the expert's "
                         f"input), got top_k={k}")
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"{_W}: w13 and w2 must be stacked 3-D [E, rows, K/2], got {_shape(w13)} and {_shape(w2)}")
    e = w13.shape[0]
    if w2.shape[0] != e:
        raise ValueError(f"{_W}: expert count mismatch: w13 has {e} experts, w2 has {w2.shape[0]}")
    if h % NVFP4.block_size:
        raise ValueError(f"{_W}: H must be a multiple of 16, got H={h}")
    i = w2.shape[2] * 2
    if i % NVFP4.block_size or i == 0:
        raise ValueError(f"{_W}: the intermediate size I={i} (from w2 {_shape(w2)}) must be a positive multiple of 16")
    gated = activation == "silu_mul"
    r13 = 2 * i if gated else i
    if w13.shape[1] != r13:
        raise ValueError(f"{_W}: w13 has {w13.shape[1]} rows per expert, expected {r13} "
                         f"({'2*I [gate; up]' if gated else 'I'} with I={i} from w2, activation {activation!r})")
    if (w13_input_scale is None) != (w2_input_scale is None):
        raise ValueError(f"{_W}: give both input scales (W4A4) or neither (W4A16)")
    _check_stack(w13, w13_scale, w13_scale_2, w13_input_scale, "w13", e, r13, h, True)
    _check_stack(w2, w2_scale, w2_scale_2, w2_input_scale, "w2", e, h, i, False)
    eg = e
    if expert_map is not None:
        if expert_map.dtype != torch.int32 or expert_map.dim() != 1:
            raise TypeError(f"{_W}: expert_map must be 1-D int32 [E_global], got {expert_map.dtype} {_shape(expert_map)}")
        eg = expert_map.shape[0]
    for name, t in (("shared_out", shared_out), ("residual", residual)):
        if t is not None:
            if _shape(t) != (m, h):
                raise ValueError(f"{_W}: {name} must have shape {(m, h)}, got {_shape(t)}")
            if t.dtype not in OUT_DTYPES:
                raise TypeError(f"{_W}: {name} must be bf16, fp16 or fp32, got {t.dtype}")
    if out_dtype is not None and out_dtype not in OUT_DTYPES:
        raise TypeError(f"{_W}: out_dtype must be one of {OUT_DTYPES} or None, got {out_dtype}")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights), ("w13", w13), ("w13_scale", w13_scale),
                    ("w13_scale_2", w13_scale_2), ("w13_input_scale", w13_input_scale), ("w2", w2),
                    ("w2_scale", w2_scale), ("w2_scale_2", w2_scale_2), ("w2_input_scale", w2_input_scale),
                    ("expert_map", expert_map), ("shared_out", shared_out), ("residual", residual)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{_W}: {name} is on {t.device} but x is on {x.device}")
    cap = torch.cuda.get_device_capability(x.device) if x.device.type == "cuda" else None
    return MoeProblem(
        m=m, top_k=k, num_experts=e, num_global_experts=eg, hidden=h, intermediate=i, activation=activation,
        weight_only=w13_input_scale is None, alpha13="row" if w13_scale_2.dim() == 2 else "expert",
        x_dtype=x.dtype, out_dtype=out_dtype or x.dtype, device_type=x.device.type, capability=cap,
        router_weight_on_input=bool(router_weight_on_input), expert_map=expert_map is not None,
        shared_out=shared_out is not None, residual=residual is not None,
    )


def check_moe_ids(topk_ids: torch.Tensor, p: MoeProblem, expert_map: Optional[torch.Tensor]) -> None:
    """Value checks (ids in range, map entries valid). Needs the values: a host sync on CUDA, so it
    is skipped while a CUDA graph is captured (warm-up runs it first)."""
    if topk_ids.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return
    if topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < -1 or hi >= p.num_global_experts:
            what = f"expert_map has {p.num_global_experts} entries" if expert_map is not None else \
                f"the weights hold {p.num_experts} experts"
            raise ValueError(f"{_W}: topk_ids out of range: values in [{lo}, {hi}] but {what} "
                             "(valid ids are 0..E-1, or -1 for an empty slot)")
    if expert_map is not None and expert_map.numel():
        lo, hi = int(expert_map.min()), int(expert_map.max())
        if lo < -1 or hi >= p.num_experts:
            raise ValueError(f"{_W}: expert_map values in [{lo}, {hi}] but the weights hold {p.num_experts} "
                             "local experts (valid: 0..E-1, or -1 for experts not on this rank)")


def relu2_ref(y: torch.Tensor) -> torch.Tensor:
    return torch.relu(y).square()


def moe_activation_ref(y: torch.Tensor, activation: str) -> torch.Tensor:
    """fp32 activation of the MoE GEMM1 output (``relu2`` is MoE-only: NemotronH experts)."""
    return relu2_ref(y) if activation == "relu2" else apply_activation_ref(y, activation)


def local_ids(topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor]) -> torch.Tensor:
    """topk_ids mapped to local expert indices (int64); -1 where a slot contributes nothing."""
    ids = topk_ids.long()
    if expert_map is None:
        return ids
    mapped = expert_map.long()[ids.clamp_min(0)]
    return torch.where(ids < 0, torch.full_like(ids, -1), mapped)


def moe_compose(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                w2_scale_2, w2_input_scale, activation, router_weight_on_input, expert_map, shared_out, residual,
                out_dtype, linear=nvfp4_linear_emulated) -> torch.Tensor:
    """The numerics contract built from a dense NVFP4 linear (``linear``, nvfp4_linear's signature),
    one expert at a time over the pairs routed to it (host-side grouping: not CUDA-graph safe)."""
    p = check_moe_args(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                       w2_scale_2, w2_input_scale, activation, router_weight_on_input, expert_map, shared_out,
                       residual, out_dtype)
    check_moe_ids(topk_ids, p, expert_map)
    m, h, k = p.m, p.hidden, p.top_k
    lid = local_ids(topk_ids, expert_map)  # [M, K]
    wts = topk_weights
    xin_all = x
    if router_weight_on_input:  # step 1 (top-1): the weight scales the input once, then w := 1
        xin_all = (x.float() * topk_weights[:, :1]).to(x.dtype)
        wts = torch.ones_like(topk_weights)
    y = torch.zeros(m, k, h, dtype=torch.float32, device=x.device)
    flat = lid.reshape(-1)
    for e in torch.unique(flat[flat >= 0]).tolist():
        pairs = (flat == e).nonzero().squeeze(1)
        tok = pairs // k
        xin = xin_all[tok]
        ins13 = None if w13_input_scale is None else w13_input_scale[e]
        ins2 = None if w2_input_scale is None else w2_input_scale[e]
        if activation == "relu2":  # not a dense-epilogue activation: acc*alpha in fp32, then relu2, one rounding
            acc = linear(xin, w13[e], w13_scale[e], w13_scale_2[e], ins13, None, None, "none", torch.float32)
            hid = moe_activation_ref(acc, activation).to(x.dtype)
        else:
            hid = linear(xin, w13[e], w13_scale[e], w13_scale_2[e], ins13, None, None, activation, None)
        y.view(m * k, h)[pairs] = linear(hid, w2[e], w2_scale[e], w2_scale_2[e], ins2, None, None, "none",
                                         torch.float32)
    valid = lid >= 0
    out = torch.zeros(m, h, dtype=torch.float32, device=x.device)
    for s in range(k):  # step 5: fp32, slot order, empty slots skipped
        term = wts[:, s : s + 1] * y[:, s]
        out = torch.where(valid[:, s : s + 1], out + term, out)
    if shared_out is not None:
        out = out + shared_out.float()
    if residual is not None:
        out = out + residual.float()
    return out.to(p.out_dtype)


def nvfp4_moe_emulated(*args) -> torch.Tensor:
    """The reference backend: :func:`moe_compose` over nvgemm's emulated dense op (dequantize + fp32 matmul)."""
    return moe_compose(*args, linear=nvfp4_linear_emulated)


register_backend(Backend(name="emulated", priority=-1000, supports=lambda p: None, run=nvfp4_moe_emulated), MOE)


@torch.library.custom_op("nvgemm::nvfp4_moe", mutates_args=())
def nvfp4_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_scale_2: torch.Tensor,
    w13_input_scale: Optional[torch.Tensor],
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_scale_2: torch.Tensor,
    w2_input_scale: Optional[torch.Tensor],
    activation: str = "silu_mul",
    router_weight_on_input: bool = False,
    expert_map: Optional[torch.Tensor] = None,
    shared_out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """Routed NVFP4 experts; see the module docstring for arguments and the numerics contract."""
    args = (x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2,
            w2_input_scale, activation, router_weight_on_input, expert_map, shared_out, residual, out_dtype)
    p = check_moe_args(*args)
    check_moe_ids(topk_ids, p, expert_map)
    return select_moe_backend(p).run(*args)


@nvfp4_moe.register_fake
def _(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale, w2_scale_2,
      w2_input_scale, activation="silu_mul", router_weight_on_input=False, expert_map=None, shared_out=None,
      residual=None, out_dtype=None):
    p = check_moe_args(x, topk_ids, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                       w2_scale_2, w2_input_scale, activation, router_weight_on_input, expert_map, shared_out,
                       residual, out_dtype)
    return x.new_empty((p.m, p.hidden), dtype=p.out_dtype)
