"""Post-grad FX rewrites that fold a decoder layer's glue into nvgemm's GEMMs and fused quantizers.

Run by the capture pass (:mod:`nvgemm.integrations.inductor.capture`) after its normalisation (every
``nvfp4_linear`` positional with 2-D ``x``) and after the gated-MLP requant rewrite. Three rewrites, in order:

1. **Gated activation into the gate_up epilogue** (:func:`fold_silu_mul`): ``silu(h[..., :I]) * h[..., I:]``
   with ``h = nvfp4_linear(..., activation="none")`` becomes ``nvfp4_linear(..., activation="silu_mul")``
   where the requant rewrite did not take the MLP (W4A16, Hopper, or a down projection that is not an
   nvgemm linear). Numerics: ``silu(g) * u`` in fp32 from the unrounded GEMM output and one rounding, where
   the graph rounds ``h``, ``silu(g)`` and the product separately (the requant rewrite's documented change).
2. **Residual into the epilogue** (:func:`fold_residual_adds`): ``r + linear(...)`` (either order, through
   row-preserving views) becomes the op's ``residual`` argument for ``nvfp4_linear``,
   ``nvfp4_linear_prequant`` and ``nvfp4_linear_sm90_prepared`` when the linear has no residual yet, its
   output is read only by the add, and the add keeps the output dtype and shape (no broadcast). Numerics: the
   epilogue adds the residual in fp32 to the unrounded ``acc * alpha + bias`` and rounds once, where the graph
   rounds the GEMM output and then the sum (at most one output ulp apart, per element).
3. **RMSNorm + NVFP4 quantization as the producer of W4A4 GEMMs** (:func:`fuse_norm_quant`): a Hugging Face
   RMSNorm ``w * (xf * rsqrt(mean(xf**2, -1) + eps)).to(dtype)`` (``xf = x.float()``, ``w`` in x's dtype)
   whose output is read only by W4A4 ``nvfp4_linear`` calls without an activation and by fused gate_up
   ``nvfp4_linear_requant`` calls becomes ``nvgemm::rmsnorm_quantize_nvfp4`` (one Triton kernel: norm and
   quantization) feeding ``nvgemm::nvfp4_linear_prequant`` / ``nvfp4_linear_prequant_requant`` (GEMMs with no
   activation quantizer of their own); when ``x`` is a
   residual add ``a + b`` that rewrite 2 did not take, ``nvgemm::add_rmsnorm_quantize_nvfp4`` also computes
   the add and hands the new residual stream to the add's other readers. One fused quantizer per distinct
   ``input_scale`` among the consumers. The norm's ``eps`` must be a constant in the graph: under
   ``torch.compile(dynamic=True)`` torch lifts a module's float attribute (``variance_epsilon``) to a graph input,
   and the norm then stays Inductor's kernel (the GEMMs quantize their own input). Numerics: the fused quantizer computes the value the graph
   materialises (:mod:`nvgemm.templates.triton.reference`: the add rounded to the dtype, the normalised value
   rounded before the weight multiply, the product rounded), so the codes are the graph's codes; a GPU kernel
   may differ only in the fp32 order of ``sum(x**2)`` and the last ulp of ``rsqrt``.

Counters (``torch._dynamo.utils.counters["nvgemm_cutedsl"]``): ``silu_mul_folded``, ``residual_folded``,
``norm_quant_fused`` (one per fused quantizer), ``norm_quant_consumers`` (GEMMs fed by one).
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

from nvgemm.integrations.inductor.compat import nvgemm_counters
from nvgemm.integrations.inductor.fx_nodes import is_call as _is, node_val as _val
from nvgemm.integrations.inductor.requant import _match_gated, _through_row_views
from nvgemm.templates.triton import fused_ops as _fused_ops  # noqa: F401  (registers the fused quantizer ops)

log = logging.getLogger("nvgemm_cutedsl")
aten = torch.ops.aten
prims = torch.ops.prims

_X_DTYPES = (torch.bfloat16, torch.float16)
_ROW_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)

SetVal = Callable[..., None]


def _lin():
    return torch.ops.nvgemm.nvfp4_linear.default


def _prequant():
    return torch.ops.nvgemm.nvfp4_linear_prequant.default


def _sm90_prepared():
    return torch.ops.nvgemm.nvfp4_linear_sm90_prepared.default


def _row_view_of(n: Any) -> bool:
    if not _is(n, *_ROW_VIEWS):
        return False
    vs, vn = _val(n.args[0]), _val(n)
    return isinstance(vs, torch.Tensor) and isinstance(vn, torch.Tensor) and vs.shape[-1] == vn.shape[-1]


def _shape_args(graph: fx.Graph, like: fx.Node) -> list:
    """The sizes of ``like`` as FX args (ints, or ``sym_size`` nodes of ``like`` for symbolic sizes: ``like``
    must be defined before the insertion point)."""
    v = _val(like)
    out = []
    for d, s in enumerate(v.shape):
        if isinstance(s, int):
            out.append(s)
        else:
            node = graph.call_function(aten.sym_size.int, (like, d))
            node.meta["val"] = s
            out.append(node)
    return out


# --------------------------------------------------------------------------- 1. silu_mul epilogue


def fold_silu_mul(graph: fx.Graph, set_val: SetVal) -> int:
    """Rewrite 1 of the module docstring; returns how many gated activations were folded."""
    done = 0
    for mul in list(graph.nodes):
        if not _is(mul, aten.mul.Tensor):
            continue
        gate_up, why = _match_gated(mul)
        if gate_up is None or gate_up.args[7] != "none":
            continue
        vg, vm, vu = _val(gate_up), _val(mul), _val(mul.args[1])
        if not (isinstance(vu, torch.Tensor) and isinstance(vm, torch.Tensor) and vu.shape == vm.shape):
            continue
        if not (isinstance(vg, torch.Tensor) and isinstance(vm, torch.Tensor)) or vg.dtype not in _X_DTYPES \
                or vm.dtype != vg.dtype or gate_up.args[6] is not None:
            continue  # the epilogue rounds once to gate_up's dtype; a residual would be added before silu_mul
        args = list(gate_up.args)
        args[7] = "silu_mul"
        x = args[0]
        with graph.inserting_before(mul):
            new = graph.call_function(_lin(), tuple(args))
            set_val(graph, new, _lin(), *args)
            back = new
            if tuple(_val(new).shape) != tuple(vm.shape):
                # sizes from an operand of the product (same shape, defined before it)
                back = graph.call_function(aten.view.default, (new, _shape_args(graph, mul.args[1])))
                back.meta["val"] = vm
        del x
        mul.replace_all_uses_with(back)
        graph.erase_node(mul)
        done += 1
        nvgemm_counters()["silu_mul_folded"] += 1
    if done:
        graph.eliminate_dead_code()
    return done


# --------------------------------------------------------------------------- 2. residual epilogue

#: op -> (index of its residual argument, index of its activation argument or None)
def _residual_ops() -> dict:
    return {_lin(): 6, _prequant(): 7, _sm90_prepared(): 6}


def _gemm_of(n: Any) -> Optional[fx.Node]:
    """The nvgemm GEMM node ``n`` is (through row views with one user each), if it takes a residual."""
    seen = n
    while _row_view_of(seen) and len(seen.args[0].users) == 1:
        seen = seen.args[0]
    return seen if _is(seen, *_residual_ops()) else None


def fold_residual_adds(graph: fx.Graph, set_val: SetVal) -> int:
    """Rewrite 2 of the module docstring; returns how many adds were folded."""
    ops = _residual_ops()
    done = 0
    for add in list(graph.nodes):
        if not _is(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs:
            continue
        va = _val(add)
        if not isinstance(va, torch.Tensor) or va.dtype not in _X_DTYPES:
            continue
        for side, other in ((add.args[1], add.args[0]), (add.args[0], add.args[1])):
            if not isinstance(side, fx.Node) or not isinstance(other, fx.Node) or len(side.users) != 1:
                continue
            gemm = _gemm_of(side)
            if gemm is None or len(gemm.users) != 1:
                continue
            ri = ops[gemm.target]
            vg, vo, vs = _val(gemm), _val(other), _val(side)
            if gemm.args[ri] is not None or not all(isinstance(v, torch.Tensor) for v in (vg, vo, vs)):
                continue
            if vg.dtype != va.dtype or vo.dtype != va.dtype or tuple(vo.shape) != tuple(va.shape) \
                    or tuple(vs.shape) != tuple(va.shape) or vg.dim() != 2:
                continue
            n_out = vg.shape[-1]
            with graph.inserting_before(add):
                res = graph.call_function(aten.reshape.default, (other, [-1, n_out]))
                set_val(graph, res, lambda t: t.reshape(-1, n_out), other)
                args = list(gemm.args)
                args[ri] = res
                new = graph.call_function(gemm.target, tuple(args))
                set_val(graph, new, gemm.target, *args)
                new.meta.update({k: v for k, v in gemm.meta.items()
                                 if k not in ("val", "tensor_meta", "eager_input_vals")})
                new.meta["val"] = _val(new)
                back = graph.call_function(aten.view.default, (new, _shape_args(graph, other)))  # add's shape
                back.meta["val"] = va
            add.replace_all_uses_with(back)
            graph.erase_node(add)
            done += 1
            nvgemm_counters()["residual_folded"] += 1
            break
    if done:
        graph.eliminate_dead_code()
    return done


# --------------------------------------------------------------------------- 3. norm + quant producer


def _cast_of(n: Any, dtype: torch.dtype) -> Optional[fx.Node]:
    """``s`` when ``n`` casts ``s`` to ``dtype`` (``prims.convert_element_type`` as Inductor decomposes it, or
    ``aten._to_copy`` with only a dtype), else None."""
    if _is(n, prims.convert_element_type.default) and n.args[1] == dtype:
        return n.args[0]
    if _is(n, aten._to_copy.default) and len(n.args) == 1 and n.kwargs.get("dtype") == dtype \
            and set(n.kwargs) <= {"dtype"}:
        return n.args[0]
    return None


def _mean_last(n: Any, src: fx.Node) -> bool:
    """``n`` is ``mean(src, [-1], keepdim=True)``."""
    if not _is(n, aten.mean.dim) or n.args[0] is not src:
        return False
    dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
    keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
    vs = _val(src)
    return keep is True and isinstance(vs, torch.Tensor) and list(dims or ()) in ([-1], [vs.dim() - 1])


def _square_of(n: Any) -> Optional[fx.Node]:
    if _is(n, aten.pow.Tensor_Scalar) and n.args[1] == 2:
        return n.args[0]
    if _is(n, aten.mul.Tensor) and n.args[0] is n.args[1]:
        return n.args[0]
    return None


def match_rmsnorm(y: Any) -> Optional[tuple[fx.Node, fx.Node, fx.Node, float]]:
    """(x, x.float() node, weight, eps) when ``y`` is a Hugging Face RMSNorm of ``x`` (see the module docstring), else None."""
    if not _is(y, aten.mul.Tensor) or len(y.args) != 2:
        return None
    vy = _val(y)
    if not isinstance(vy, torch.Tensor) or vy.dtype not in _X_DTYPES:
        return None
    for w, hc in ((y.args[0], y.args[1]), (y.args[1], y.args[0])):
        vw = _val(w)
        if not (isinstance(vw, torch.Tensor) and vw.dim() == 1 and vw.dtype == vy.dtype):
            continue
        m = _cast_of(hc, vy.dtype)
        if m is None or len(hc.users) != 1:
            continue
        if not _is(m, aten.mul.Tensor) or len(m.users) != 1:
            continue
        for xf, rs in ((m.args[0], m.args[1]), (m.args[1], m.args[0])):
            if not (_is(rs, aten.rsqrt.default) and len(rs.users) == 1):
                continue
            a = rs.args[0]
            if not (_is(a, aten.add.Tensor) and len(a.users) == 1 and isinstance(a.args[1], (int, float))):
                continue
            mean = a.args[0]
            if not (isinstance(mean, fx.Node) and len(mean.users) == 1):
                continue
            sq = mean.args[0] if _is(mean, aten.mean.dim) else None
            if sq is None or _square_of(sq) is not xf or not _mean_last(mean, sq) or len(sq.users) != 1:
                continue
            x = _cast_of(xf, torch.float32)
            if x is None:
                continue
            vx = _val(x)
            if not (isinstance(vx, torch.Tensor) and vx.dtype == vy.dtype and vx.shape[-1] == vw.shape[0]
                    and tuple(vx.shape) == tuple(vy.shape)):
                continue
            if set(xf.users) - {m, sq}:
                continue  # the fp32 copy of x feeds only the norm
            return x, xf, w, float(a.args[1])
    return None


def _requant():
    return torch.ops.nvgemm.nvfp4_linear_requant.default


def _linear_readers(y: fx.Node) -> Optional[list[fx.Node]]:
    """The ``nvfp4_linear`` / ``nvfp4_linear_requant`` nodes reading ``y`` as their ``x`` (through row views), or
    None when anything else reads it."""
    out, todo = [], [y]
    while todo:
        n = todo.pop()
        for u in n.users:
            if _row_view_of(u) and u.args[0] is n:
                todo.append(u)
            elif _is(u, _lin(), _requant()) and u.args[0] is n and all(a is not n for a in u.args[1:]):
                out.append(u)
            else:
                return None
    return out


def _consumer_reason(lin: fx.Node) -> Optional[str]:
    if _is(lin, _requant()):
        return None  # W4A4 by contract; its SwiGLU + requant epilogue is kept
    if lin.args[4] is None:
        return "a W4A16 linear (no activation quantizer to remove)"
    if lin.args[7] != "none":
        return f"a linear with activation {lin.args[7]!r} (the prequant GEMM has no activation epilogue)"
    vo = _val(lin)
    if not isinstance(vo, torch.Tensor) or vo.dtype not in _X_DTYPES:
        return "a linear whose output is not bf16/fp16"
    return None


def fuse_norm_quant(graph: fx.Graph, set_val: SetVal) -> int:
    """Rewrite 3 of the module docstring; returns how many fused quantizers were emitted."""
    # lazy: looked up at call time (tests patch dispatch.fused.fused_chain_reason)
    from nvgemm.dispatch.fused import fused_chain_reason

    rms = torch.ops.nvgemm.rmsnorm_quantize_nvfp4.default
    add_rms = torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4.default
    done = 0
    for y in list(graph.nodes):
        norm = match_rmsnorm(y)
        if norm is None:
            continue
        x, xf, w, eps = norm
        readers = _linear_readers(y)
        if not readers:
            continue
        why = next((r for r in map(_consumer_reason, readers) if r is not None), None)
        why = why or fused_chain_reason(_val(y).device)
        if why is not None:
            log.debug("nvgemm_cutedsl: RMSNorm %s not fused with its quantizer: %s", y, why)
            continue
        groups: dict[fx.Node, list[fx.Node]] = {}
        for lin in readers:
            groups.setdefault(lin.args[4], []).append(lin)
        vx = _val(x)
        k = vx.shape[-1]
        use_add = (len(groups) == 1 and _is(x, aten.add.Tensor) and len(x.args) == 2 and not x.kwargs
                   and all(isinstance(a, fx.Node) and isinstance(_val(a), torch.Tensor)
                           and _val(a).dtype == vx.dtype and tuple(_val(a).shape) == tuple(vx.shape)
                           for a in x.args))
        anchor = x if use_add else y
        for ins, lins in groups.items():
            with graph.inserting_before(anchor.next):
                if use_add:
                    a2 = graph.call_function(aten.reshape.default, (x.args[0], [-1, k]))
                    set_val(graph, a2, lambda t: t.reshape(-1, k), x.args[0])
                    b2 = graph.call_function(aten.reshape.default, (x.args[1], [-1, k]))
                    set_val(graph, b2, lambda t: t.reshape(-1, k), x.args[1])
                    q = graph.call_function(add_rms, (a2, b2, w, ins, eps, True))
                    set_val(graph, q, add_rms, a2, b2, w, ins, eps, True)
                else:
                    x2 = graph.call_function(aten.reshape.default, (x, [-1, k]))
                    set_val(graph, x2, lambda t: t.reshape(-1, k), x)
                    q = graph.call_function(rms, (x2, w, ins, eps, True))
                    set_val(graph, q, rms, x2, w, ins, eps, True)
                parts = []
                for i in range(3 if use_add else 2):
                    g = graph.call_function(operator.getitem, (q, i))
                    if _val(q) is not None:
                        g.meta["val"] = _val(q)[i]
                    parts.append(g)
                if use_add:
                    r = graph.call_function(aten.view.default, (parts[2], _shape_args(graph, x)))
                    r.meta["val"] = vx
            if use_add:  # the add's other readers take the fused op's sum (the norm's own reader dies below)
                x.replace_all_uses_with(r, delete_user_cb=lambda u: u is not xf)
            packed, scales = parts[0], parts[1]
            for lin in lins:
                if _is(lin, _requant()):
                    op = torch.ops.nvgemm.nvfp4_linear_prequant_requant.default
                    rdtype = lin.args[7] if len(lin.args) > 7 and lin.args[7] is not None else _val(lin.args[0]).dtype
                    args = (packed, scales, *lin.args[1:7], rdtype)
                else:
                    op = _prequant()
                    args = (packed, scales, *lin.args[1:7], _val(lin).dtype)
                with graph.inserting_before(lin):
                    pq = graph.call_function(op, args)
                    set_val(graph, pq, op, *args)
                pq.meta.update({k_: v for k_, v in lin.meta.items()
                                if k_ not in ("val", "tensor_meta", "eager_input_vals")})
                pq.meta["val"] = _val(pq)
                lin.replace_all_uses_with(pq)
                graph.erase_node(lin)
                nvgemm_counters()["norm_quant_consumers"] += 1
            done += 1
            nvgemm_counters()["norm_quant_fused"] += 1
    if done:
        graph.eliminate_dead_code()
    return done


__all__ = ["fold_residual_adds", "fold_silu_mul", "fuse_norm_quant", "match_rmsnorm"]
