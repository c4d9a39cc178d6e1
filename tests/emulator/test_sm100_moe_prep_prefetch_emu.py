"""The sm100 MoE prep kernel's L2 prefetch of GEMM1's weights, from its real sm_100a PTX on the emulator.

At decode the prep (one launch) also prefetches, for every expert the routing selects, that expert's block of
GEMM1's stacked A operand -- its packed E2M1 weight rows and their swizzled e4m3 scales -- so the DRAM stream
runs during GEMM1's launch gap. The emulator records every ``prefetch.global.L2`` line per allocation
(``Launch.ext["l2_prefetch_lines"]``) and counts them (``Launch.stats["l2_prefetches"]``); these tests require
exactly the lines of the selected experts' blocks, computed from the ids (``-1`` and unmapped ids select nothing),
each line once (an expert with several work slots is prefetched by its first slot's programs only), nothing
else, and the prep's outputs bit-exact as without the prefetch (``_triton_emu_cases.check_w13_prefetch``,
``sm100_slot_prep_case``)."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from nvgemm.templates.triton._common import is_interpreted  # noqa: E402
from nvgemm.templates.sm100_moe.prep_triton import _moe_prep_kernel  # noqa: E402

if is_interpreted(_moe_prep_kernel):
    pytest.skip("kernels were defined under TRITON_INTERPRET=1; PTX needs the compiler", allow_module_level=True)

import _triton_emu_cases as C  # noqa: E402

pytestmark = pytest.mark.emulator


def test_one_token_top8_with_empty_and_unmapped_slots():
    """Qwen3-style decode: one token, top-8 over 32 global experts of which the 16 even ones are local
    (``expert_map``): one ``-1`` slot, two ids mapped to ``-1``, five local experts. 2I = 384 rows (whole
    128-row tiles) and H = 256 (2 K-tile programs per slot): 384 weight lines per expert, 192 per program (two
    loop steps, the second partial), 48 scale lines per expert."""
    emap = torch.where(torch.arange(32) % 2 == 0, torch.arange(32) // 2, -1).to(torch.int32)
    ids = torch.tensor([[0, -1, 3, 6, 10, 20, 31, 14]], dtype=torch.int32)  # local: 0, -, -, 3, 5, 10, -, 7
    C.sm100_slot_prep_case(1, 8, 16, 256, 8, i=192, ids=ids, emap=emap).run("sm_100a")


def test_an_expert_with_two_work_slots_is_prefetched_once():
    """Five tokens, top-4 over 6 experts, tile_n 8: expert 2 gets 10 pairs (two work slots), one expert none, two
    ``-1`` slots; 2I = 192 rows padded to 256 per expert (the padding rows are GEMM1's A rows too)."""
    from nvgemm.ops.moe import local_ids
    from nvgemm.templates.sm90_moe.launch import build_work_list

    ids = torch.tensor([[2, 2, 0, -1], [2, 2, 5, 1], [2, 2, 0, 3], [2, 2, 5, -1], [2, 2, 1, 0]], dtype=torch.int32)
    tiles = build_work_list(local_ids(ids, None), 6, 8).tiles.view(-1, 4)
    assert tiles[tiles[:, 2] > 0, 0].tolist() == [0, 1, 2, 2, 3, 5]  # expert 2: two slots; expert 4: none
    C.sm100_slot_prep_case(5, 4, 6, 256, 8, i=96, ids=ids).run("sm_100a")
