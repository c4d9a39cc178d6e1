"""The ``mbarrier`` object (sm_90+), as a pure state machine written from the PTX ISA 9.7.13.15
("Parallel Synchronization and Communication Instructions: mbarrier").

State: the current phase (its parity is ``phase & 1``), the pending arrival count, the expected arrival
count, and the tx-count. ``init(count)``: phase 0, expected = pending = count, tx-count 0. An arrive-on
decrements the pending count; expect-tx adds to the tx-count, complete-tx subtracts from it; the current
phase completes when **both** the pending count and the tx-count are zero, and then, atomically, the phase
advances and the pending count is reloaded with the expected count. ``try_wait.parity p`` /
``test_wait.parity p`` return True when the phase of parity ``p`` has completed, i.e. when the current
phase's parity is not ``p`` (the ISA lets ``p`` name only the current or the immediately preceding phase).
``try_wait`` may additionally suspend the thread for a time limit; the emulator's core parks the warp
instead and wakes it on :attr:`Mbarrier.phase` changing.

Which instruction maps to what (the forms nvgemm's sm100 kernels emit):

* ``mbarrier.init.shared.b64 [a], n`` -> :meth:`Mbarrier.init`
* ``mbarrier.arrive.shared{::cta,::cluster}.b64`` -> :meth:`arrive` (returns the state token; remote
  arrives cannot return one)
* ``mbarrier.arrive.expect_tx.shared.b64 _, [a], tx`` -> :meth:`arrive_expect_tx` (expect-tx, then arrive)
* ``cp.async.bulk.tensor ... mbarrier::complete_tx::bytes`` -> :meth:`complete_tx` with the bytes written
* ``tcgen05.commit ... mbarrier::arrive::one`` -> :meth:`arrive` with count 1 when the committed MMAs finish
* ``mbarrier.try_wait.parity{.acquire.cta}.shared{::cta}.b64 p, [a], parity`` -> :meth:`try_wait_parity`

Counts outside the ISA's ranges (expected 1..2**20-1, pending >= 0, |tx-count| <= 2**20-1), use before
``init`` and a second ``init`` without ``inval`` are undefined behaviour in the ISA and errors here.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvgemm.emulator.isa.errors import IsaError

COUNT_MAX = (1 << 20) - 1


@dataclass
class Mbarrier:
    """One mbarrier object; ``where`` names it in error messages (e.g. ``"smem 0x80, CTA (0,0,0)"``)."""

    where: str = "mbarrier"
    initialized: bool = False
    phase: int = 0
    expected: int = 0
    pending: int = 0
    tx: int = 0

    def _check(self, op: str) -> None:
        if not self.initialized:
            raise IsaError(f"{op} on {self.where}: the mbarrier is not initialized (mbarrier.init first)")

    def init(self, count: int) -> None:
        if self.initialized:
            raise IsaError(f"mbarrier.init on {self.where}: already initialized (mbarrier.inval first)")
        if not 1 <= count <= COUNT_MAX:
            raise IsaError(f"mbarrier.init on {self.where}: count {count} outside [1, 2**20 - 1]")
        self.initialized, self.phase, self.expected, self.pending, self.tx = True, 0, count, count, 0

    def inval(self) -> None:
        self._check("mbarrier.inval")
        self.initialized = False

    @property
    def parity(self) -> int:
        return self.phase & 1

    def _maybe_complete(self) -> bool:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.expected
            return True
        return False

    def arrive(self, count: int = 1) -> int:
        """An arrive-on of ``count``; returns the state token (the phase arrived on)."""
        self._check("mbarrier.arrive")
        if not 1 <= count <= COUNT_MAX:
            raise IsaError(f"mbarrier.arrive on {self.where}: count {count} outside [1, 2**20 - 1]")
        if count > self.pending:
            raise IsaError(f"mbarrier.arrive on {self.where}: {count} arrival(s) but only {self.pending} pending "
                           f"in phase {self.phase} (expected count {self.expected})")
        token = self.phase
        self.pending -= count
        self._maybe_complete()
        return token

    def arrive_drop(self, count: int = 1) -> int:
        """``mbarrier.arrive_drop``: arrive and lower the expected count of later phases by ``count``."""
        self._check("mbarrier.arrive_drop")
        if count > self.expected:
            raise IsaError(f"mbarrier.arrive_drop on {self.where}: drops {count} of {self.expected} expected")
        self.expected -= count
        return self.arrive(count)

    def _tx(self, delta: int, op: str) -> None:
        self._check(op)
        if not 0 <= abs(delta) <= COUNT_MAX:
            raise IsaError(f"{op} on {self.where}: transaction count {abs(delta)} outside [0, 2**20 - 1]")
        tx = self.tx + delta
        if abs(tx) > COUNT_MAX:
            raise IsaError(f"{op} on {self.where}: tx-count would become {tx}, outside +-(2**20 - 1)")
        self.tx = tx

    def expect_tx(self, nbytes: int) -> None:
        self._tx(nbytes, "mbarrier.expect_tx")

    def arrive_expect_tx(self, nbytes: int, count: int = 1) -> int:
        self.expect_tx(nbytes)
        return self.arrive(count)

    def complete_tx(self, nbytes: int) -> bool:
        """complete-tx of ``nbytes`` (an async copy landed); True when it completed the phase."""
        self._tx(-nbytes, "mbarrier.complete_tx")
        return self._maybe_complete()

    def try_wait_parity(self, parity: int) -> bool:
        """``test_wait/try_wait.parity``: has the phase of parity ``parity`` completed?"""
        self._check("mbarrier.try_wait.parity")
        if parity not in (0, 1):
            raise IsaError(f"mbarrier.try_wait.parity on {self.where}: parity {parity} is not 0 or 1")
        return self.parity != parity

    def test_wait(self, token: int) -> bool:
        """``test_wait/try_wait`` with a state token from :meth:`arrive`: has that phase completed?"""
        self._check("mbarrier.test_wait")
        if not self.phase - 1 <= token <= self.phase:
            raise IsaError(f"mbarrier.test_wait on {self.where}: token of phase {token} is neither the current "
                           f"phase {self.phase} nor the one before")
        return token < self.phase
