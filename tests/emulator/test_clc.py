"""Cluster launch control on the emulator against the PTX ISA (``clusterlaunchcontrol``, hand-written PTX, no
compile): a successful ``try_cancel`` takes a cluster that has not launched out of the launch queue (it never
runs) and returns its first ctaid, no two successful responses name the same cluster, and with nothing pending
the request fails. A persistent CTA that steals work must then compute every tile exactly once, whatever the
queue order and however many clusters are resident; mutations of the emulator (a canceled cluster left in the
queue, a wrong ctaid layout in the response) make these checks fail."""

from __future__ import annotations

import struct

import pytest
import torch

import nvgemm.emulator.isa.ops_clc as ops_clc
from nvgemm.emulator.isa.clc import decode_response, encode_response, response_words
from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.ptx import EmulationError
from nvgemm.emulator.ptx.schedule import LaunchQueue, Schedule
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator

# One warp per CTA. Lane 0 counts the CTA's current tile (count[tile] += 1, owner[tile] = the executing CTA's
# linear id), then asks for the next cluster; every lane waits for the response and decodes it. With a
# cluster of 2 (MULTICAST) rank 0 asks for the whole cluster and each CTA takes tile first.x + rank.
PTX = """.version 9.4
.target sm_100a
.address_size 64
.shared .align 16 .b8 resp[16];
.shared .align 8 .b8 bar[8];
.visible .entry steal(.param .u64 p_count, .param .u64 p_owner)
{
.reg .pred %p<8>;
.reg .b32 %r<32>;
.reg .b64 %rd<16>;
.reg .b128 %q<2>;
    ld.param.u64 %rd1, [p_count];
    ld.param.u64 %rd2, [p_owner];
    mov.u32 %r1, %laneid;
    mov.u32 %r20, %cluster_ctarank;
    setp.eq.u32 %p1, %r1, 0;
    setp.eq.u32 %p5, %r20, 0;
    and.pred %p5, %p5, %p1;
    mov.u32 %r2, bar;
    mov.u32 %r3, resp;
    @%p1 mbarrier.init.shared.b64 [%r2], 1;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ctaid.y;
    mov.u32 %r6, %nctaid.x;
    mad.lo.u32 %r12, %r5, %r6, %r4;
    mov.u32 %r7, 0;
LOOP:
    mad.lo.u32 %r10, %r5, %r6, %r4;
    mul.wide.u32 %rd3, %r10, 4;
    @!%p1 bra ASK;
    add.s64 %rd4, %rd1, %rd3;
    atom.global.add.u32 %r11, [%rd4], 1;
    add.s64 %rd5, %rd2, %rd3;
    st.global.u32 [%rd5], %r12;
ASK:
    @%p1 mbarrier.arrive.expect_tx.shared.b64 _, [%r2], 16;
    @%p5 clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.MCAST.b128 [%r3], [%r2];
    EARLY
WAIT:
    mbarrier.try_wait.parity.shared.b64 %p2, [%r2], %r7;
    @!%p2 bra WAIT;
    xor.b32 %r7, %r7, 1;
    ld.shared.v2.b64 {%rd6, %rd7}, [%r3];
    mov.b128 %q1, {%rd6, %rd7};
    clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 %p3, %q1;
    clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128 {%r4, %r5, %r13, _}, %q1;
    add.u32 %r4, %r4, %r20;
    barrier.cluster.arrive.aligned;
    barrier.cluster.wait.aligned;
    NEXT
    ret;
}
"""


def _ptx(multicast=False, next_="@%p3 bra LOOP;", early=""):
    mc = ".multicast::cluster::all" if multicast else ""
    return PTX.replace(".MCAST", mc).replace("NEXT", next_).replace("EARLY", early)


def _run(grid, schedule, multicast=False, preferred=None, **kw):
    tiles = grid[0] * grid[1]
    count = torch.zeros(tiles, dtype=torch.int32)
    owner = torch.full((tiles,), -1, dtype=torch.int32)
    launch = launch_ptx(_ptx(multicast, **kw), grid, (32, 1, 1), [count, owner],
                        cluster=(2, 1, 1) if multicast else (1, 1, 1), order=schedule, preferred_cluster=preferred)
    return count, owner, launch


SCHEDULES = [Schedule("forward"), Schedule("reverse"), Schedule(3, resident=2), Schedule(11, resident=3),
             Schedule("forward", resident=64)]


# ------------------------------------------------------------------------------------------ response encoding


@pytest.mark.parametrize("ctaid", [(0, 0, 0), (5, 3, 1), (2**31 - 1, 65535, 65535), None])
def test_response_round_trip_through_b128_halves(ctaid):
    raw = encode_response(ctaid)
    assert len(raw) == 16
    lo, hi = struct.unpack("<2Q", raw)  # ld.shared.v2.b64 {lo, hi} then mov.b128 q, {lo, hi}
    ok, first = decode_response(response_words(lo, hi))
    assert ok is (ctaid is not None)
    if ctaid is not None:
        assert first == ctaid
    else:  # undefined in the ISA: far out of range here, so a kernel that uses it goes out of bounds
        assert min(first) == 0xFFFFFFFF


