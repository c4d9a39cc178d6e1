"""Shared NVFP4 test cases for the Triton kernels (interpreter tests here and tests/gpu).

* :func:`adversarial` — 16-blocks that hit every e2m1/e4m3 rounding rule exactly;
* :func:`error_bound` — element-wise bound on |GEMM kernel - emulated op| from fp32 summation order.
"""

from __future__ import annotations

import torch

from nvgemm.core.formats import dequantize, quantize_activation

BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # e2m1 rounding boundaries (exact ties)


def _step(v: torch.Tensor, up: bool) -> torch.Tensor:
    """Next representable value of v's (16-bit) dtype away from (up) or towards zero."""
    bits = v.view(torch.int16)
    return (bits + (1 if up else -1)).view(v.dtype)


def adversarial(dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of 16-blocks that hit every rounding rule; gs = 2**-4 so every S = sf * gs is exact.

    For an e4m3 value sf, a block containing 6*sf*gs has v = amax / (6 gs) = sf exactly, so the
    block scale is sf and q = x / S is exactly t for x = t*S: ties at every e2m1 boundary, then
    the same values one dtype-ulp above and below.
    """
    gs = 2.0**-4
    rows = []
    for sf in (2.0**-9, 3 * 2.0**-9, 2.0**-6, 0.375, 1.0, 1.125, 3.25, 13.0, 240.0, 448.0):
        s = sf * gs
        t = torch.tensor(BOUNDS, dtype=torch.float64)
        ties = torch.cat([torch.tensor([6.0]), t, -t, torch.tensor([-6.0])]) * s
        tie_blk = ties.to(dtype)
        assert torch.equal(tie_blk.double(), ties), "tie values must be exact in the dtype"
        up = torch.cat([tie_blk[:1], _step(tie_blk[1:8], True), _step(tie_blk[8:15], True), tie_blk[15:]])
        down = torch.cat([tie_blk[:1], _step(tie_blk[1:8], False), _step(tie_blk[8:15], False), tie_blk[15:]])
        rows.append(torch.cat([tie_blk, up, down, tie_blk.flip(0)]))
    sat = 448 * 6 * gs
    specials = [
        torch.zeros(16),  # all-zero block -> sf 0, q 0
        torch.full((16,), -0.0),  # negative zeros -> still code 0 (no sign)
        torch.tensor([sat] + [sat * 0.999] * 7 + [-sat * 1.001] * 8),  # around the saturation point
        torch.tensor([sat * 40] + [1.0] * 15),  # sf clamps at 448: codes saturate at 6
        torch.tensor([1000.0] + [0.01, -0.01] * 7 + [-0.001]),  # single outlier: the rest -> +-0 codes
        torch.tensor([2.0**-16] * 8 + [-(2.0**-16)] * 8),  # v = amax/(6gs) < 2**-10: sf 0, all codes 0
        torch.tensor([2.0**-12] + [-(2.0**-13)] * 15),  # e4m3-subnormal block scales
        torch.randn(16) * 2.0**-14,  # tiny (fp16 subnormal) values
    ]
    rows.append(torch.cat(specials[:4]).to(dtype))
    rows.append(torch.cat(specials[4:]).to(dtype))
    return torch.stack(rows), torch.tensor(gs)


U32 = 2.0**-24
OUT_ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 0.0}
OUT_TINY = {torch.bfloat16: 2.0**-126, torch.float16: 2.0**-24, torch.float32: 2.0**-126}


def error_bound(x, q, ws2, input_scale, bias, activation, out_dtype, ref32, acc_factor: float = 1.0):
    """Element-wise bound on |kernel - emulated reference|.

    Both sides multiply identical, exactly representable operands, so the accumulators differ only
    by fp32 summation order: <= 2 * K * 2**-24 * sum_k |a_k w_k| (gamma_K for each side; tensor-core
    accumulation gets ``acc_factor``). Pushed through alpha and the activation (|silu'|,
    |gelu_tanh'| <= 1.13; product rule for silu_mul), plus a few fp32 ulps for exp/tanh
    implementations and one ulp of the output dtype for the final rounding.
    """
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if input_scale is not None:
        a = dequantize(*quantize_activation(x2, input_scale)).double()
        alpha = (input_scale.double() * ws2.double()).abs()
    else:
        a = x2.double()
        alpha = ws2.double().abs()
    w = dequantize(q.packed, q.scale).double()
    mag = (a.abs() @ w.abs().t()) * alpha
    pre = (a @ w.t()) * (input_scale.double() * ws2.double() if input_scale is not None else ws2.double())
    if bias is not None:
        pre = pre + bias.double()
    e_pre = 2 * acc_factor * k * U32 * mag + 4 * U32 * pre.abs()
    if activation == "none":
        e = e_pre
    elif activation in ("silu", "gelu_tanh"):
        e = 1.13 * e_pre + 8 * U32 * pre.abs()
    else:
        n2 = pre.shape[-1] // 2
        g, u = pre[:, :n2], pre[:, n2:]
        eg, eu = e_pre[:, :n2] + 8 * U32 * g.abs(), e_pre[:, n2:]
        e = 1.1 * eg * (u.abs() + eu) + torch.nn.functional.silu(g).abs() * eu
    r = ref32.reshape(e.shape).double()
    return (e + 2 * U32 * r.abs() + OUT_ULP[out_dtype] * r.abs() + OUT_TINY[out_dtype]).reshape(ref32.shape)
