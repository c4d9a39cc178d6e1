"""Post-grad FX rewrite: ``down(silu_mul(gate_up(x)))`` of ``nvgemm::nvfp4_linear`` ops -> the fused chain
``nvgemm::nvfp4_linear_requant`` (gate_up GEMM emitting down's NVFP4 input) -> ``nvgemm::nvfp4_linear_prequant``.

Runs inside the capture pass (:mod:`nvgemm.integrations.inductor.capture`, after its normalisation: every
``nvfp4_linear`` positional with 2-D ``x``). Two spellings of the gated activation are matched:

A. ``gate_up`` with ``activation="silu_mul"`` in its epilogue: exact, the requant op's contract is
   ``quantize_nvfp4(nvfp4_linear(..., "silu_mul"))`` and down quantizes its input the same way;
B. ``gate_up`` with no activation, then ``silu(h[..., :I]) * h[..., I:]`` (what vLLM's ``SiluAndMul``
   native forward and hand-written MLPs produce; ``silu`` as ``aten.silu`` or Inductor's decomposition
   ``x.float() / (1 + exp(-x.float()))`` cast back). Numerics change in one documented way, as the capture
   pass's ``_scaled_mm`` claim: the fused epilogue computes ``silu(g) * u`` in fp32 from the unrounded GEMM
   output and rounds once, where the graph rounds gate/up, silu and the product separately.

Rewritten only when valid: both linears W4A4 (an ``input_scale`` node), no residual on gate_up, down without
an activation, gate_up's output bf16/fp16 and the same dtype down reads, down's output bf16/fp16,
I % 16 == 0, every intermediate node used only inside the chain (a second user of h keeps the graph as it
is), and a device where the fused chain is worth running (CPU, sm_100 GPUs:
:func:`nvgemm.dispatch.fused.fused_chain_reason`). Row-preserving views between the nodes (the
normalisation's ``view``/``reshape`` back to 3-D and to 2-D) are looked through.

Counters (``torch._dynamo.utils.counters["nvgemm_cutedsl"]``): ``requant_fused`` and
``requant_not_fused`` (the reason is logged at debug level).
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Optional

import torch
import torch.fx as fx

from nvgemm.integrations.inductor.compat import nvgemm_counters
from nvgemm.integrations.inductor.fx_nodes import is_call as _is, node_val as _val

log = logging.getLogger("nvgemm_cutedsl")
aten = torch.ops.aten
prims = torch.ops.prims

_X_DTYPES = (torch.bfloat16, torch.float16)
_ROW_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _through_row_views(n: Any) -> Any:
    """Look through views that keep the last dimension (row-preserving reshapes) and have one user."""
    while _is(n, *_ROW_VIEWS):
        src = n.args[0]
        vs, vn = _val(src), _val(n)
        if not (isinstance(vs, torch.Tensor) and isinstance(vn, torch.Tensor) and vs.shape[-1] == vn.shape[-1]):
            return n
        if len(src.users) != 1:
            return n
        n = src
    return n


def _silu_input(n: Any) -> Optional[fx.Node]:
    """``s`` if ``n`` computes ``silu(s)`` (aten.silu, or the decomposition
    ``convert(c / (1 + exp(-c)), dtype)`` with ``c = convert(s, float32)``), else None."""
    if _is(n, aten.silu.default):
        return n.args[0]
    if not (_is(n, prims.convert_element_type.default) and len(n.args[0].users) == 1):
        return None
    div = n.args[0]
    if not _is(div, aten.div.Tensor):
        return None
    c, add = div.args
    if not (_is(c, prims.convert_element_type.default) and c.args[1] == torch.float32 and _is(add, aten.add.Tensor)):
        return None
    e, one = add.args if _is(add.args[0], aten.exp.default) else (add.args[1], add.args[0])
    if one != 1 or not _is(e, aten.exp.default) or not _is(e.args[0], aten.neg.default) or e.args[0].args[0] is not c:
        return None
    if len(c.users) != 2 or any(len(x.users) != 1 for x in (add, e, e.args[0])):
        return None  # the float copy feeds exactly neg and div; nothing else reads the intermediates
    return c.args[0]


def _slice_of(n: Any, h: fx.Node) -> Optional[tuple[int, int]]:
    """(start, end) if ``n`` slices the last dimension of ``h`` (step 1), else None."""
    if not _is(n, aten.slice.Tensor) or n.args[0] is not h:
        return None
    dim = n.args[1] if len(n.args) > 1 else 0
    start = n.args[2] if len(n.args) > 2 else 0
    end = n.args[3] if len(n.args) > 3 else None
    step = n.args[4] if len(n.args) > 4 else 1
    vh = _val(h)
    if not isinstance(vh, torch.Tensor) or step != 1 or dim not in (-1, vh.dim() - 1):
        return None
    if not isinstance(start, int) or not (end is None or isinstance(end, int)):
        return None
    size = vh.shape[-1]
    return start, size if end is None else min(end, size)


def _match_gated(src: Any) -> tuple[Optional[fx.Node], str]:
    """(gate_up nvfp4_linear node, "") if ``src`` (down's input, views stripped) is its gated output, else
    (None, reason)."""
    lin = torch.ops.nvgemm.nvfp4_linear.default
    if _is(src, lin):
        if src.args[7] != "silu_mul":
            return None, f"down's input is an nvfp4_linear with activation {src.args[7]!r}, not silu_mul"
        return src, ""
    if not _is(src, aten.mul.Tensor):
        return None, "down's input is not produced by a gated nvfp4_linear"
    a, b = src.args
    for silu_out, other in ((a, b), (b, a)):
        s = _silu_input(silu_out)
        if s is None or len(silu_out.users) != 1:
            continue
        h = s.args[0] if _is(s, aten.slice.Tensor) else None
        if h is None:
            continue
        first, second = _slice_of(s, h), _slice_of(other, h)
        vh = _val(h)
        if first is None or second is None or not isinstance(vh, torch.Tensor):
            continue
        i = vh.shape[-1] // 2
        if first != (0, i) or second != (i, 2 * i) or vh.shape[-1] != 2 * i:
            return None, f"silu * mul halves {first} / {second} are not [gate | up] of width {vh.shape[-1]}"
        if set(h.users) != {s, other} or len(s.users) != 1 or len(other.users) != 1:
            return None, "the gate_up output has another user"
        g = _through_row_views(h)
        if not _is(g, lin) or g.args[7] != "none":
            return None, "silu * mul does not read an nvfp4_linear without activation"
        return g, ""
    return None, "down's input is a product that is not silu(h[..., :I]) * h[..., I:]"


def _check(gate_up: fx.Node, down: fx.Node, down_x: fx.Node) -> Optional[str]:
    # lazy: looked up at call time (tests patch dispatch.fused.fused_chain_reason)
    from nvgemm.dispatch.fused import fused_chain_reason

    ga, da = gate_up.args, down.args
    if ga[4] is None or da[4] is None:
        return "both linears must be W4A4 (an input_scale)"
    if ga[6] is not None:
        return "gate_up has a residual"
    if da[7] != "none":
        return f"down has activation {da[7]!r}"
    vg, vd, vx = _val(gate_up), _val(down), _val(down_x)
    if not all(isinstance(v, torch.Tensor) for v in (vg, vd, vx)):
        return "no fake values on the nodes"
    if vg.dtype not in _X_DTYPES or vx.dtype != vg.dtype:
        return f"gate_up output {vg.dtype} / down input {vx.dtype}: the requant rounds to one bf16/fp16 dtype"
    if vd.dtype not in _X_DTYPES:
        return f"down's output dtype {vd.dtype} is not bf16/fp16"
    i = vx.shape[-1]
    if not isinstance(i, int) or i % 16:
        return f"I = {i} is not a multiple of 16"
    if gate_up.args[0] is not None and _val(gate_up.args[0]) is not None and _val(gate_up.args[0]).dim() != 2:
        return "gate_up's x is not 2-D"
    return fused_chain_reason(vg.device)


def fuse_requant_chains(graph: fx.Graph, set_val) -> int:
    """Rewrite every valid ``down(silu_mul(gate_up(x)))`` in ``graph``; returns how many. ``set_val(graph,
    node, fn, *args)`` fills a new node's fake value (the capture pass's helper)."""
    lin = torch.ops.nvgemm.nvfp4_linear.default
    requant = torch.ops.nvgemm.nvfp4_linear_requant.default
    prequant = torch.ops.nvgemm.nvfp4_linear_prequant.default
    done = 0
    for down in list(graph.nodes):
        if not _is(down, lin):
            continue
        down_x = down.args[0]
        if not isinstance(down_x, fx.Node) or len(down_x.users) != 1:
            continue
        src = _through_row_views(down_x)
        gate_up, why = _match_gated(src)
        if gate_up is not None and src is gate_up and len(gate_up.users) != 1:
            why, gate_up = "the gate_up output has another user", None
        if gate_up is None:
            if why and why != "down's input is not produced by a gated nvfp4_linear":
                nvgemm_counters()["requant_not_fused"] += 1
                log.debug("nvgemm_cutedsl: %s not fused with its input: %s", down, why)
            continue
        why = _check(gate_up, down, down_x)
        if why is not None:
            nvgemm_counters()["requant_not_fused"] += 1
            log.debug("nvgemm_cutedsl: %s -> %s not fused: %s", gate_up, down, why)
            continue
        x, w, ws, ws2, ins, bias = gate_up.args[:6]
        rdtype = _val(gate_up).dtype
        with graph.inserting_before(down):
            rq = graph.call_function(requant, (x, w, ws, ws2, ins, bias, down.args[4], rdtype))
            set_val(graph, rq, requant, x, w, ws, ws2, ins, bias, down.args[4], rdtype)
            packed = graph.call_function(operator.getitem, (rq, 0))
            scales = graph.call_function(operator.getitem, (rq, 1))
            if _val(rq) is not None:
                packed.meta["val"], scales.meta["val"] = _val(rq)
            args = (packed, scales, *down.args[1:7], _val(down).dtype)
            pq = graph.call_function(prequant, args)
            set_val(graph, pq, prequant, *args)
        pq.meta.update({k: v for k, v in down.meta.items() if k not in ("val", "tensor_meta", "eager_input_vals")})
        down.replace_all_uses_with(pq)
        graph.erase_node(down)
        done += 1
        nvgemm_counters()["requant_fused"] += 1
    if done:
        graph.eliminate_dead_code()
    return done
