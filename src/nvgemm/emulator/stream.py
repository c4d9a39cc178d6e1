"""A sequence of emulated launches run as one PDL stream (:mod:`nvgemm.emulator.ptx.pdl`).

Inside :func:`capture`, every launch the emulated kernels make -- the AOT artifacts' launches
(:class:`~nvgemm.emulator.runner.EmuKernel`, with the PDL attribute the host code set on the launch) and the
Triton kernels run from their PTX (:class:`~nvgemm.emulator.triton_ptx.EmuTritonKernel`, with ``launch_pdl``)
-- is built (grid, block, cluster, shared memory, parameter bytes, allocations) and appended to the capture's
list instead of running; the tensors the launch points into are kept alive with it. :func:`run_captured` then
runs the list in launch order under a schedule. The host code between the launches must not read what they
compute (on a GPU it could not either: launches are asynchronous); a host function that does (a ``.item()``)
reads stale bytes, and the comparison with the launch-by-launch run fails.
"""

from __future__ import annotations

import contextlib
import threading

_STATE = threading.local()


def capturing() -> "list | None":
    """The list launches are captured into, or None outside :func:`capture`."""
    return getattr(_STATE, "grids", None)


@contextlib.contextmanager
def capture():
    """Capture the launches made inside (this thread) into the yielded list of
    :class:`~nvgemm.emulator.ptx.pdl.StreamGrid`."""
    if capturing() is not None:
        raise RuntimeError("nvgemm emulator: PDL stream captures do not nest")
    grids: list = []
    _STATE.grids = grids
    try:
        yield grids
    finally:
        _STATE.grids = None


def run_captured(grids: list, schedule: str = "early", **kw):
    """Run captured launches as one PDL stream (:func:`nvgemm.emulator.ptx.pdl.run_stream`)."""
    # lazy: the interpreter's opcode modules load on first use
    from nvgemm.emulator.ptx.pdl import run_stream

    return run_stream(grids, schedule, **kw)


__all__ = ["capture", "capturing", "run_captured"]
