"""The shared::cluster address model against the PTX ISA (hand-written PTX, no compile): the shared::cta window
of CTA ``rank`` lies inside the shared::cluster window at ``rank << 24`` (so a CTA's own shared addresses carry
its rank in bits 24+, as CuTe's 2-CTA kernels assume when they clear bit 24 to reach the pair leader's
mbarrier), ``mapa`` swaps the rank bits, ``cvta`` round-trips, and a ``.shared::cta`` access naming another
CTA is an error."""

from __future__ import annotations

import pytest
import torch

import nvgemm.emulator.isa.ops_sm100  # noqa: F401 -- registers barrier.cluster
from nvgemm.emulator.ptx import EmulationError
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

PTX = """.version 9.4
.target sm_100a
.address_size 64
.shared .align 16 .b8 buf[64];
.visible .entry k(.param .u64 p_out)
{
.reg .pred %p<4>;
.reg .b32 %r<32>;
.reg .b64 %rd<16>;
    ld.param.u64 %rd1, [p_out];
    mov.u32 %r1, %cluster_ctarank;
    mov.u32 %r2, buf;
    add.u32 %r3, %r1, 100;
    st.shared.b32 [%r2], %r3;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    and.b32 %r4, %r2, -16777217;            // 0xFEFFFFFF: the pair leader's copy of buf
    ld.shared::cluster.b32 %r5, [%r4];
    xor.b32 %r6, %r1, 1;
    mapa.shared::cluster.u32 %r7, %r2, %r6;  // the peer's copy of buf
    ld.shared::cluster.b32 %r8, [%r7];
    cvta.shared.u64 %rd2, %r2;
    cvta.to.shared.u64 %rd3, %rd2;
    cvt.u32.u64 %r9, %rd3;
    ld.shared.b32 %r10, [%r9];
    PEER
    mov.u32 %r11, %laneid;
    setp.ne.u32 %p1, %r11, 0;
    @%p1 bra DONE;
    mul.wide.u32 %rd4, %r1, 32;
    add.s64 %rd5, %rd1, %rd4;
    st.global.v4.b32 [%rd5], {%r2, %r5, %r7, %r8};
    st.global.v4.b32 [%rd5+16], {%r9, %r10, %r1, %r1};
DONE:
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    ret;
}
"""


def test_cta_shared_window_carries_its_cluster_rank():
    out = torch.zeros(2, 8, dtype=torch.int32)
    launch_ptx(PTX.replace("PEER", ""), (2, 1, 1), (32, 1, 1), [out], cluster=(2, 1, 1))
    o = out.to(torch.int64) & 0xFFFFFFFF
    for rank in (0, 1):
        addr, leader, peer_addr, peer, back, own, r, _ = (int(x) for x in o[rank])
        assert r == rank
        assert addr >> 24 == rank and addr & 0xFFFFFF == int(o[0, 0]) & 0xFFFFFF  # same offset, rank in bits 24+
        assert leader == 100  # bit 24 cleared: CTA 0's buf from either CTA
        assert peer_addr == ((rank ^ 1) << 24) | (addr & 0xFFFFFF) and peer == 100 + (rank ^ 1)
        assert back == addr and own == 100 + rank  # cvta round trip stays in the own window


def test_shared_cta_access_naming_the_peer_is_an_error():
    bad = PTX.replace("PEER", "ld.shared.b32 %r12, [%r7];")
    with pytest.raises(EmulationError, match=r"\.shared access to 0x[0-9a-f]+ names CTA rank \d, not the executing"):
        launch_ptx(bad, (2, 1, 1), (32, 1, 1), [torch.zeros(16, dtype=torch.int32)], cluster=(2, 1, 1))
