"""The emulator's record of L2 prefetches (``Launch.ext["l2_prefetch_lines"]``: allocation -> 128-byte lines)
for the bulk forms (hand-written PTX, no compile): a ``cp.async.bulk.prefetch.tensor`` names the lines of its
box (tensor map + coordinates, PTX ISA "Tensor copy") whether it is issued before or after the warp's
``griddepcontrol.wait`` -- only the one before the wait also enters the PDL record -- and
``cp.async.bulk.prefetch.L2.global [a], n`` names the lines of bytes [a, a + n)."""

from __future__ import annotations

import pytest
import torch

from nvgemm.emulator.isa.tma import box_addresses, decode_tensor_map
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

ROWS, ROW_BYTES = 64, 256  # a [64, 256] uint8 tensor: 2 lines per row

# one warp; lane 0 prefetches box (c0, c1) before the wait, box (c2, c3) after it, then bytes [p + off, + n)
PTX = """.version 9.4
.target sm_100a
.address_size 64
.visible .entry pf(.param .align 64 .b8 tmap[128], .param .u32 c0, .param .u32 c1, .param .u32 c2,
                   .param .u32 c3, .param .u64 p, .param .u32 off, .param .u32 n)
{
.reg .pred %p<2>;
.reg .b32 %r<16>;
.reg .b64 %rd<8>;
    mov.u64 %rd1, tmap;
    cvta.param.u64 %rd2, %rd1;
    ld.param.u32 %r1, [c0];
    ld.param.u32 %r2, [c1];
    ld.param.u32 %r3, [c2];
    ld.param.u32 %r4, [c3];
    ld.param.u64 %rd3, [p];
    ld.param.u32 %r5, [off];
    ld.param.u32 %r6, [n];
    cvt.u64.u32 %rd4, %r5;
    add.s64 %rd5, %rd3, %rd4;
    mov.u32 %r7, %laneid;
    setp.eq.u32 %p1, %r7, 0;
    @%p1 cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%rd2, {%r1, %r2}];
    griddepcontrol.wait;
    @%p1 cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%rd2, {%r3, %r4}];
    @%p1 cp.async.bulk.prefetch.L2.global [%rd5], %r6;
    ret;
}"""


def _map(base, box_cols, box_rows):
    """A 2-D uint8 tensor map over [ROWS, ROW_BYTES] (no swizzle), box [box_rows, box_cols]."""
    q = [0] * 8
    q[0] = base
    q[1] = 0b0010 | (1 << 4) | (0 << 7) | (0x4 << 16) | ((ROW_BYTES >> 4) << 32)
    q[4] = (ROW_BYTES - 1) | ((ROWS - 1) << 32)
    q[6] = (box_cols - 1) << 56
    q[7] = box_rows - 1
    return b"".join(int(w).to_bytes(8, "little") for w in q) + bytes(64)


def _lines(rows, cols):
    return {(r * ROW_BYTES + c) // 128 for r in rows for c in cols}


@pytest.mark.parametrize("pre,post", [((0, 0), (128, 40)), ((128, 8), (0, 60))], ids=["a", "b"])
def test_bulk_prefetches_record_their_lines_before_and_after_the_wait(pre, post):
    t = torch.zeros(ROWS, ROW_BYTES, dtype=torch.uint8)
    other = torch.zeros(4096, dtype=torch.uint8)
    raw = _map(t.data_ptr(), 128, 8)  # box: 8 rows x 128 bytes (one line per row)
    off, n = 200, 300  # bytes [200, 500) of `other`: lines 1..3
    launch = launch_ptx(PTX, (1, 1, 1), (32, 1, 1), [raw, pre[0], pre[1], post[0], post[1], other, off, n],
                        tensors=[t])
    name_t, name_o = f"tensor@{t.data_ptr():#x}", f"tensor@{other.data_ptr():#x}"
    rec = launch.ext["l2_prefetch_lines"]
    want = _lines(range(pre[1], pre[1] + 8), range(pre[0], pre[0] + 128)) | \
        _lines(range(post[1], min(post[1] + 8, ROWS)), range(post[0], post[0] + 128))
    assert rec[name_t] == want
    assert rec[name_o] == {off // 128, 2, (off + n - 1) // 128}
    # the decoder's own box addresses agree (the record is theirs, not a re-derivation)
    tm = decode_tensor_map(raw)
    assert {int(a - t.data_ptr()) // 128 for a in box_addresses(tm, list(post))} <= rec[name_t]
    # the PDL record keeps the pre-wait tensor prefetch only
    assert launch.ext["pdl_pre_wait_prefetches"] == {name_t}
    assert launch.ext["l2_prefetch_boxes"] == [((0, 0, 0), t.data_ptr(), pre), ((0, 0, 0), t.data_ptr(), post)]
    assert set(rec) == {name_t, name_o}


def test_post_wait_tensor_prefetch_alone_is_recorded():
    """A box whose lines the pre-wait box does not cover shows up only through the post-wait record."""
    t = torch.zeros(ROWS, ROW_BYTES, dtype=torch.uint8)
    other = torch.zeros(256, dtype=torch.uint8)
    launch = launch_ptx(PTX, (1, 1, 1), (32, 1, 1), [_map(t.data_ptr(), 128, 8), 0, 0, 128, 56, other, 0, 0],
                        tensors=[t])
    rec = launch.ext["l2_prefetch_lines"][f"tensor@{t.data_ptr():#x}"]
    post = _lines(range(56, 64), range(128, 256))
    assert post <= rec and rec - post == _lines(range(0, 8), range(0, 128))
