"""Post-grad FX rewrite: RoPE of q and k and the KV-cache write of k and v -> ``nvgemm::rope_kv_write``.

Run by the capture pass with the layer rewrites (:mod:`nvgemm.integrations.inductor.layer_fusion`, ``fuse_layer``).
It matches what a decoder layer with a fused qkv projection and a static KV cache traces to (functionalized,
Inductor's decompositions), e.g. ``nvgemm.cli.decode_step.Attention`` with ``fused_rope=False``::

    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], -1)            # qkv: an nvgemm GEMM's [T, W] output
    q, k, v = <views of q / k / v as [.., heads, tokens, D]>         # any pure views (the decode GQA view too)
    c, s = cos_table[pos], sin_table[pos]                          # tables [P, D], rows read at the positions
    q = q * c + cat(-q[..., D/2:], q[..., :D/2]) * s               # rotate_half RoPE (either operand order)
    k = k * c + cat(-k[..., D/2:], k[..., :D/2]) * s
    k_cache.index_copy_(2, pos, k); v_cache.index_copy_(2, pos, v) # caches [1, Hkv, S, D] (graph inputs)

and replaces it with one ``auto_functionalized_v2(nvgemm.rope_kv_write, ...)`` node (what functionalization makes
of the op called directly; Inductor re-inplaces it into the caches), its q viewed back to the graph's layout.
Conditions, each checked from the nodes' fake values: every q / k / v view is a pure view chain of the GEMM output
at its offset (q at 0, k at Hq * D, v at (Hq + Hkv) * D) whose token / head / dim strides are the row width, a
multiple of D and 1; the written k / v are ``[1, Hkv, T, D]`` at the positions of ``pos`` (one 1-D index);
q and k read the same cos / sin rows; the roped k feeds only the cache write; static sizes. Anything else is left
to Inductor (its own kernels compute the same values).

Numerics: the op computes ``x * cos + rotate_half(x) * sin`` in fp32 with one rounding to x's dtype, which is
what Inductor's fused kernel computes too (it up-casts bf16 pointwise math), up to its FMA contraction; the eager
bf16 graph rounds each product and the sum (a few bf16 ulps apart; ``tests/cpu/test_rope_kv_write.py``).

Counter: ``rope_kv_fused`` (``torch._dynamo.utils.counters["nvgemm_cutedsl"]``).
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Optional

import torch
import torch.fx as fx

from nvgemm.integrations.inductor.compat import nvgemm_counters
from nvgemm.integrations.inductor.fx_nodes import is_call as _is, node_val as _val
from nvgemm.templates.triton import fused_ops as _fused_ops  # noqa: F401  (registers nvgemm::rope_kv_write)

log = logging.getLogger("nvgemm_cutedsl")
aten = torch.ops.aten

_X_DTYPES = (torch.bfloat16, torch.float16)
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.slice.Tensor,
          aten.transpose.int, aten.permute.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default,
          aten.alias.default, aten.expand.default)


def _gemms() -> tuple:
    ops = torch.ops.nvgemm
    return (ops.nvfp4_linear.default, ops.nvfp4_linear_prequant.default, ops.nvfp4_linear_sm90_prepared.default)


def _static(v) -> bool:
    return isinstance(v, torch.Tensor) and all(isinstance(s, int) for s in (*v.shape, *v.stride())) \
        and isinstance(v.storage_offset(), int)


def _view_root(n: Any) -> Optional[fx.Node]:
    """The node ``n`` is a pure view chain of (through ``getitem`` of ``split`` / ``split_with_sizes``), or None."""
    while True:
        if _is(n, *_VIEWS):
            n = n.args[0]
        elif _is(n, operator.getitem) and _is(n.args[0], aten.split_with_sizes.default, aten.split.Tensor):
            n = n.args[0].args[0]
        else:
            return n if isinstance(n, fx.Node) else None


def _geometry(x: fx.Node, qkv: fx.Node, head_dim: int) -> Optional[tuple[int, list[str]]]:
    """(element offset into the qkv row, role of each dim of ``x``: "token" / "head" / "dim" / "one") when ``x`` is
    a view of ``qkv`` [T, W] whose dims step by W (tokens), a multiple of D below W (heads) or 1 (the head dim,
    last, size D); else None."""
    vx, vq = _val(x), _val(qkv)
    if _view_root(x) is not qkv or not (_static(vx) and _static(vq)) or vq.dim() != 2 or vq.stride(1) != 1:
        return None
    w = vq.stride(0) if vq.shape[0] > 1 else vq.shape[1]
    if vx.shape[-1] != head_dim or vx.stride(-1) != 1:
        return None
    roles = []
    for size, stride in zip(vx.shape[:-1], vx.stride()[:-1]):
        if size == 1:
            roles.append("one")
        elif stride == w:
            roles.append("token")
        elif stride % head_dim == 0 and 0 < stride < w:
            roles.append("head")
        else:
            return None
    return vx.storage_offset() - vq.storage_offset(), roles + ["dim"]


def _table_rows(c: Any, pos: fx.Node) -> Optional[fx.Node]:
    """The table ``c`` reads rows of at ``pos`` (``table[pos]`` through views), or None."""
    root = c
    while _is(root, *_VIEWS):
        root = root.args[0]
    if not _is(root, aten.index.Tensor) or len(root.args[1]) != 1 or root.args[1][0] is not pos:
        return None
    vt = _val(root.args[0])
    if not (_static(vt) and vt.dim() == 2 and vt.stride(-1) == 1):
        return None
    return root.args[0]


def _slice_range(sl: fx.Node, size: int, ndim: int) -> Optional[tuple[int, int]]:
    """(start, end) of ``aten.slice(x, -1, start, end)`` (step 1) clamped to ``size``; None for another dim/step."""
    a = list(sl.args) + [None] * (5 - len(sl.args))
    dim, start, end, step = a[1], a[2], a[3], a[4]
    dim = sl.kwargs.get("dim", dim if dim is not None else 0)
    if dim not in (-1, ndim - 1) or step not in (None, 1) or not all(isinstance(v, (int, type(None)))
                                                                    for v in (start, end)):
        return None
    return (start or 0), min(size if end is None else end, size)


def _match_rope(y: Any) -> Optional[tuple[fx.Node, fx.Node, fx.Node]]:
    """(x, c, s) when ``y = x * c + cat(-x[..., h:], x[..., :h], -1) * s`` (either operand order), else None."""
    if not _is(y, aten.add.Tensor) or len(y.args) != 2 or y.kwargs:
        return None
    for a, b in ((y.args[0], y.args[1]), (y.args[1], y.args[0])):
        if not (_is(a, aten.mul.Tensor) and _is(b, aten.mul.Tensor)):
            continue
        for cat, s in ((b.args[0], b.args[1]), (b.args[1], b.args[0])):
            if not _is(cat, aten.cat.default) or len(cat.args[0]) != 2:
                continue
            neg, lo = cat.args[0]
            if not (_is(neg, aten.neg.default) and _is(neg.args[0], aten.slice.Tensor) and _is(lo, aten.slice.Tensor)):
                continue
            x = neg.args[0].args[0]
            vx = _val(x)
            if lo.args[0] is not x or not _static(vx) or vx.shape[-1] % 2:
                continue
            n, h = vx.shape[-1], vx.shape[-1] // 2
            cdim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
            if cdim not in (-1, vx.dim() - 1) or _slice_range(neg.args[0], n, vx.dim()) != (h, n) \
                    or _slice_range(lo, n, vx.dim()) != (0, h):
                continue
            for xx, c in ((a.args[0], a.args[1]), (a.args[1], a.args[0])):
                if xx is x:
                    return x, c, s
    return None


def _cos_sin_ok(c: fx.Node, x_roles: list[str], tokens: int, head_dim: int) -> bool:
    """``c`` broadcasts against x as one row per token: [.., T at x's token dim, D], ones elsewhere."""
    vc = _val(c)
    if not _static(vc) or vc.dim() > len(x_roles):
        return False
    roles = x_roles[len(x_roles) - vc.dim():]
    for size, role in zip(vc.shape, roles):
        want = {"dim": head_dim, "token": tokens}.get(role, 1)
        if size != want:
            return False
    return True


def _cache_write(n: Any) -> Optional[tuple[fx.Node, fx.Node, fx.Node]]:
    """(cache, pos, value) for ``index_put(cache, [None, None, pos], value)`` / ``index_copy(cache, 2, pos, value)``."""
    if _is(n, aten.index_put.default) and (len(n.args) == 3 or n.args[3] is False) and not n.kwargs:
        idx = n.args[1]
        if len(idx) == 3 and idx[0] is None and idx[1] is None and isinstance(idx[2], fx.Node):
            return n.args[0], idx[2], n.args[2]
    if _is(n, aten.index_copy.default) and n.args[1] in (2, -2):
        return n.args[0], n.args[2], n.args[3]
    return None


def _kv_layout(x: Any, qkv: fx.Node, offset: int, hkv: int, t: int, d: int) -> bool:
    """``x`` is the [1, Hkv, T, D] view of the qkv row part at ``offset`` (head stride D, token stride the row)."""
    vx, vq = _val(x), _val(qkv)
    if _view_root(x) is not qkv or not (_static(vx) and _static(vq)) or tuple(vx.shape) != (1, hkv, t, d):
        return False
    row = vq.stride(0) if vq.shape[0] > 1 else vq.shape[1]
    return (vx.storage_offset() - vq.storage_offset() == offset and vx.stride(3) == 1
            and (hkv == 1 or vx.stride(1) == d) and (t == 1 or vx.stride(2) == row))


def _q_layout(x: fx.Node, qkv: fx.Node, hq: int, t: int, d: int) -> Optional[list[str]]:
    """Roles of ``x``'s dims when it is a view of the q part of the qkv rows (offset 0): at most one token dim,
    head dims whose farthest element stays inside the q part, the head dim last; else None."""
    g = _geometry(x, qkv, d)
    vx = _val(x)
    if g is None or g[0] != 0 or vx.numel() != t * hq * d or g[1].count("token") > (1 if t > 1 else 0):
        return None
    reach = sum((size - 1) * stride for size, stride, role in zip(vx.shape, vx.stride(), g[1]) if role == "head")
    return g[1] if reach + d <= hq * d else None


def _match(kput: fx.Node, writes: list) -> Optional[dict]:
    kc, pos, kval = _cache_write(kput)
    vkc, vp = _val(kc), _val(pos)
    if kc.op != "placeholder" or not _static(vkc) or vkc.dim() != 4 or vkc.shape[0] != 1 or vkc.stride(-1) != 1:
        return None
    if not (_static(vp) and vp.dim() == 1 and vp.dtype in (torch.int32, torch.int64)):
        return None
    hkv, d, t = vkc.shape[1], vkc.shape[3], vp.shape[0]
    rope_k = _match_rope(kval)
    if rope_k is None or len(kval.users) != 1:
        return None
    xk, ck, sk = rope_k
    qkv = _view_root(xk)
    if not _is(qkv, *_gemms()):
        return None
    vq = _val(qkv)
    if not _static(vq) or vq.dim() != 2 or vq.dtype not in _X_DTYPES or vq.shape[0] != t or vq.shape[1] % d \
            or vkc.dtype != vq.dtype or not _static(_val(kval)) or tuple(_val(kval).shape) != (1, hkv, t, d):
        return None
    hq = vq.shape[1] // d - 2 * hkv
    if hq < hkv or hq % hkv or not _kv_layout(xk, qkv, hq * d, hkv, t, d):
        return None
    kroles = ["one", "head" if hkv > 1 else "one", "token" if t > 1 else "one", "dim"]
    cos, sin = _table_rows(ck, pos), _table_rows(sk, pos)
    if cos is None or sin is None or not (_cos_sin_ok(ck, kroles, t, d) and _cos_sin_ok(sk, kroles, t, d)):
        return None
    vcos, vsin = _val(cos), _val(sin)
    if vcos.shape != vsin.shape or vcos.shape[1] != d or any(v.dtype not in (torch.float32, vq.dtype)
                                                            for v in (vcos, vsin)):
        return None
    # the v write: the same positions, the v part of the same GEMM output, unchanged
    vput = None
    for w in writes:
        vc, vpos, vval = _cache_write(w)
        if w is not kput and vpos is pos and _kv_layout(vval, qkv, (hq + hkv) * d, hkv, t, d):
            vput = w
    if vput is None:
        return None
    vc = _cache_write(vput)[0]
    vvc = _val(vc)
    if vc.op != "placeholder" or vc is kc or not _static(vvc) or vvc.shape != vkc.shape or vvc.dtype != vkc.dtype \
            or vvc.stride(-1) != 1:
        return None
    # q: one rope of the q part reading the same cos / sin rows
    qrope = None
    for y in kput.graph.nodes:
        mq = _match_rope(y) if y is not kval else None
        if mq is None or _view_root(mq[0]) is not qkv:
            continue
        roles = _q_layout(mq[0], qkv, hq, t, d)
        if roles is None or _table_rows(mq[1], pos) is not cos or _table_rows(mq[2], pos) is not sin \
                or not (_cos_sin_ok(mq[1], roles, t, d) and _cos_sin_ok(mq[2], roles, t, d)) \
                or tuple(_val(y).shape) != tuple(_val(mq[0]).shape):
            continue
        if qrope is not None:
            return None  # two q-like ropes: not a layer shape this rewrite knows
        qrope = (y, mq[0])
    if qrope is None:
        return None
    return dict(qkv=qkv, cos=cos, sin=sin, pos=pos, kc=kc, vc=vc, kput=kput, vput=vput, hq=hq, hkv=hkv, d=d, t=t,
                qrope=qrope)


def _q_strides(x: fx.Node, qkv: fx.Node, hq_d: int) -> list[int]:
    """Strides of the graph's q layout in the op's q [T, Hq, D]: a step of one qkv row becomes Hq * D."""
    vq = _val(qkv)
    row = vq.stride(0) if vq.shape[0] > 1 else vq.shape[1]
    return [hq_d if (stride == row and size > 1) else stride for size, stride in zip(_val(x).shape, _val(x).stride())]


def fuse_rope_kv_write(graph: fx.Graph, set_val) -> int:
    """The rewrite of the module docstring; returns how many RoPE + KV writes became ``nvgemm::rope_kv_write``."""
    op = torch.ops.nvgemm.rope_kv_write.default
    hop = torch.ops.higher_order.auto_functionalized_v2
    done = 0
    writes = [n for n in graph.nodes if _cache_write(n) is not None]
    for kput in list(writes):
        if kput not in writes:
            continue
        try:
            m = _match(kput, writes)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:  # an unknown node shape
            log.debug("nvgemm_cutedsl: RoPE + KV write at %s not matched: %r", kput, e)
            m = None
        if m is None:
            continue
        y, xq = m["qrope"]
        order = {n: i for i, n in enumerate(graph.nodes)}
        # right after its last input (the GEMM, or a table / position computed later): before every reader
        anchor = max((m[k] for k in ("qkv", "cos", "sin", "pos", "kc", "vc")), key=order.__getitem__)
        shape, strides = list(_val(y).shape), _q_strides(xq, m["qkv"], m["hq"] * m["d"])
        kwargs = dict(qkv=m["qkv"], cos_cache=m["cos"], sin_cache=m["sin"], positions=m["pos"],
                      num_heads=m["hq"], num_kv_heads=m["hkv"], _k_cache_base_index=0, _v_cache_base_index=1,
                      _all_bases=[m["kc"], m["vc"]])
        with graph.inserting_after(anchor):
            af = graph.call_function(hop, (op,), kwargs)
        with graph.inserting_after(af):
            q = graph.call_function(operator.getitem, (af, 0))
        with graph.inserting_after(q):
            kn = graph.call_function(operator.getitem, (af, 1))
        with graph.inserting_after(kn):
            vn = graph.call_function(operator.getitem, (af, 2))
        with graph.inserting_after(vn):
            qv = graph.call_function(aten.as_strided.default, (q, shape, strides, 0))
        t, hq, d = m["t"], m["hq"], m["d"]
        set_val(graph, af, lambda x, kc, vc: (x.new_empty((t, hq, d)), torch.empty_like(kc), torch.empty_like(vc)),
                m["qkv"], m["kc"], m["vc"])
        if _val(af) is not None:
            for i, n in enumerate((q, kn, vn)):
                n.meta["val"] = _val(af)[i]
        set_val(graph, qv, lambda x: x.as_strided(shape, strides, 0), q)
        # every reader: the op's q and the updated caches (attention, the copy back into the graph inputs)
        for old, new in ((y, qv), (m["kput"], kn), (m["vput"], vn)):
            old.replace_all_uses_with(new)
        writes.remove(m["kput"])
        writes.remove(m["vput"])
        done += 1
        nvgemm_counters()["rope_kv_fused"] += 1
    if done:
        graph.eliminate_dead_code()
    return done


__all__ = ["fuse_rope_kv_write"]
