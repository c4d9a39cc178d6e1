"""Post-grad FX pass: claim NVFP4 linears for nvgemm before PyTorch's own ``_scaled_mm`` fold.

Installed as ``torch._inductor.config.post_grad_custom_pre_pass`` by :func:`nvgemm.enable`; it
runs before Inductor's ``pass_patterns`` (``fx_passes/post_grad.py``), i.e. before the 2.15
``mul(_scaled_mm, alpha) -> _scaled_mm(scale_result=alpha)`` fold, so the nodes it claims never
reach PyTorch's NVGEMM. Three rewrites:

1. **Plain-PyTorch NVFP4 linears** (what torchao-style and hand-written code produce)::

       qx, sx = nvgemm.quantize_nvfp4(x, input_scale)           # activation quantization
       y = aten._scaled_mm(qx.view(fp4), W.view(fp4).t(), sx, weight_scale, out_dtype=bf16)
       y = y * alpha            # Python float, 0-d tensor or shape-(1,) tensor; either order
       y = y + bias             # optional, shape (N,)

   becomes ``nvgemm::nvfp4_linear(x, W, weight_scale, ws2, input_scale, bias)`` -- the activation
   quantization is part of the captured op. ``ws2`` is the other factor when ``alpha`` is
   literally ``input_scale * ws2`` (exact); otherwise ``alpha / input_scale`` (fp32; the op
   multiplies back, which is within 1 fp32 ulp of ``alpha``). Numerics change in one
   documented way: nvgemm's epilogue rounds once (fp32 alpha and bias, one cast), where the
   eager graph rounds the GEMM output to bf16 before the multiply and again after the add.
   ``_scaled_mm`` calls with their own ``bias``/``scale_result``, non-NVFP4 operands, an
   activation not produced by ``nvgemm::quantize_nvfp4`` (swizzled), or non-bf16/fp16 inputs
   are left to PyTorch.

2. **Existing ``nvgemm::nvfp4_linear`` calls** are merged where two calls take the same arguments (the ops are
   pure: one GEMM serves both; :class:`nvgemm.nn.shards.NVFP4LinearShard` relies on it) and normalised: all nine arguments positional
   (the autotuner passes tensors positionally) and ``x`` flattened to 2-D ``[M, K]`` so the
   lowering can dispatch on M (dim 0) for any ``[..., K]`` input.

3. **Gated MLPs** ``down(silu_mul(gate_up(x)))`` of W4A4 linears become the fused requant chain
   (:mod:`nvgemm.integrations.inductor.requant`; ``fuse_requant=False`` keeps them).

4. **The layer's glue** (:mod:`nvgemm.integrations.inductor.layer_fusion`; ``fuse_layer=False`` keeps it): a
   separate ``silu(h[..., :I]) * h[..., I:]`` goes into the gate_up epilogue, ``r + linear(...)`` into the
   linear's ``residual`` argument, and an RMSNorm feeding W4A4 linears becomes one fused norm + NVFP4
   quantizer feeding ``nvfp4_linear_prequant`` (no activation quantizer inside the GEMM op); and RoPE of q / k
   plus the KV-cache writes on a fused qkv GEMM's output become ``nvgemm::rope_kv_write``
   (:mod:`nvgemm.integrations.inductor.rope_kv`).

Counters (``torch._dynamo.utils.counters["nvgemm_cutedsl"]``): ``scaled_mm_claimed``,
``nvfp4_linear_captured``, ``nvfp4_linear_merged``, ``bias_folded``, ``requant_fused``, ``requant_not_fused``, and the layer rewrites'
``silu_mul_folded``, ``residual_folded``, ``norm_quant_fused``, ``norm_quant_consumers``, ``rope_kv_fused``.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Optional

import torch
import torch.fx as fx

from nvgemm.core.formats import NVFP4, blocked_numel, blocked_shape
from nvgemm.integrations.inductor.choices import LINEAR_ARG_NAMES
from nvgemm.integrations.inductor.compat import nvgemm_counters
from nvgemm.integrations.inductor.fx_nodes import is_call as _is_call, node_val as _val
from nvgemm.integrations.inductor.requant import fuse_requant_chains
import nvgemm.ops.fused as fr
import nvgemm.integrations.inductor.choices as ch
import nvgemm.integrations.inductor.fx_nodes as fxn
import nvgemm.integrations.inductor.layer_fusion as lf
import nvgemm.integrations.inductor.lowering as low
import nvgemm.integrations.inductor.requant as rq
import nvgemm.integrations.inductor.rope_kv as rk
import nvgemm.dispatch.fused as fb

log = logging.getLogger("nvgemm_cutedsl")
aten = torch.ops.aten

_FP4 = torch.float4_e2m1fn_x2
_E4M3 = torch.float8_e4m3fn
# ops that only re-label a tensor (make_fx on torch 2.11 inserts detach after view.dtype)
_VIEW_OPS = (aten.view.dtype, aten.alias.default, aten.detach.default)


def _strip_dtype_views(n: Any) -> Any:
    while _is_call(n, *_VIEW_OPS):
        n = n.args[0]
    return n


def _linear_op():
    return torch.ops.nvgemm.nvfp4_linear.default


def _quantize_op():
    return torch.ops.nvgemm.quantize_nvfp4.default


def _fake_mode(graph: fx.Graph):
    for n in graph.nodes:
        v = _val(n)
        if isinstance(v, torch.Tensor) and hasattr(v, "fake_mode"):
            return v.fake_mode
    return None


def _set_val(graph: fx.Graph, node: fx.Node, fn, *args) -> None:
    """Fill ``node.meta['val']`` by running ``fn`` on the fake values of ``args``."""
    fake_mode = _fake_mode(graph)
    if fake_mode is None:
        return
    vals = [(_val(a) if isinstance(a, fx.Node) else a) for a in args]
    with fake_mode:
        node.meta["val"] = fn(*vals)


# --------------------------------------------------------------------------- scaled_mm pattern


def _scaled_mm_args(mm: fx.Node) -> Optional[dict]:
    names = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
    d = dict(zip(names, mm.args))
    d.update(mm.kwargs)
    return d


def _match_quantized_activation(a: fx.Node, scale_a: fx.Node):
    """(x, input_scale) when ``a``/``scale_a`` are the two outputs of one swizzled nvgemm quantize."""
    a0, s0 = _strip_dtype_views(a), _strip_dtype_views(scale_a)
    if not (_is_call(a0, operator.getitem) and _is_call(s0, operator.getitem)):
        return None
    if a0.args[0] is not s0.args[0] or a0.args[1] != 0 or s0.args[1] != 1:
        return None
    q = a0.args[0]
    if not _is_call(q, _quantize_op()):
        return None
    qargs = dict(zip(("x", "input_scale", "swizzle"), q.args))
    qargs.update(q.kwargs)
    if not qargs.get("swizzle", True):
        return None
    return qargs["x"], qargs["input_scale"]


def _match_weight(b: fx.Node):
    """The packed [N, K/2] weight node under ``W.view(fp4).t()`` (permute/t in post-grad graphs)."""
    if _is_call(b, aten.t.default):
        w = b.args[0]
    elif _is_call(b, aten.permute.default) and list(b.args[1]) == [1, 0]:
        w = b.args[0]
    elif _is_call(b, aten.transpose.int) and sorted(int(d) % 2 for d in b.args[1:3]) == [0, 1]:
        w = b.args[0]
    else:
        return None
    return _strip_dtype_views(w)


def _alpha_other(mul: fx.Node, mm: fx.Node):
    if len(mul.args) != 2 or mul.kwargs:
        return None
    a, b = mul.args
    if a is mm and b is not mm:
        return b
    if b is mm and a is not mm:
        return a
    return None


def _alpha_ok(alpha: Any) -> bool:
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
        return True
    v = _val(alpha)
    return isinstance(v, torch.Tensor) and v.dtype == torch.float32 and tuple(v.shape) in ((), (1,))


def _try_claim_scaled_mm(graph: fx.Graph, mm: fx.Node) -> bool:
    d = _scaled_mm_args(mm)
    if d.get("bias") is not None or d.get("scale_result") is not None:
        return False
    a, b, sa, sb = d.get("self"), d.get("mat2"), d.get("scale_a"), d.get("scale_b")
    va, vb, vsa, vsb, vmm = _val(a), _val(b), _val(sa), _val(sb), _val(mm)
    if not all(isinstance(v, torch.Tensor) for v in (va, vb, vsa, vsb, vmm)):
        return False
    if va.dtype != _FP4 or vb.dtype != _FP4 or vsa.dtype != _E4M3 or vsb.dtype != _E4M3:
        return False
    if vmm.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    act = _match_quantized_activation(a, sa)
    w = _match_weight(b)
    if act is None or w is None:
        return False
    x, input_scale = act
    vx, vw, vin = _val(x), _val(w), _val(input_scale)
    if not (isinstance(vx, torch.Tensor) and isinstance(vw, torch.Tensor) and isinstance(vin, torch.Tensor)):
        return False
    if vx.dtype not in (torch.bfloat16, torch.float16) or vw.dim() != 2 or vw.dtype not in (torch.uint8, _FP4):
        return False
    n, k = vw.shape[0], vw.shape[1] * 2
    if not isinstance(n, int) or not isinstance(k, int) or vsb.dim() != 1 or vsb.numel() != blocked_numel(n, k // NVFP4.block_size):
        return False
    if len(mm.users) != 1:
        return False
    mul = next(iter(mm.users))
    if not _is_call(mul, aten.mul.Tensor, aten.mul.Scalar):
        return False
    alpha = _alpha_other(mul, mm)
    if alpha is None or not _alpha_ok(alpha):
        return False
    out_val = _val(mul)
    if not isinstance(out_val, torch.Tensor) or out_val.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    last, bias = mul, None
    if len(mul.users) == 1:
        add = next(iter(mul.users))
        if _is_call(add, aten.add.Tensor) and len(add.args) == 2 and not add.kwargs:
            other = add.args[1] if add.args[0] is mul else add.args[0]
            vbias = _val(other)
            vadd = _val(add)
            if (isinstance(vbias, torch.Tensor) and tuple(vbias.shape) == (n,) and isinstance(vadd, torch.Tensor)
                    and vadd.dtype == out_val.dtype and vbias.dtype in (torch.bfloat16, torch.float16, torch.float32)):
                last, bias = add, other
    out_dtype = _val(last).dtype

    with graph.inserting_before(last):
        # input_scale as a 0-d fp32 tensor (nvfp4_linear accepts () or numel 1 for it).
        ins = input_scale
        ws2 = None
        if _is_call(alpha, aten.mul.Tensor) and len(alpha.args) == 2:
            p, q = alpha.args
            other = q if p is input_scale else p if q is input_scale else None
            vo = _val(other)
            if isinstance(vo, torch.Tensor) and vo.dtype == torch.float32 and vo.numel() == 1:
                ws2 = other
        if ws2 is None:
            if isinstance(alpha, fx.Node):
                alpha_t = alpha
            else:
                alpha_t = graph.call_function(
                    aten.full.default, ([], float(alpha)), {"dtype": torch.float32, "device": vin.device}
                )
                _set_val(graph, alpha_t, lambda *a, **k: torch.full([], float(alpha), dtype=torch.float32,
                                                                     device=vin.device))
            ws2 = graph.call_function(aten.div.Tensor, (alpha_t, ins))
            _set_val(graph, ws2, torch.div, alpha_t, ins)
        if tuple(_val(ws2).shape) != ():
            ws2_0 = graph.call_function(aten.view.default, (ws2, []))
            _set_val(graph, ws2_0, lambda t: t.view([]), ws2)
            ws2 = ws2_0
        weight = w
        if vw.dtype == _FP4:
            weight = graph.call_function(aten.view.dtype, (w, torch.uint8))
            _set_val(graph, weight, lambda t: t.view(torch.uint8), w)
        # torch._scaled_mm reads 1-D NVFP4 scales as 128x4-swizzled bytes; nvgemm's op takes them
        # in their tiled shape (a view)
        tiled = list(blocked_shape(n, k // NVFP4.block_size))
        sb_t = graph.call_function(aten.view.default, (sb, tiled))
        _set_val(graph, sb_t, lambda t: t.view(tiled), sb)
        args = (x, weight, sb_t, ws2, ins, bias, None, "none", out_dtype)
        new = graph.call_function(_linear_op(), args)
        _set_val(graph, new, _linear_op(), *args)
    new.meta["nvgemm_cutedsl"] = "scaled_mm"
    last.replace_all_uses_with(new)
    for dead in ((last, mul, mm) if last is not mul else (mul, mm)):
        if not dead.users:
            graph.erase_node(dead)
    nvgemm_counters()["scaled_mm_claimed"] += 1
    if bias is not None:
        nvgemm_counters()["bias_folded"] += 1
    log.debug("nvgemm_cutedsl: claimed %s (N=%d, K=%d, bias=%s) as nvgemm::nvfp4_linear", mm, n, k, bias is not None)
    return True


# --------------------------------------------------------------------------- normalisation


def _sizes_as_args(graph: fx.Graph, x: fx.Node, dims) -> list:
    """Sizes of ``x`` along ``dims`` as FX args: ints when static, ``sym_size`` nodes when not."""
    vx = _val(x)
    out = []
    for d in dims:
        s = vx.shape[d]
        if isinstance(s, int):
            out.append(s)
        else:
            node = graph.call_function(aten.sym_size.int, (x, d))
            node.meta["val"] = s
            out.append(node)
    return out


def _normalise_linear(graph: fx.Graph, node: fx.Node) -> bool:
    """Make a ``nvfp4_linear`` call fully positional with 2-D ``x``. Returns True if changed."""
    schema = _linear_op()._schema
    bound = {}
    for i, a in enumerate(node.args):
        bound[schema.arguments[i].name] = a
    bound.update(node.kwargs)
    for arg in schema.arguments:
        if arg.name not in bound:
            bound[arg.name] = arg.default_value
    args = [bound[n] for n in LINEAR_ARG_NAMES]
    x = args[0]
    vx, vout = _val(x), _val(node)
    changed = tuple(node.args) != tuple(args) or bool(node.kwargs)
    if isinstance(vx, torch.Tensor) and vx.dim() != 2 and isinstance(vout, torch.Tensor):
        with graph.inserting_before(node):
            k = vx.shape[-1]
            x2 = graph.call_function(aten.reshape.default, (x, [-1, k]))
            _set_val(graph, x2, lambda t: t.reshape(-1, k), x)
            args[0] = x2
            new = graph.call_function(_linear_op(), tuple(args))
            _set_val(graph, new, _linear_op(), *args)
            new.meta.update({k_: v for k_, v in node.meta.items() if k_ not in ("val", "tensor_meta", "eager_input_vals")})
            new.meta["val"] = _val(new)
            shape = _sizes_as_args(graph, x, range(vx.dim() - 1)) + [vout.shape[-1]]
            back = graph.call_function(aten.view.default, (new, shape))
            back.meta["val"] = vout
        node.replace_all_uses_with(back)
        graph.erase_node(node)
        return True
    if changed:
        node.args, node.kwargs = tuple(args), {}
        # Inductor re-normalises against the eager (pre-rewrite) call; our form is authoritative.
        node.meta.pop("eager_input_vals", None)
    return changed


# --------------------------------------------------------------------------- identical calls


def _hashable(a: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return tuple(_hashable(x) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in a.items()))
    return a


def merge_identical_linears(graph: fx.Graph) -> int:
    """Replace every ``nvfp4_linear`` / ``nvfp4_linear_sm90_prepared`` call whose arguments equal an earlier
    call's by that call (the ops have no side effects); returns how many were merged."""
    targets = (_linear_op(), torch.ops.nvgemm.nvfp4_linear_sm90_prepared.default)
    seen: dict = {}
    merged = 0
    for node in list(graph.nodes):
        if not _is_call(node, *targets):
            continue
        key = (node.target, _hashable(node.args), _hashable(node.kwargs))
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            merged += 1
    if merged:
        nvgemm_counters()["nvfp4_linear_merged"] += merged
    return merged


