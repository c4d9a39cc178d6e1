"""Tiny NVFP4 MoE problems and a per-pair reference of the ``nvgemm::nvfp4_moe`` contract (tests only).

:func:`make_moe` builds stacked expert weights the way the op takes them (``w13`` [E, R13, H/2] with
``[gate; up]`` rows, one 128x4-swizzled scale block per expert, per-expert ``weight_scale_2`` and input
scales); :func:`pair_reference` evaluates the numerics contract literally, one (token, slot) pair at
a time, from ``nvgemm.ops.linear.nvfp4_linear_emulated`` (independent of any MoE code): GEMM1 with the
activation and one rounding to x's dtype, GEMM2 in fp32, ``w * y`` summed in fp32 in slot order,
shared output and residual added, one rounding.
"""

from __future__ import annotations

import torch

from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.ops.linear import nvfp4_linear_emulated


def make_moe(e, h, i, *, gated=True, w4a4=True, row_alpha=False, seed=0, exact=False):
    """Random stacked experts. ``exact``: weights and scales with few significant bits so every fp32
    sum in the GEMMs is exact in any order (used for bit-exactness checks)."""
    g = torch.Generator().manual_seed(seed)
    r13 = 2 * i if gated else i

    def stack(rows, k):
        qs = []
        for _ in range(e):
            w = torch.randn(rows, k, generator=g)
            if exact:
                w = torch.randint(-6, 7, (rows, k), generator=g).float() * 0.5
                qs.append(quantize_weight(w, torch.tensor(2.0 ** -8)))
            else:
                qs.append(quantize_weight(w))
        return (torch.stack([q.packed for q in qs]), torch.stack([to_blocked(q.scale) for q in qs]),
                torch.stack([q.global_scale.reshape(()) for q in qs]))

    w13, s13, g13 = stack(r13, h)
    if row_alpha:
        g13 = g13[:, None] * torch.cat([torch.full((r13 // 2,), 1.0), torch.full((r13 - r13 // 2,), 1.5)])
    w2, s2, g2 = stack(h, i)
    ins13 = ins2 = None
    if w4a4:
        ins13 = (torch.linspace(0.8, 1.2, e) * (4.0 / 2688)).float()
        ins2 = (torch.linspace(1.2, 0.8, e) * (2.0 / 2688)).float()
        if exact:
            ins13 = torch.full((e,), 2.0 ** -9)
            ins2 = torch.full((e,), 2.0 ** -9)
    return dict(w13=w13, w13_scale=s13, w13_scale_2=g13, w13_input_scale=ins13,
                w2=w2, w2_scale=s2, w2_scale_2=g2, w2_input_scale=ins2)


def pair_reference(x, topk_ids, topk_weights, w, activation="silu_mul", router_weight_on_input=False,
                   expert_map=None, shared_out=None, residual=None, out_dtype=None, return_fp32=False):
    m, h = x.shape
    kk = topk_ids.shape[1]
    e = w["w13"].shape[0]
    acc = torch.zeros(m, h, dtype=torch.float32)
    for t in range(m):
        for k in range(kk):
            gid = int(topk_ids[t, k])
            if gid < 0:
                continue
            le = gid if expert_map is None else int(expert_map[gid])
            if le < 0 or le >= e:
                continue
            wt = topk_weights[t, k].float()
            xin = x[t:t + 1]
            if router_weight_on_input:
                xin = (xin.float() * wt).to(x.dtype)
                wt = torch.tensor(1.0)
            ins13 = None if w["w13_input_scale"] is None else w["w13_input_scale"][le]
            ins2 = None if w["w2_input_scale"] is None else w["w2_input_scale"][le]
            if activation == "relu2":  # not a dense epilogue: the fp32 GEMM, then relu(y)**2, one rounding
                hh = nvfp4_linear_emulated(xin, w["w13"][le], w["w13_scale"][le], w["w13_scale_2"][le], ins13, None,
                                           None, "none", torch.float32)
                hh = (torch.relu(hh) * torch.relu(hh)).to(x.dtype)
            else:
                hh = nvfp4_linear_emulated(xin, w["w13"][le], w["w13_scale"][le], w["w13_scale_2"][le], ins13, None,
                                           None, activation, None)
            y = nvfp4_linear_emulated(hh, w["w2"][le], w["w2_scale"][le], w["w2_scale_2"][le], ins2, None, None,
                                      "none", torch.float32)
            acc[t] = acc[t] + wt * y[0]
    if shared_out is not None:
        acc = acc + shared_out.float()
    if residual is not None:
        acc = acc + residual.float()
    return acc if return_fp32 else acc.to(out_dtype or x.dtype)
