"""``prefetch`` / ``prefetchu`` on hand-written PTX (PTX ISA "prefetch, prefetchu"): cache hints with no functional
effect, but the global L2 forms -- ``prefetch.global.L2``, ``prefetch.global.L2::evict_last`` / ``::evict_normal``
and ``prefetch.L2`` on a generic address that maps to global memory -- are recorded per launch in
``Launch.ext["l2_prefetch_lines"]`` (allocation -> 128-byte line indices; ``Launch.stats["l2_prefetches"]`` counts
them) for the lanes that execute them, and one outside every allocation is an error. L1, uniform-cache, local and tensormap prefetches and a generic prefetch of a
shared address (the ISA: no operation) record nothing; an eviction priority without ``.global`` is not PTX."""

from __future__ import annotations

import pytest
import torch

from nvgemm.emulator.ptx import EmulationError
from nvgemm.emulator.ptx.errors import UnknownOpcodeError
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

HEAD = """.version 8.7
.target sm_100a
.address_size 64
.shared .align 16 .b8 smem[256];
.visible .entry k(.param .u64 p_a, .param .u64 p_b, .param .u64 p_c)
{
.reg .pred %p<4>;
.reg .b32 %r<16>;
.reg .b64 %rd<16>;
    ld.param.u64 %rd1, [p_a]; ld.param.u64 %rd2, [p_b]; ld.param.u64 %rd3, [p_c];
    mov.u32 %r1, %tid.x; cvt.u64.u32 %rd4, %r1;
"""

# lane t: a + 64 t (lanes < 20 only), b + 128 t through a generic address, c + 256 t with evict_normal
# (its lanes 1 and 2 share a line with nobody: lines 0, 2, 4, ...), and the forms that record nothing
RECORD = HEAD + """
    setp.lt.u32 %p1, %r1, 20;
    shl.b64 %rd5, %rd4, 6; add.s64 %rd6, %rd1, %rd5;
    @%p1 prefetch.global.L2::evict_last [%rd6];
    shl.b64 %rd7, %rd4, 7; add.s64 %rd8, %rd2, %rd7;
    prefetch.L2 [%rd8];
    shl.b64 %rd9, %rd4, 8; add.s64 %rd10, %rd3, %rd9;
    prefetch.global.L2::evict_normal [%rd10];
    add.s64 %rd11, %rd10, 128;
    prefetch.global.L1 [%rd11];
    prefetchu.L1 [%rd11];
    prefetch.local.L2 [%rd11];
    prefetch.tensormap [%rd11];
    mov.u64 %rd12, smem; cvta.shared.u64 %rd13, %rd12;
    prefetch.L2 [%rd13];
    ret;
}
"""


def test_global_l2_prefetches_are_recorded_per_allocation_and_line():
    a = torch.zeros(4096, dtype=torch.uint8)
    b = torch.zeros(32 * 128, dtype=torch.uint8)
    c = torch.zeros(32 * 256, dtype=torch.uint8)
    launch = launch_ptx(RECORD, (1, 1, 1), (32, 1, 1), [a, b, c])
    names = {t.data_ptr(): f"tensor@{t.data_ptr():#x}" for t in (a, b, c)}
    got = launch.ext["l2_prefetch_lines"]
    want = {names[a.data_ptr()]: {64 * t // 128 for t in range(20)},  # the predicated lanes only
            names[b.data_ptr()]: set(range(32)),
            names[c.data_ptr()]: {2 * t for t in range(32)}}  # not the L1 / uniform / local / tensormap lines
    assert got == want
    assert launch.stats["l2_prefetches"] == 20 + 32 + 32  # one per executing lane


def test_a_prefetch_outside_every_allocation_is_an_error():
    # lane t prefetches a + 64 t: lanes 16.. are past a's end, inside host memory no tensor of the launch holds
    a = torch.zeros(4096, dtype=torch.uint8)[:1024]
    b = torch.zeros(128, dtype=torch.uint8)
    c = torch.zeros(128, dtype=torch.uint8)
    src = RECORD.replace("setp.lt.u32 %p1, %r1, 20;", "setp.lt.u32 %p1, %r1, 32;").replace(
        "prefetch.L2 [%rd8];", "").replace("prefetch.global.L2::evict_normal [%rd10];", "")
    with pytest.raises(EmulationError, match="L2 prefetch outside every allocation"):
        launch_ptx(src, (1, 1, 1), (32, 1, 1), [a, b, c], tensors=[])
    # the same program with every lane inside records lines 0..7 and nothing else
    ok = src.replace("setp.lt.u32 %p1, %r1, 32;", "setp.lt.u32 %p1, %r1, 16;")
    launch = launch_ptx(ok, (1, 1, 1), (32, 1, 1), [a, b, c])
    assert launch.ext["l2_prefetch_lines"] == {f"tensor@{a.data_ptr():#x}": set(range(8))}


@pytest.mark.parametrize("form", ["prefetch.L2::evict_last", "prefetch.shared.L2", "prefetch.global.L3",
                                  "prefetchu.L2", "prefetch.global.L2::evict_first"])
def test_forms_outside_the_isa_are_refused(form):
    src = HEAD + f"    {form} [%rd1];\n    ret;\n}}\n"
    with pytest.raises(UnknownOpcodeError):
        launch_ptx(src, (1, 1, 1), (32, 1, 1), [torch.zeros(128, dtype=torch.uint8)] * 3)


def test_prefetches_are_recorded_inside_a_pdl_stream():
    """A grid of a PDL stream (``nvgemm.emulator.ptx.pdl``) sees the stream's allocations through its grid view:
    the same record as a lone launch."""
    from nvgemm.emulator.ptx.pdl import StreamGrid, run_stream
    from nvgemm.emulator.runner import make_launch

    a = torch.zeros(4096, dtype=torch.uint8)
    b = torch.zeros(32 * 128, dtype=torch.uint8)
    c = torch.zeros(32 * 256, dtype=torch.uint8)
    launch = make_launch(RECORD, (1, 1, 1), (32, 1, 1), [a, b, c])
    run_stream([StreamGrid(launch, False, "prefetcher")], "early")
    got = launch.ext["l2_prefetch_lines"]
    assert got[f"tensor@{a.data_ptr():#x}"] == set(range(10)) and launch.stats["l2_prefetches"] == 84