# --------------------------------------------------------------------------- the pass


def capture_nvfp4_linears(graph: fx.Graph, claim_scaled_mm: bool = True, fuse_requant: bool = True,
                          fuse_layer: bool = True) -> None:
    """Run both rewrites on ``graph`` in place (the first only when ``claim_scaled_mm``), then (when
    ``fuse_requant``) the gated-MLP rewrite of :mod:`nvgemm.integrations.inductor.requant`, then (when
    ``fuse_layer``) the layer rewrites of :mod:`nvgemm.integrations.inductor.layer_fusion`."""
    claimed = False
    for node in list(graph.nodes):
        if claim_scaled_mm and _is_call(node, aten._scaled_mm.default):
            try:
                claimed |= _try_claim_scaled_mm(graph, node)
            except Exception as e:  # a pattern we cannot claim must never break compilation
                log.warning("nvgemm_cutedsl: left %s to PyTorch: %s", node, e)
    if claimed:  # the quantize -> view chains that fed _scaled_mm are now dead
        graph.eliminate_dead_code()
    merge_identical_linears(graph)
    for node in list(graph.nodes):
        if _is_call(node, _linear_op()):
            _normalise_linear(graph, node)
            nvgemm_counters()["nvfp4_linear_captured"] += 1
    if fuse_requant:
        fuse_requant_chains(graph, _set_val)
    if fuse_layer:
        lf.fold_silu_mul(graph, _set_val)
        lf.fold_residual_adds(graph, _set_val)
        lf.fuse_norm_quant(graph, _set_val)
        rk.fuse_rope_kv_write(graph, _set_val)
    graph.lint()


