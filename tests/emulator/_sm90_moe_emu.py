"""Helpers of the sm90 grouped-MoE emulator tests: exactness-preserving MoE operands and one
``nvfp4_moe`` call through the real AOT artifacts of the grouped kernel on the PTX emulator, with
the production host path (:func:`nvgemm.templates.sm90_moe.launch.moe_forward`)."""

from __future__ import annotations

import torch

from nvgemm.core.formats import pack_e2m1, to_blocked


def _codes(g, shape, sparse_per_row=None):
    codes = torch.randint(0, 16, shape, generator=g, dtype=torch.uint8)
    if sparse_per_row is not None:  # at most `sparse_per_row` nonzero codes per row, random positions
        keep = torch.zeros(shape, dtype=torch.bool)
        for r in range(shape[0]):
            keep[r, torch.randperm(shape[1], generator=g)[:sparse_per_row]] = True
        codes = torch.where(keep, codes, torch.zeros_like(codes))
    return codes


def _stack(g, e, rows, k, sparse_per_row=None):
    ws, ss = [], []
    for _ in range(e):
        ws.append(pack_e2m1(_codes(g, (rows, k), sparse_per_row)))
        sc = torch.pow(2.0, torch.randint(-2, 3, (rows, k // 16), generator=g).float()).to(torch.float8_e4m3fn)
        ss.append(to_blocked(sc))
    return torch.stack(ws), torch.stack(ss)


#: largest GEMM1 K for which the fp16 operands keep h and the output finite (the fp16 output overflows at H = 416 in the MoE sweep);
#: callers with a longer K pass ``up_shift`` (2 per doubling of K)
FP16_SAFE_K = 64


def exact_moe_operands(m, top_k, e, h, i, *, seed=0, alpha13="expert", ids=None, shared=False, residual=False,
                       x_dtype=torch.bfloat16, up_shift=0):
    """Operands (op schema order, W4A16 silu_mul) on which every kernel step is exact or rounds the
    same single fp32 result as the reference:

    * GEMM1: x = j/8 (|j| <= 16), E2M1 codes, block scales 2**[-2, 2]: the fp32 sums are exact
      (K <= 4096); the gate alpha is >= 2**14, so every nonzero gate value has |g| >= 2**8 and the
      sigmoid saturates in fp32 (exp(-g) = 0 or inf): silu(g) is g or -0 on both sides, and
      ``h = round(silu(g) * u)`` rounds the same fp32 product once;
    * GEMM2: at most two nonzero codes per weight row, so each output is one fp32 rounding of a sum
      of at most two exact products (order-independent); alpha2 a power of two;
    * finalize: the same fp32 operations in the same order on both sides (any top-k weights).

    fp16 (max 65504): the per-row alpha is forced and the up rows get 2**[-20, -18], which keeps
    ``h`` and the outputs in range; ``up_shift`` lowers the up rows' scales by 2**up_shift more (fp16
    with a long K: the sums grow with K).
    """
    g = torch.Generator().manual_seed(seed)
    w13, s13 = _stack(g, e, 2 * i, h)
    w2, s2 = _stack(g, e, h, i, sparse_per_row=2)
    up_lo = (-20 if x_dtype == torch.float16 else -2) - up_shift
    if x_dtype == torch.float16:
        alpha13 = "row"
    if alpha13 == "expert":
        g13 = torch.pow(2.0, 14 + torch.randint(0, 3, (e,), generator=g).float())
    else:  # per row: gate rows >= 2**14, up rows 2**[-2, 0]
        g13 = torch.cat([torch.pow(2.0, 14 + torch.randint(0, 3, (e, i), generator=g).float()),
                         torch.pow(2.0, torch.randint(up_lo, up_lo + 3, (e, i), generator=g).float())], dim=1)
    g2 = torch.pow(2.0, torch.randint(-3, 0, (e,), generator=g).float())
    x = (torch.randint(-16, 17, (m, h), generator=g).float() / 8).to(x_dtype)
    if ids is None:
        ids = torch.randint(0, e, (m, top_k), generator=g, dtype=torch.int32)
    wts = torch.rand(ids.shape, generator=g)
    sh = torch.randn(m, h, generator=g).to(x_dtype) if shared else None
    res = torch.randn(m, h, generator=g).to(x_dtype) if residual else None
    return [x, ids, wts, w13, s13, g13, None, w2, s2, g2, None, "silu_mul", False, None, sh, res, None]


def random_moe_operands(m, top_k, e, h, i, *, seed=0):
    """Gaussian W4A16 operands (ModelOpt-style quantized weights) for the batch-invariance tests."""
    from nvgemm.core.formats import quantize_weight

    g = torch.Generator().manual_seed(seed)

    def stack(rows, k):
        qs = [quantize_weight(torch.randn(rows, k, generator=g)) for _ in range(e)]
        return (torch.stack([q.packed for q in qs]), torch.stack([to_blocked(q.scale) for q in qs]),
                torch.stack([q.global_scale.reshape(()) for q in qs]))

    w13, s13, g13 = stack(2 * i, h)
    w2, s2, g2 = stack(h, i)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, e, (m, top_k), generator=g, dtype=torch.int32)
    wts = torch.rand(m, top_k, generator=g)
    return [x, ids, wts, w13, s13, g13, None, w2, s2, g2, None, "silu_mul", False, None, None, None, None]


def emu_launcher(device="H200", stats=None, order="forward", launches=None):
    """A ``launch`` for :func:`moe_forward` that runs each grouped GEMM's real AOT artifact on the emulator
    (``stats``: a list that receives each launch's warp-instruction count; ``order``: the emulator's CTA
    order, "forward", "reverse" or a shuffle seed; ``launches``: a list that receives each emulated
    :class:`~nvgemm.emulator.ptx.machine.Launch`)."""
    from nvgemm.emulator.runner import prepare
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.templates.sm90_w4a16.operand import kind_of

    def launch(args):
        spec = make_spec("sm90_moe_mma", args.config, "sm_90a", epilogue=args.spec, a_format=kind_of(args.x.dtype),
                         b_format="nvfp4")
        if args.fin is not None:  # scratch rows and output start as NaN: a read before the write shows
            args.out.fill_(float("nan"))
            args.fin.out.fill_(float("nan"))
        r = prepare(spec, device=device).launch(*args.abi_values(), 0, order=order)
        if stats is not None:
            stats.append(r.stats["warp_instructions"])
        if launches is not None:
            launches.append(r)

    return launch


def run_moe_emu(ops, config13, config2, keep=None, stats=None, order="forward", launches=None):
    """One ``nvfp4_moe`` call (W4A16 operands in schema order) through the grouped kernels on the emulator."""
    from nvgemm.templates.sm90_w4a16.launch import Sm90Workspace
    from nvgemm.templates.sm90_moe.launch import moe_forward

    (x, ids, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwi, emap, sh, res, odt) = ops
    assert i13 is None and i2 is None
    return moe_forward(x, ids, emap, wts, w13, s13, g13, w2, s2, g2, act, rwi, sh, res, odt, config13,
                       config2,
                       emu_launcher(stats=stats, order=order, launches=launches), workspace=Sm90Workspace(torch.device("cpu")), keep=keep)
