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


def test_the_layer_prefetches_its_stacked_gemm1_weights():
    """``moe_forward`` (the production host path) with the prep running from its sm_100a PTX (the emulator's Triton
    stand-in, as ``nvgemm.emulator.enable`` installs it) hands the prep GEMM1's stacked operand -- the memoized
    ``cached_moe_stack`` the GEMMs read -- and the prep prefetches exactly its selected experts' blocks (the
    grouped GEMMs are recorded here, not run)."""
    import nvgemm.templates.common.triton_stand_in as TS
    from nvgemm.core.formats import to_blocked
    from nvgemm.emulator.triton_ptx import EmuTritonKernel
    from nvgemm.templates.sm100_moe.config import Sm100MoeConfig
    from nvgemm.templates.sm100_moe.launch import cached_moe_stack, moe_forward

    e, h, i = 8, 256, 64
    g = torch.Generator().manual_seed(3)
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), generator=g, dtype=torch.uint8)
    s13 = torch.stack([to_blocked(torch.full((2 * i, h // 16), 0x30 + x, dtype=torch.uint8)
                                    .view(torch.float8_e4m3fn)) for x in range(e)])
    w2 = torch.randint(0, 256, (e, h, i // 2), generator=g, dtype=torch.uint8)
    s2 = torch.stack([to_blocked(torch.full((h, i // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn))
                      for _ in range(e)])
    x = torch.randn(1, h, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[5, -1, 0, 7]], dtype=torch.int32)
    wts = torch.rand(1, 4, generator=g)
    ones = torch.ones(e)
    made, gemms = [], []

    def factory(kernel, arch):
        made.append(EmuTritonKernel(kernel, arch))
        return made[-1]

    saved = TS._FACTORY, TS._ARCH
    TS.install(factory, lambda: "sm_100a")
    try:
        moe_forward(x, ids, None, wts, w13, s13, ones, ones, w2, s2, ones, ones, "silu_mul", False, None, None, None,
                    Sm100MoeConfig(tile_n=8), Sm100MoeConfig(tile_n=8), gemms.append)
    finally:
        TS._FACTORY, TS._ARCH = saved
    assert [k.fn.__name__ for k in made] == ["_moe_prep_kernel"] and len(gemms) == 2
    C.check_w13_prefetch(made[0].last, ids, None, cached_moe_stack(w13, s13, True), h)
