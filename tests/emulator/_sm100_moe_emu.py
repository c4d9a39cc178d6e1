"""Helpers of the sm100 grouped-MoE emulator tests: exactness-preserving W4A4 MoE operands and one
``nvfp4_moe`` call through the real AOT artifacts of the grouped kernel on the PTX emulator, with the
production host path (:func:`nvgemm.templates.sm100_moe.launch.moe_forward`)."""

from __future__ import annotations

import torch

from nvgemm.core.formats import pack_e2m1, to_blocked

POW2_E4M3 = torch.tensor([0x28, 0x30, 0x38, 0x40, 0x48], dtype=torch.uint8)  # 2**-2 .. 2**2


def _stack(g, e, rows, k, sparse_per_row=None):
    ws, ss = [], []
    for _ in range(e):
        codes = torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)
        if sparse_per_row is not None:  # at most `sparse_per_row` nonzero codes per row
            keep = torch.zeros((rows, k), dtype=torch.bool)
            for r in range(rows):
                keep[r, torch.randperm(k, generator=g)[:sparse_per_row]] = True
            codes = torch.where(keep, codes, torch.zeros_like(codes))
        ws.append(pack_e2m1(codes))
        sc = POW2_E4M3[torch.randint(0, 5, (rows, k // 16), generator=g)].view(torch.float8_e4m3fn)
        ss.append(to_blocked(sc))
    return torch.stack(ws), torch.stack(ss)


def _exact_x(g, m, h):
    """Rows whose NVFP4 quantization is exact for any power-of-two input scale: every 16-block is
    E2M1 values x 2**j with one +-6 x 2**j (the block amax), j in [-1, 1]."""
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    v = e2m1[torch.randint(0, 8, (m, h // 16, 16), generator=g)]
    v[:, :, 0] = 6.0
    v = v * torch.where(torch.rand(v.shape, generator=g) < 0.5, -1.0, 1.0)
    v = v[:, :, torch.randperm(16, generator=g)]
    return (v * torch.pow(2.0, torch.randint(-1, 2, (m, h // 16, 1), generator=g).float())).reshape(m, h)


#: largest GEMM1 K for which the fp16 operands keep h and the output finite (every sm100 MoE sweep run at H = 416 is finite);
#: callers with a longer K pass ``up_shift`` (2 per doubling of K)
FP16_SAFE_K = 416


def exact_moe_operands(m, top_k, e, h, i, *, seed=0, alpha13="expert", ids=None, shared=False, residual=False,
                       x_dtype=torch.bfloat16, up_shift=0):
    """W4A4 ``silu_mul`` operands (op schema order) on which every kernel step is exact or rounds the
    same single value as the reference:

    * x quantizes exactly (``_exact_x``) with the per-expert power-of-two input scales;
    * GEMM1: E2M1 codes x block scales 2**[-2, 2]: every fp32 sum is exact (any order); the gate
      alpha (input_scale x weight_scale_2) is >= 2**14, so every nonzero gate has |g| >= 2**8 and
      the sigmoid saturates in fp32: silu(g) = g or -0 on both sides, ``h = round(g * u)`` is one
      rounding of the same fp32 product;
    * the requant of h (under test) uses w2_input_scale = amax(h of the expert) / 2688 / 4, so some
      blocks saturate the e4m3 scale (a power of two);
    * GEMM2: at most two nonzero codes per weight row: one rounding of the same sum of two exact
      products; alpha2 = input_scale x weight_scale_2 a power of two; finalize: the same fp32 operations in the same order.
    """
    from nvgemm.ops.linear import nvfp4_linear_emulated

    g = torch.Generator().manual_seed(seed)
    w13, s13 = _stack(g, e, 2 * i, h)
    w2, s2 = _stack(g, e, h, i, sparse_per_row=2)
    in13 = torch.pow(2.0, torch.randint(-1, 2, (e,), generator=g).float())
    up_lo = -2
    if x_dtype == torch.float16:  # fp16 (max 65504): per-row alpha with tiny up rows keeps h in range
        alpha13, up_lo = "row", -24
    up_lo -= up_shift  # fp16 with a long K (the sums grow with K): smaller up-row scales keep h in range
    if alpha13 == "expert":
        g13 = torch.pow(2.0, 14 + torch.randint(0, 3, (e,), generator=g).float())
    else:  # per row: gate rows >= 2**14, up rows 2**[-2, 0]
        g13 = torch.cat([torch.pow(2.0, 14 + torch.randint(0, 3, (e, i), generator=g).float()),
                         torch.pow(2.0, torch.randint(up_lo, up_lo + 3, (e, i), generator=g).float())], dim=1)
    x = _exact_x(g, m, h).to(x_dtype)
    if ids is None:
        ids = torch.randint(0, e, (m, top_k), generator=g, dtype=torch.int32)
    in2 = torch.empty(e)
    for ex in range(e):  # the requant's global scale from the expert's own h over all tokens (a power of 2)
        hx = nvfp4_linear_emulated(x, w13[ex], s13[ex], g13[ex], in13[ex], None, None, "silu_mul", None)
        in2[ex] = 2.0 ** float(torch.tensor(max(float(hx.float().abs().amax()), 1.0) / 2688 / 4).log2().floor())
    g2 = torch.pow(2.0, torch.randint(-3, 0, (e,), generator=g).float()) / in2  # alpha2 = 2**[-3, -1]
    wts = torch.rand(ids.shape, generator=g)
    sh = (torch.randn(m, h, generator=g) * 64).to(x_dtype) if shared else None
    res = (torch.randn(m, h, generator=g) * 64).to(x_dtype) if residual else None
    return [x, ids, wts, w13, s13, g13, in13, w2, s2, g2, in2, "silu_mul", False, None, sh, res, None]


def random_moe_operands(m, top_k, e, h, i, *, seed=0):
    """Gaussian W4A4 operands: the sm90 helper's ModelOpt-style quantized weights and x, plus per-expert
    input scales (unequal across experts) for the batch-invariance tests."""
    from _sm90_moe_emu import random_moe_operands as w4a16_operands

    ops = w4a16_operands(m, top_k, e, h, i, seed=seed)
    ops[6] = float(ops[0].float().abs().amax()) / 2688 * torch.linspace(0.8, 1.2, e)
    ops[10] = torch.full((e,), 0.3 / 2688) * torch.linspace(1.2, 0.8, e)
    return ops


def emu_launcher(stats=None, launches=None, order="forward"):
    """A ``launch`` for :func:`moe_forward` that runs each grouped GEMM's real AOT artifact on the emulator
    (``stats``: a list that receives each launch's warp-instruction count; ``launches``: one that receives
    each emulated :class:`~nvgemm.emulator.ptx.machine.Launch`; ``order``: the emulator's CTA order, "forward",
    "reverse" or a shuffle seed)."""
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.emulator.runner import prepare

    def launch(args):
        spec = make_spec("sm100_moe_nvfp4", args.config, "sm_100a", epilogue=args.spec)
        if args.fin is not None:  # scratch rows and output start as NaN: a read before the write shows
            args.c.fill_(float("nan"))
            args.fin.out.fill_(float("nan"))
        r = prepare(spec).launch(*args.abi_values(), 0, order=order)
        if stats is not None:
            stats.append(r.stats["warp_instructions"])
        if launches is not None:
            launches.append(r)

    return launch


def run_moe_emu(ops, config13, config2, keep=None, stats=None, launches=None, order="forward"):
    """One ``nvfp4_moe`` call (W4A4 operands in schema order) through the grouped kernels on the emulator."""
    from nvgemm.templates.sm100_moe.launch import moe_forward

    (x, ids, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwi, emap, sh, res, odt) = ops
    return moe_forward(x, ids, emap, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwi, sh, res, odt, config13,
                       config2, emu_launcher(stats, launches, order), keep=keep)
