"""The emulator's mbarrier object (nvgemm.emulator.isa.mbarrier) on the ISA's phase rules (PTX ISA 9.7.13.15):
a phase completes when the pending arrivals AND the tx-count are both zero; try_wait.parity p is true once
the phase of parity p has completed."""

from __future__ import annotations

import pytest

from nvgemm.emulator.isa.errors import IsaError
from nvgemm.emulator.isa.mbarrier import Mbarrier


def test_tma_pipeline_phase_needs_arrival_and_bytes():
    bar = Mbarrier("full[0]")
    bar.init(1)
    assert not bar.try_wait_parity(0) and bar.try_wait_parity(1)  # phase 0 running; "phase -1" counts as done
    assert bar.arrive_expect_tx(2 * 4096) == 0  # producer: arrive + expect the two boxes' bytes
    assert bar.pending == 0 and bar.tx == 8192 and not bar.try_wait_parity(0)
    assert not bar.complete_tx(4096)
    assert bar.complete_tx(4096)  # last bytes land: phase 0 completes
    assert bar.try_wait_parity(0) and not bar.try_wait_parity(1)
    assert (bar.phase, bar.pending, bar.tx) == (1, 1, 0)


def test_bytes_may_land_before_the_expect_tx():
    bar = Mbarrier()
    bar.init(1)
    assert not bar.complete_tx(1024)  # tx-count goes negative: allowed (range +-(2**20 - 1))
    assert bar.tx == -1024 and not bar.try_wait_parity(0)
    bar.arrive_expect_tx(1024)
    assert bar.try_wait_parity(0)


def test_multi_arrival_consumer_barrier_and_tokens():
    bar = Mbarrier("empty[1]")
    bar.init(4)
    tokens = [bar.arrive() for _ in range(3)]
    assert tokens == [0, 0, 0] and not bar.test_wait(0)
    assert bar.arrive() == 0 and bar.test_wait(0)
    assert bar.arrive(2) == 1 and not bar.try_wait_parity(1)
    bar.arrive(2)
    assert bar.try_wait_parity(1) and bar.phase == 2 and bar.parity == 0
    with pytest.raises(IsaError, match="neither the current"):
        bar.test_wait(0)


def test_arrive_drop_lowers_later_phases():
    bar = Mbarrier()
    bar.init(3)
    bar.arrive_drop()
    bar.arrive(2)
    assert bar.phase == 1 and bar.pending == 2


def test_undefined_behaviour_is_an_error():
    bar = Mbarrier("smem 0x40")
    with pytest.raises(IsaError, match="smem 0x40: the mbarrier is not initialized"):
        bar.arrive()
    with pytest.raises(IsaError, match="outside"):
        bar.init(0)
    bar.init(2)
    with pytest.raises(IsaError, match="already initialized"):
        bar.init(2)
    with pytest.raises(IsaError, match="only 2 pending"):
        bar.arrive(3)
    with pytest.raises(IsaError, match="parity 2"):
        bar.try_wait_parity(2)
    with pytest.raises(IsaError, match="tx-count would become"):
        bar.expect_tx((1 << 20) - 1)
        bar.expect_tx(1)
    bar.inval()
    with pytest.raises(IsaError, match="not initialized"):
        bar.try_wait_parity(0)
