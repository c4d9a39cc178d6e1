"""Independent fp64 references for NVFP4 linears (tests only): lookup-table decode, brute-force
nearest-value rounding with ties to the even code, fp64 matmul and epilogue."""

from __future__ import annotations

import torch

from nvgemm.core.formats import unpack_e2m1

LUT = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)


def ref_linear_fp64(x, q, ws2, input_scale, bias, residual, activation, out_dtype):
    """Independent reference: dequantize with a fp64 lookup table, fp64 matmul and epilogue."""
    n, k = q.packed.shape[0], q.packed.shape[1] * 2
    codes = unpack_e2m1(q.packed.cpu())
    w = LUT[codes.long()] * q.scale.cpu().double().repeat_interleave(16, dim=1)
    x2 = x.reshape(-1, k).cpu().double()
    if input_scale is not None:
        gs = float(input_scale)
        xb = x2.reshape(x2.shape[0], -1, 16)
        sf = (xb.abs().amax(-1).float() / (6 * torch.tensor(gs, dtype=torch.float32))).clamp(max=448).to(torch.float8_e4m3fn)
        S = (sf.float() * torch.tensor(gs, dtype=torch.float32)).double()
        q_x = torch.where(S[..., None] == 0, torch.zeros_like(xb), (xb.float() / S[..., None].float()).double())
        # round to nearest e2m1 magnitude, ties to the even code
        mags = LUT[:8]
        a = q_x.abs().clamp(max=6)
        d = (a[..., None] - mags).abs()
        best = d.min(-1, keepdim=True).values
        cand = (d == best)
        idx = torch.where(cand.sum(-1) > 1, (cand & (torch.arange(8) % 2 == 0)).double().argmax(-1), d.argmin(-1))
        deq = mags[idx] * torch.sign(q_x) * sf.double()[..., None]
        x2 = deq.reshape(x2.shape)
        alpha = torch.tensor(gs, dtype=torch.float32).double() * ws2.cpu().double()
    else:
        alpha = ws2.cpu().double()
    acc = x2 @ w.t()
    y = acc * alpha
    if bias is not None:
        y = y + bias.cpu().double()
    if activation == "silu":
        y = y * torch.sigmoid(y)
    elif activation == "gelu_tanh":
        y = torch.nn.functional.gelu(y, approximate="tanh")
    elif activation == "silu_mul":
        g, u = y[:, : n // 2], y[:, n // 2 :]
        y = g * torch.sigmoid(g) * u
    if residual is not None:
        y = y + residual.reshape(y.shape).cpu().double()
    return y.reshape(*x.shape[:-1], y.shape[-1]), (x2.abs() @ w.abs().t()) * alpha.abs()