def test_query_of_bytes_that_are_no_response_is_an_error():
    with pytest.raises(IsaError, match="not a try_cancel response"):
        decode_response(response_words(0, 0))


# ------------------------------------------------------------------------------------------ stealing


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
def test_every_tile_is_computed_exactly_once(schedule):
    grid = (4, 2, 1)
    count, owner, launch = _run(grid, schedule)
    assert count.tolist() == [1] * 8
    assert launch.stats["clusters_launched"] + launch.stats["clusters_canceled"] == 8
    if schedule.resident == 1:  # serial: the first cluster steals every other one
        assert launch.stats["clusters_launched"] == 1 and len(set(owner.tolist())) == 1
    if schedule.resident >= 8:  # the whole grid resident: every request fails, each CTA does its own tile
        assert launch.stats["clusters_canceled"] == 0 and owner.tolist() == list(range(8))
    if schedule.resident == 2:
        assert launch.stats["clusters_canceled"] > 0 and launch.stats["clusters_launched"] >= 2


@pytest.mark.parametrize("schedule", [Schedule("forward"), Schedule(5, resident=2)], ids=str)
def test_multicast_response_reaches_every_cta_of_the_cluster(schedule):
    count, owner, launch = _run((8, 2, 1), schedule, multicast=True)
    assert count.tolist() == [1] * 16
    assert launch.stats["clusters_launched"] + launch.stats["clusters_canceled"] == 8


@pytest.mark.parametrize("schedule", [Schedule("forward", preferred="all"), Schedule("reverse", 2, "none"),
                                      Schedule(4, 3, preferred=1), Schedule(9, 64, preferred=2)], ids=str)
def test_preferred_and_fallback_clusters_mixed_in_one_grid(schedule):
    """Preferred clusters of 4 CTAs and fallback clusters of 2 (cudaLaunchAttributePreferredClusterDimension):
    each CTA's %cluster_ctarank is its rank in its own cluster; a try_cancel cancels a cluster of the
    requester's own shape (the emulator's choice where the ISA is silent: see ptx/schedule.py)."""
    count, _, launch = _run((8, 2, 1), schedule, multicast=True, preferred=(4, 1, 1))
    assert count.tolist() == [1] * 16
    shapes = [u[1] for u in launch.ext["launch_queue"].launched + launch.ext["launch_queue"].canceled]
    assert sum(s[0] for s in shapes) == 16
    if schedule.preferred in ("all", "none"):
        assert set(shapes) == {(4, 1, 1) if schedule.preferred == "all" else (2, 1, 1)}
    else:
        assert set(shapes) == {(4, 1, 1), (2, 1, 1)}  # these seeds mix both shapes


def test_mutation_cancel_ignoring_the_cluster_shape_loses_tiles(monkeypatch):
    orig = LaunchQueue.cancel
    monkeypatch.setattr(LaunchQueue, "cancel", lambda self, shape=None: orig(self))
    count, _, _ = _run((8, 2, 1), Schedule(4, 3, preferred=1), multicast=True, preferred=(4, 1, 1))
    assert count.tolist() != [1] * 16  # a 2-CTA cluster took a 4-CTA cluster's work: two tiles never computed


def test_preferred_shape_must_tile_the_grid():
    with pytest.raises(EmulationError, match="preferred cluster shape"):
        _run((6, 2, 1), Schedule("forward"), multicast=True, preferred=(4, 1, 1))


def test_ignoring_a_failed_response_is_caught():
    with pytest.raises(EmulationError, match="out-of-bounds global access"):  # the undefined ctaid, used
        _run((4, 2, 1), Schedule("forward"), next_="bra LOOP;")


def test_try_cancel_after_an_observed_failure_is_an_error():
    with pytest.raises(EmulationError, match="already observed a failed request"):
        _run((4, 2, 1), Schedule("forward"), next_="@%p3 bra LOOP;\n    bra ASK;")


def test_reading_the_response_before_the_mbarrier_wait_is_an_error():
    early = "ld.shared.v2.b64 {%rd8, %rd9}, [%r3];"
    with pytest.raises(EmulationError, match="still in flight"):
        _run((4, 2, 1), Schedule("forward"), early=early)


# ------------------------------------------------------------------------------------------ mutations


def test_mutation_canceled_cluster_left_in_the_queue_fails_the_check(monkeypatch):
    def leaky_cancel(self, shape=None):  # hands out pending clusters but does not take them out of the queue
        i = getattr(self, "_cursor", 0)
        if i >= len(self.pending):
            return None
        self._cursor = i + 1
        return self.pending[i][0]

    monkeypatch.setattr(LaunchQueue, "cancel", leaky_cancel)
    count, _, _ = _run((4, 2, 1), Schedule("forward"))
    assert count.tolist() != [1] * 8 and int(count.max()) == 2


