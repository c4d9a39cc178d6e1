"""The sm100 grouped-MoE activation prep Triton kernel (``nvgemm.templates.sm100_moe.prep_triton``)
under the interpreter: the same codes and scale atoms, byte for byte, as the torch construction
(:func:`nvgemm.templates.sm100_moe.launch.slot_activations`, itself checked against
``nvgemm.core.formats.quantize_activation`` per pair in ``tests/cpu/test_sm100_moe_host.py``)."""

import pytest
import torch

from nvgemm.templates.sm100_moe.launch import slot_activations, slot_rows_of_pairs
from nvgemm.templates.sm100_moe.prep_triton import slot_activations_triton
from nvgemm.templates.sm90_moe.launch import build_work_list


@pytest.mark.parametrize("m,k,e,h,tn,dt", [(5, 2, 4, 96, 8, torch.bfloat16), (19, 1, 3, 512, 16, torch.float16),
                                           (9, 4, 6, 160, 64, torch.bfloat16)])
def test_slot_prep_triton_bit_exact(m, k, e, h, tn, dt):
    g = torch.Generator().manual_seed(m * 13 + h)
    ids = torch.randint(-1, e, (m, k), generator=g)
    wl = build_work_list(ids, e, tn)
    x = (torch.randn(m, h, generator=g) * 3).to(dt)
    x[0, :16] = 0  # an all-zero block
    ins = torch.rand(e, generator=g) * 0.01 + 1e-3
    got_q, got_s, rop = slot_activations_triton(x, wl, ins, tn)
    want_q, want_s = slot_activations(x, wl, ins, tn)
    assert torch.equal(rop[wl.pos][wl.valid], slot_rows_of_pairs(wl, tn)[wl.valid])
    assert torch.equal(got_q, want_q)
    assert torch.equal(got_s.view(torch.uint8), want_s.view(torch.uint8))
