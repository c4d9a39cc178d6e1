"""The sm100 grouped-MoE prep Triton kernel (``nvgemm.templates.sm100_moe.prep_triton``) under the
interpreter: the same work list, codes, scale atoms and pair -> output-row map, byte for byte, as the
torch construction (:func:`nvgemm.templates.sm90_moe.launch.build_work_list`,
:func:`nvgemm.templates.sm100_moe.launch.slot_activations` -- itself checked against
``nvgemm.core.formats.quantize_activation`` per pair in ``tests/cpu/test_sm100_moe_host.py`` --,
:func:`~nvgemm.templates.sm100_moe.launch.slot_rows_of_pairs`), and GEMM2's scale atoms zeroed exactly
where GEMM1 does not write (:func:`~nvgemm.templates.sm100_moe.launch.b2_scale_atoms_ref`). Every output
buffer starts as 0xAB garbage (``torch.empty`` is patched), so a byte the kernel should write and
does not is caught."""

import pytest
import torch

from nvgemm.ops.moe import local_ids
from nvgemm.templates.sm100_moe import prep_triton
from nvgemm.core.formats import blocked_numel
from nvgemm.templates.sm100_moe.launch import b2_scale_atoms_ref, prepare_moe_stack, slot_activations, slot_rows_of_pairs
from nvgemm.templates.sm90_moe.launch import build_work_list

#: (M, top_k, E, H, I, tile_n, expert map): decode (fused: one launch) and above FUSED_MAX_PAIRS (two launches)
CASES = [(1, 8, 128, 256, 96, 8, False), (5, 2, 4, 96, 32, 8, False), (19, 1, 3, 512, 64, 16, True),
         (9, 4, 6, 160, 48, 64, False), (3, 8, 256, 128, 64, 128, True), (40, 4, 6, 96, 32, 16, True)]


@pytest.fixture
def garbage_empty(monkeypatch):
    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        t.view(-1).view(torch.uint8).fill_(0xAB) if t.numel() else None
        return t

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("m,k,e,h,i,tn,ep", CASES, ids=lambda v: str(v))
def test_moe_prep_triton_bit_exact(garbage_empty, m, k, e, h, i, tn, ep):
    g = torch.Generator().manual_seed(m * 13 + h + e)
    eg = 2 * e if ep else e
    ids = torch.randint(-1, eg, (m, k), generator=g, dtype=torch.int32)
    ids[0, 0] = 0  # at least one real pair
    emap = None
    if ep:
        emap = torch.full((eg,), -1, dtype=torch.int32)
        emap[torch.randperm(eg, generator=g)[:e]] = torch.arange(e, dtype=torch.int32)
        emap[0] = 0
    x = (torch.randn(m, h, generator=g) * 3).to(torch.bfloat16)
    x[0, :16] = 0  # an all-zero block
    ins = torch.rand(e, generator=g) * 0.01 + 1e-3
    # GEMM1's stacked weights to prefetch: the interpreter cannot run inline PTX, the launcher leaves the prefetch out
    st = prepare_moe_stack(torch.randint(0, 256, (e, 2 * i, h // 2), generator=g, dtype=torch.uint8),
                           torch.zeros(e, blocked_numel(2 * i, h // 16), dtype=torch.uint8), True)
    got = prep_triton.moe_prep_triton(x, ids, emap, e, ins, tn, i, w13=st.weight, w13_scale=st.scale)
    assert got.launches == (1 if m * k <= prep_triton.FUSED_MAX_PAIRS else 3)
    want = build_work_list(local_ids(ids, emap), e, tn)
    for f in ("rows", "tiles", "pos", "valid", "counts"):
        assert torch.equal(getattr(got.work_list, f), getattr(want, f)), f
    want_q, want_s = slot_activations(x, want, ins, tn)
    assert torch.equal(got.codes, want_q)
    assert torch.equal(got.scales.view(torch.uint8), want_s.view(torch.uint8))
    assert torch.equal(got.y_rows[want.valid], slot_rows_of_pairs(want, tn)[want.valid])
    if got.launches == 1:  # the fused finalize's table: the same rows, -1 for an empty slot
        want_fin = torch.where(want.valid, slot_rows_of_pairs(want, tn), -1).to(torch.int32).reshape(-1)
        assert torch.equal(got.finalize_rows, want_fin)
    else:
        assert got.finalize_rows is None
    ref = b2_scale_atoms_ref(want.slots, tn, i, "cpu")
    pad = ref == 0  # what GEMM1 does not write: zero; the rest is GEMM1's to write (garbage here)
    assert pad.any() == (tn < 128 or (i // 16) % 4 != 0)
    assert torch.equal(got.b2_scales[pad], ref[pad])
    assert (got.b2_scales[~pad] == 0xAB).all()
