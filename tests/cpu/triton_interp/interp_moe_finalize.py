"""The MoE finalize Triton kernel (``nvgemm.templates.sm90_moe.finalize_triton``) under the
interpreter: bit-identical to the torch finalize (the numerics contract's step 5) with and without
shared_out / residual, empty slots, all output dtypes."""

import pytest
import torch

from nvgemm.templates.sm90_moe.finalize_triton import finalize_triton
from nvgemm.templates.sm90_moe.launch import build_work_list, finalize_ref


@pytest.mark.parametrize("m,k,h,extras,odt", [(3, 2, 40, False, torch.bfloat16), (5, 4, 1100, True, torch.float16),
                                              (2, 1, 64, True, torch.float32)])
def test_finalize_triton_bit_exact(m, k, h, extras, odt):
    g = torch.Generator().manual_seed(m * 31 + h)
    local = torch.randint(-1, 6, (m, k), generator=g)
    wl = build_work_list(local, 6, 8)
    y = torch.randn(m * k, h, generator=g) * 100
    w = torch.rand(m, k, generator=g)
    sh = torch.randn(m, h, generator=g).to(odt) if extras else None
    res = torch.randn(m, h, generator=g).to(torch.float32 if odt == torch.float32 else odt) if extras else None
    got = finalize_triton(y, wl.pos, wl.valid, w, sh, res, odt)
    want = finalize_ref(y, wl, w, sh, res, odt)
    assert torch.equal(got, want)


@pytest.mark.parametrize("m,k,e,tm,ep", [(1, 8, 256, 8, False), (5, 2, 4, 8, False), (33, 4, 8, 16, True),
                                         (64, 8, 128, 8, False), (7, 1, 3, 32, True)])
def test_prep_triton_equals_torch_work_list(m, k, e, tm, ep):
    """The one-launch prep == the torch construction (itself checked against a plain-Python one in
    tests/cpu/test_sm90_moe_worklist.py), with and without an expert map."""
    from nvgemm.ops.moe import local_ids
    from nvgemm.templates.sm90_moe.prep_triton import build_work_list_triton

    g = torch.Generator().manual_seed(m * 7 + e)
    eg = 2 * e if ep else e
    ids = torch.randint(-1, eg, (m, k), generator=g, dtype=torch.int32)
    emap = None
    if ep:
        emap = torch.full((eg,), -1, dtype=torch.int32)
        emap[torch.randperm(eg, generator=g)[:e]] = torch.arange(e, dtype=torch.int32)
    want = build_work_list(local_ids(ids, emap), e, tm)
    got = build_work_list_triton(ids, emap, e, tm)
    for f in ("rows", "tiles", "pos", "valid", "counts", "y_rows"):
        assert torch.equal(getattr(got, f), getattr(want, f)), f
