"""Split-K workspaces: one pair per (device, stream) for both families, bounded under CUDA-graph
capture on a stream no eager call used (issue 22 item 16). CPU: capture is simulated by the
pool's injectable ``capturing`` predicate; a real replay needs a GPU (see docs/kernels.md)."""

from __future__ import annotations

import torch

from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.templates.sm100_w4a4.launch import SplitKWorkspaces
from nvgemm.templates.sm90_w4a16 import launch as L90
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config
from nvgemm.templates.sm90_w4a16.operand import prepare_sm90_weight

SPLIT = Sm90W4A16Config("mma", tile_m=8, tile_n=128, tile_k=256, split_k=4, num_warps=4, stages=3)


def test_sm90_split_k_buffers_are_per_stream():
    q = quantize_weight(torch.randn(256, 1024))
    p = prepare_sm90_weight(q.packed, to_blocked(q.scale), q.global_scale.reshape(()))
    x = torch.randn(3, 1024).bfloat16()
    a1 = L90.prepare_sm90_args(x, p, None, None, None, "none", None, SPLIT, stream_id=0x111)
    a2 = L90.prepare_sm90_args(x, p, None, None, None, "none", None, SPLIT, stream_id=0x222)
    again = L90.prepare_sm90_args(x, p, None, None, None, "none", None, SPLIT, stream_id=0x111)
    assert a1.work.data_ptr() != a2.work.data_ptr() and a1.count.data_ptr() != a2.count.data_ptr()
    assert again.work is a1.work and again.count is a1.count
    assert a1.work.numel() >= L90.split_k_needs(SPLIT, 3, p, 256, False)[0] and not a1.count.any()


class _Cap:
    on = False

    def __call__(self):
        return self.on


def test_capture_on_a_fresh_stream_allocates_once_not_per_call():
    cap = _Cap()
    pool = SplitKWorkspaces(capturing=cap)
    dev = torch.device("cpu")
    pool.get(dev, 1000, 8, stream_id=1)  # eager warm-up on the default stream
    before = pool.held_bytes()
    cap.on = True
    got = [pool.get(dev, 1000, 8, stream_id=99) for _ in range(50)]  # torch.cuda.graph's own stream
    cap.on = False
    assert len({w.data_ptr() for w, _ in got}) == 1
    assert pool.held_bytes() - before == (1000 + 8) * 4
    # growing inside a capture is geometric: 20 ever-larger calls, a handful of pairs
    cap.on = True
    for i in range(20):
        pool.get(dev, 1000 + 100 * i, 8, stream_id=99)
    cap.on = False
    assert pool.held_bytes() - before <= 4 * (3000 + 16) * 4


def test_reused_capture_pair_records_a_counter_fill():
    """A later graph reusing the capture pair may replay before the graph that allocated (and
    zeroed) it: each captured use zeroes the counters itself."""
    cap = _Cap()
    pool = SplitKWorkspaces(capturing=cap)
    dev = torch.device("cpu")
    cap.on = True
    w, c = pool.get(dev, 64, 4, stream_id=5)
    c.fill_(7)  # what an unreplayed graph's pair may hold
    w2, c2 = pool.get(dev, 64, 4, stream_id=5)
    assert c2 is c and not c.any()
    cap.on = False
    e = pool.get(dev, 64, 4, stream_id=5)  # eager calls never get the capture pair
    assert e[1] is not c


def test_fake_pairs_stay_with_their_fake_mode():
    """Under a FakeTensorMode the pool hands out that mode's FakeTensors and keeps none itself: a second mode
    gets its own pair (a pair of the first mode in the second would fail its ops), a real call a real one."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from nvgemm.templates.common.workspace import SplitKWorkspaces

    pool = SplitKWorkspaces(capturing=lambda: False)
    got = []
    for _ in range(2):
        fm = FakeTensorMode()
        with fm:
            a = pool.get(torch.device("cpu"), 64, 8)
            assert pool.get(torch.device("cpu"), 32, 4) is a  # reused within the mode (a process's later steps)
            assert pool.get(torch.device("cpu"), 128, 8) is not a  # grown when it does not fit
        assert all(isinstance(t, FakeTensor) and t.fake_mode is fm for t in a)
        got.append(a)
        assert pool.pairs() == 0  # nothing fake in the pool
    assert got[0][0] is not got[1][0]
    w, c = pool.get(torch.device("cpu"), 64, 8)
    assert not isinstance(w, FakeTensor) and int(c.abs().sum()) == 0 and pool.pairs() == 1