def post_grad_pass(graph: fx.Graph) -> None:
    """The rewrite as a standalone Inductor post-grad pass, for compilers that own Inductor's config and take
    passes by name (vLLM: ``-cc '{"inductor_passes": {"post_grad_custom_pre_pass":
    "nvgemm.fused_requant_pass"}}'``): normalises the ``nvfp4_linear`` calls (the capture pass without the
    ``_scaled_mm`` claim), then fuses; logs how many gated MLPs were rewritten."""
    before = nvgemm_counters()["requant_fused"]
    capture_nvfp4_linears(graph, claim_scaled_mm=False, fuse_requant=True)
    fused = nvgemm_counters()["requant_fused"] - before
    log.info("nvgemm_cutedsl: fused requant pass: %d gated MLP%s rewritten to nvfp4_linear_requant -> "
             "nvfp4_linear_prequant in this graph", fused, "" if fused == 1 else "s")


def make_pass(claim_scaled_mm: bool = True, fuse_requant: bool = True, fuse_layer: bool = True):
    """The ``CustomGraphPass`` object Inductor calls (its ``uuid`` enters the FX-graph cache key)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    class NvgemmCapturePass(CustomGraphPass):
        def __call__(self, graph: fx.Graph) -> None:
            capture_nvfp4_linears(graph, claim_scaled_mm=claim_scaled_mm, fuse_requant=fuse_requant,
                                  fuse_layer=fuse_layer)

        def uuid(self) -> Any:
            salt = (f"nvgemm_cutedsl-capture-v4-claim{int(claim_scaled_mm)}-requant{int(fuse_requant)}"
                    f"-layer{int(fuse_layer)}")
            return get_hash_for_files((__file__, ch.__file__, fxn.__file__, low.__file__, rq.__file__, fr.__file__,
                                       fb.__file__, lf.__file__, rk.__file__), salt)

    return NvgemmCapturePass()
