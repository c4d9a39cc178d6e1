"""What one warm decode call of the grouped MoE paths puts on the GPU, counted on CPU through the production host
path (``moe_forward`` of ``templates/sm100_moe`` and ``templates/sm90_moe``): each Triton kernel through the
stand-in hook of :mod:`nvgemm.templates.common.triton_stand_in` (recorded, not run), each grouped GEMM through
the ``launch`` the backend passes (recorded, not run), and every other torch op that would run on a GPU through
a ``TorchDispatchMode`` (allocations without a fill, views and metadata queries launch nothing).

Contract at decode (up to ``FUSED_FINALIZE_MAX_TOKENS`` tokens), per warm call: **3 launches** on both archs -- the one
Triton prep, GEMM1, GEMM2 with the top-k finalize in its last CTA per row block -- and no other device work
(no zero fill, no gather, no copy); on sm90 one token needs no prep (``direct``: the ids are the routing): 2.
Above the bound the finalize is its own launch (4)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import nvgemm.templates.common.triton_stand_in as TS
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.testing import NO_DEVICE_WORK


class _Recorder(TorchDispatchMode):
    def __init__(self, events):
        super().__init__()
        self.events = events

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_DEVICE_WORK:
            self.events.append(f"aten:{name}")
        return func(*args, **(kwargs or {}))


class _TritonStandIn:
    """``kernel[grid](...)`` records the kernel's name and runs nothing; its integer tensors are zeroed (unrecorded)
    so a host gather after it (the large-batch path) indexes in bounds."""

    def __init__(self, kernel, events):
        self.name, self.events = kernel.__name__, events

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.events.append(f"triton:{self.name}")
            with _disable_current_modes():
                for a in args:
                    if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dtype != torch.uint8:
                        a.zero_()
        return launch


@pytest.fixture
def recorded():
    events: list[str] = []
    saved = TS._FACTORY, TS._ARCH
    TS.install(lambda kernel, arch: _TritonStandIn(kernel, events), lambda: "stand-in")
    try:
        yield events
    finally:
        TS._FACTORY, TS._ARCH = saved


def _stack(g, e, rows, k):
    qs = [quantize_weight(torch.randn(rows, k, generator=g)) for _ in range(e)]
    return (torch.stack([q.packed for q in qs]), torch.stack([to_blocked(q.scale) for q in qs]),
            torch.stack([q.global_scale.reshape(()) for q in qs]))


def _operands(m, top_k, e=8, h=64, i=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w13, s13, g13 = _stack(g, e, 2 * i, h)
    w2, s2, g2 = _stack(g, e, h, i)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(m)]).to(torch.int32)
    wts = torch.rand(m, top_k, generator=g)
    return x, ids, wts, (w13, s13, g13), (w2, s2, g2)


def _warm_call(events, call):
    call()  # derives the stacked weights and tables once
    events.clear()
    with _Recorder(events):
        call()
    return list(events)


def _sm90_call(m, top_k, shared):
    from nvgemm.templates.sm90_moe.config import Sm90MoeConfig
    from nvgemm.templates.sm90_moe.launch import moe_forward

    x, ids, wts, (w13, s13, g13), (w2, s2, g2) = _operands(m, top_k)
    sh = torch.randn(x.shape).to(x.dtype) if shared else None
    c1 = Sm90MoeConfig(tile_m=8, tile_n=128, tile_k=128, num_warps=4, stages=3)
    c2 = Sm90MoeConfig(tile_m=8, tile_n=64, tile_k=128, num_warps=4, stages=3)

    def run(events):
        def launch(args):
            events.append("gemm2+finalize" if args.config.finalize else f"gemm:{args.spec.activation}")
        return moe_forward(x, ids, None, wts, w13, s13, g13, w2, s2, g2, "silu_mul", False, sh, sh, None, c1, c2,
                           launch)
    return run


def _sm100_call(m, top_k, shared):
    from nvgemm.templates.sm100_moe.config import Sm100MoeConfig
    from nvgemm.templates.sm100_moe.launch import moe_forward

    x, ids, wts, (w13, s13, g13), (w2, s2, g2) = _operands(m, top_k)
    i13 = torch.full((w13.shape[0],), 0.01)
    i2 = torch.full((w2.shape[0],), 0.02)
    sh = torch.randn(x.shape).to(x.dtype) if shared else None
    c = Sm100MoeConfig(tile_n=8)

    def run(events):
        def launch(args):
            events.append("gemm2+finalize" if args.config.finalize else
                          ("gemm:requant" if args.spec.out_quant else "gemm"))
        return moe_forward(x, ids, None, wts, w13, s13, g13, i13, w2, s2, g2, i2, "silu_mul", False, sh, sh, None,
                           c, c, launch)
    return run


CALLS = {"sm90": _sm90_call, "sm100": _sm100_call}
PREP = {"sm90": "triton:_prep_kernel", "sm100": "triton:_moe_prep_kernel"}
GEMM1 = {"sm90": "gemm:silu_mul", "sm100": "gemm:requant"}


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
@pytest.mark.parametrize("m,top_k,shared", [(1, 8, False), (1, 8, True), (2, 8, True), (1, 1, False)],
                         ids=["m1", "m1-shared-residual", "m2-shared-residual", "m1-top1"])
def test_decode_call_is_three_launches(recorded, arch, m, top_k, shared):
    run = CALLS[arch](m, top_k, shared)
    work = _warm_call(recorded, lambda: run(recorded))
    prep = [] if arch == "sm90" and m == 1 else [PREP[arch]]  # sm90, one token: the ids are the work list
    assert work == prep + [GEMM1[arch], "gemm2+finalize"], work


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_above_the_fused_bound_the_finalize_is_its_own_launch(recorded, arch):
    """More tokens than the fused finalize takes (its last CTA per row block finalizes them all alone)."""
    from nvgemm.templates.sm90_moe.config import FUSED_FINALIZE_MAX_TOKENS

    m = FUSED_FINALIZE_MAX_TOKENS + 1
    run = CALLS[arch](m, 8, False)
    work = _warm_call(recorded, lambda: run(recorded))
    gemm2 = "gemm" if arch == "sm100" else "gemm:none"
    assert work[-2:] == [gemm2, "triton:_finalize_kernel"], work
    assert "gemm2+finalize" not in work