def test_mutation_wrong_ctaid_layout_fails_the_checks(monkeypatch):
    def swapped(first):  # x and y exchanged in the response
        return encode_response(None if first is None else (first[1], first[0], first[2]))

    lo, hi = struct.unpack("<2Q", swapped((3, 1, 0)))
    assert decode_response(response_words(lo, hi))[1] != (3, 1, 0)  # the round trip sees it
    monkeypatch.setattr(ops_clc, "encode_response", swapped)
    with pytest.raises(EmulationError, match="out-of-bounds global access"):  # stolen (2, 0) counted as (0, 2)
        _run((4, 2, 1), Schedule("forward"))


def test_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="resident"):
        Schedule("forward", resident=0)
    with pytest.raises(ValueError, match="order"):
        Schedule("sideways")


QUERY = """.version 9.4
.target sm_100a
.address_size 64
.shared .align 16 .b8 resp[16];
.shared .align 8 .b8 bar[8];
.visible .entry q(.param .u64 p_out)
{
.reg .pred %p<4>;
.reg .b32 %r<16>;
.reg .b64 %rd<16>;
.reg .b128 %q<3>;
    ld.param.u64 %rd1, [p_out];
    mov.u32 %r1, %laneid;
    setp.eq.u32 %p1, %r1, 0;
    mov.u32 %r2, bar;
    mov.u32 %r3, resp;
    @%p1 mbarrier.init.shared.b64 [%r2], 1;
    bar.sync 0;
    @%p1 mbarrier.arrive.expect_tx.shared.b64 _, [%r2], 16;
    @%p1 clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128 [%r3], [%r2];
WAIT:
    mbarrier.try_wait.parity.shared.b64 %p2, [%r2], 0;
    @!%p2 bra WAIT;
    ld.shared.v2.b64 {%rd2, %rd3}, [%r3];
    mov.b128 %q1, {%rd2, %rd3};
    mov.b128 %q2, %q1;
    mov.b128 {%rd4, %rd5}, %q2;
    clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 %p3, %q2;
    selp.u32 %r4, 1, 0, %p3;
    clusterlaunchcontrol.query_cancel.get_first_ctaid::x.b32.b128 %r5, %q2;
    clusterlaunchcontrol.query_cancel.get_first_ctaid::y.b32.b128 %r6, %q2;
    clusterlaunchcontrol.query_cancel.get_first_ctaid::z.b32.b128 %r7, %q2;
    @!%p1 bra DONE;
    mov.u32 %r8, %ctaid.x;
    mov.u32 %r9, %ctaid.y;
    mov.u32 %r10, %ctaid.z;
    mov.u32 %r11, %nctaid.x;
    mov.u32 %r12, %nctaid.y;
    mad.lo.u32 %r13, %r10, %r12, %r9;
    mad.lo.u32 %r13, %r13, %r11, %r8;
    mul.wide.u32 %rd6, %r13, 48;
    add.s64 %rd7, %rd1, %rd6;
    st.global.v2.b64 [%rd7], {%rd2, %rd3};
    st.global.v2.b64 [%rd7+16], {%rd4, %rd5};
    st.global.v4.b32 [%rd7+32], {%r4, %r5, %r6, %r7};
DONE:
    ret;
}
"""


def test_b128_moves_and_the_scalar_queries():
    """Each CTA asks once. Serially in reverse order the first cluster to run, (1, 2, 1), cancels the next
    pending one, (0, 2, 1), which never runs; then (1, 1, 1) launches and cancels (0, 1, 1), and so on."""
    grid = (2, 3, 2)
    out = torch.zeros(12, 12, dtype=torch.int32)
    launch = launch_ptx(QUERY, grid, (32, 1, 1), [out], order=Schedule("reverse"))
    origins = [(x, y, z) for z in range(2) for y in range(3) for x in range(2)][::-1]  # launch order
    ran = [o for i, o in enumerate(origins) if i % 2 == 0]  # every other one is canceled by its predecessor
    assert launch.stats["clusters_launched"] == 6 and launch.stats["clusters_canceled"] == 6
    for i, o in enumerate(ran):
        row = out[(o[2] * 3 + o[1]) * 2 + o[0]]
        assert torch.equal(row[0:4], row[4:8])  # pack, copy, unpack: the same 16 bytes
        assert row[0:4].numpy().tobytes() == encode_response(origins[2 * i + 1])
        assert row[8:12].tolist() == [1, *origins[2 * i + 1]]
    assert out[[(o[2] * 3 + o[1]) * 2 + o[0] for o in origins[1::2]]].abs().sum() == 0  # canceled: never ran
