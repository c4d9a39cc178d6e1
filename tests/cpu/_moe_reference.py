"""Independent fp64 reference of routed NVFP4 experts (tests only).

Per routed pair it runs ``_reference.ref_linear_fp64`` (fp64 lookup-table decode, brute-force
activation rounding, fp64 matmul/epilogue) for the gate/up GEMM, rounds the activation to the
input dtype (where ModelOpt's fake-quant graph and nvgemm round it), runs the down GEMM in fp64
and sums ``w * y`` in fp64. It shares no code with ``nvgemm.ops.moe`` or the swizzle.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from _reference import ref_linear_fp64


class Q(NamedTuple):
    packed: torch.Tensor  # uint8 [N, K/2]
    scale: torch.Tensor  # e4m3 [N, K/16] linear layout


class RefExpert(NamedTuple):
    w13: Q
    w13_scale_2: torch.Tensor  # () or [R13]
    w13_input_scale: torch.Tensor | None
    w2: Q
    w2_scale_2: torch.Tensor
    w2_input_scale: torch.Tensor | None


def ref_expert_fp64(xin: torch.Tensor, ex: RefExpert, activation: str) -> torch.Tensor:
    """fp64 [n, H] output of one expert for bf16/fp16 rows ``xin``; h rounded to xin's dtype."""
    if activation == "relu2":
        a, _ = ref_linear_fp64(xin, ex.w13, ex.w13_scale_2, ex.w13_input_scale, None, None, "none", None)
        a = torch.relu(a).square()
    else:
        a, _ = ref_linear_fp64(xin, ex.w13, ex.w13_scale_2, ex.w13_input_scale, None, None, activation, None)
    h = a.to(xin.dtype)
    y, _ = ref_linear_fp64(h, ex.w2, ex.w2_scale_2, ex.w2_input_scale, None, None, "none", None)
    return y


def ref_moe_fp64(x, topk_ids, topk_weights, experts: list[RefExpert], activation="silu_mul",
                 router_weight_on_input=False, expert_map=None, shared_out=None, residual=None) -> torch.Tensor:
    m, k = topk_ids.shape
    out = torch.zeros(m, x.shape[1], dtype=torch.float64)
    for t in range(m):
        for s in range(k):
            e = int(topk_ids[t, s])
            if e >= 0 and expert_map is not None:
                e = int(expert_map[e])
            if e < 0:
                continue
            w = float(topk_weights[t, s])
            xin = x[t : t + 1]
            if router_weight_on_input:
                xin = (xin.double() * w).to(x.dtype)
                w = 1.0
            out[t] += w * ref_expert_fp64(xin, experts[e], activation)[0]
    if shared_out is not None:
        out += shared_out.double()
    if residual is not None:
        out += residual.double()
    return out


def moe_tolerance(ref: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """Element-wise bound for |op - ref_moe_fp64|.

    The op and the reference quantize identical operands (exact in fp32/fp64); they differ by
    (a) the final rounding: half an ulp of out_dtype relative to the element (2^-9 bf16; we allow
    2^-8), (b) fp32 vs fp64 accumulation in GEMM1, which moves the rounding of the intermediate h
    by one ulp for a few elements (and, W4A4, can then move one requantized FP4 code by one step
    within its block); such a change perturbs every output element of that token by at most about
    one ulp of the token's largest output (2^-8 * max_t|ref|). A wrong scale, a dropped or doubled
    slot, or a misrouted expert is O(1) of max_t|ref|.
    """
    eps = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-22}[out_dtype]
    return eps * ref.abs() + 2.0**-8 * ref.abs().amax(dim=-1, keepdim=True) + 1e-30
