"""Split-K workspaces (fp32 partials + int32 tile counters) shared by the kernel families' launchers.

The split-K kernels (sm100 NVFP4, sm90 W4A16) sum partial tiles through a workspace and count the
arrived splits of each tile in int32 counters that must be zero at launch; every kernel leaves
them at zero when it finishes. :class:`SplitKWorkspaces` hands out one pair per (device, stream)
so two streams never race on one pair, and keeps every pair a CUDA graph may still replay on
alive. See the class docstring for the capture rules.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch


def is_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_FAKE_PAIRS = "_nvgemm_splitk_workspaces"


def _fake_mode():
    """The active FakeTensorMode, or None (one dispatcher lookup: cheap enough for the launch path)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


class SplitKWorkspaces:
    """Split-K workspace + zeroed counters per (device, stream), safe under CUDA graphs, bounded.

    A captured graph keeps the raw device pointers of every workspace it launched with, so no
    buffer handed out here is ever freed or handed to anything that could use it concurrently:

    * eager calls share one current pair per (device, stream) (launches on one stream are
      ordered, and the kernel leaves every counter at 0). When a call needs more, a new pair of
      at least ``growth`` times the size is allocated (counters zeroed) and the old pair is
      **retired but kept alive** for the life of the process (or until :meth:`release_retired`),
      since a graph captured earlier may still replay onto it;
    * a call made while its stream is being captured uses that stream's eager pair if it is
      large enough (its counters are already zero: the usual case after a warm-up call). Else it
      uses the stream's *capture* pair, grown the same way (at most a logarithmic number of pairs
      however many calls are captured -- ``torch.cuda.graph`` captures on a fresh stream that
      no eager call has used). A capture pair's counters were zeroed only by a fill recorded into
      the graph that allocated it, so each captured call using it also records a zero fill of its
      counters (a small memset node per split-K call, only in such graphs) -- a graph that
      replays before the one that allocated the pair still starts from zeroed counters.

    A graph must replay on the stream it was captured on (or be ordered with that stream's
    other launches); two concurrent launches that share a pair would race on its counters.
    """

    def __init__(self, capturing: Callable[[], bool] = is_capturing, growth: float = 2.0):
        self._capturing = capturing
        self._growth = growth
        self._lock = threading.Lock()
        self._current: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._capture: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._retired: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    @staticmethod
    def _alloc(device, ws_numel: int, n_cnt: int):
        return (torch.empty(ws_numel, dtype=torch.float32, device=device),
                torch.zeros(n_cnt, dtype=torch.int32, device=device))

    @staticmethod
    def _fits(pair, ws_numel: int, n_cnt: int) -> bool:
        return pair is not None and pair[0].numel() >= ws_numel and pair[1].numel() >= n_cnt

    def _grown(self, table: dict, keep: list, key, device, ws_numel: int, n_cnt: int):
        old = table.get(key)
        if old is not None:
            keep.append(old)
            ws_numel = max(ws_numel, int(old[0].numel() * self._growth))
            n_cnt = max(n_cnt, int(old[1].numel() * self._growth))
        pair = self._alloc(device, ws_numel, n_cnt)
        table[key] = pair
        return pair

    def get(self, device: torch.device, ws_numel: int, n_cnt: int, stream_id: int = 0):
        """(workspace, counters) with at least ``ws_numel`` / ``n_cnt`` elements.

        Under a ``FakeTensorMode`` (tracing, fake-device replays) the pairs are FakeTensors of that mode: they are
        kept on the mode itself, never in this pool, so they die with it and no other mode (or a real call)
        meets them."""
        key = (str(device), stream_id)
        fm = _fake_mode()
        if fm is not None:
            table = fm.__dict__.setdefault(_FAKE_PAIRS, {})
            pair = table.get(key)
            if not self._fits(pair, ws_numel, n_cnt):  # grown as the pool grows (the old pair is dropped)
                pair = self._grown(table, [], key, device, ws_numel, n_cnt)
            return pair
        with self._lock:
            cur = self._current.get(key)
            if self._fits(cur, ws_numel, n_cnt):
                return cur
            if self._capturing():
                pair = self._capture.get(key)
                if self._fits(pair, ws_numel, n_cnt):
                    pair[1].zero_()  # recorded into this graph (see the class docstring)
                    return pair
                return self._grown(self._capture, self._captured, key, device, ws_numel, n_cnt)
            return self._grown(self._current, self._retired, key, device, ws_numel, n_cnt)

    def current(self, device_key: str, stream_id: int = 0):
        """The pair :meth:`get` hands out now for (``str(device)``, ``stream_id``) when it fits, read without
        the lock (a launcher that checked a pair once compares it by identity; None when there is none)."""
        return self._current.get((device_key, stream_id))

    def release_retired(self) -> int:
        """Free the retired and capture pairs (only when no graph that may have used them can
        replay any more); returns how many pairs were dropped."""
        with self._lock:
            n = len(self._retired) + len(self._captured) + len(self._capture)
            self._retired.clear()
            self._captured.clear()
            self._capture.clear()
            return n

    def pairs(self) -> int:
        """How many pairs are held (current, retired, capture)."""
        with self._lock:
            return len(self._current) + len(self._retired) + len(self._captured) + len(self._capture)

    def held_bytes(self) -> int:
        with self._lock:
            pairs = list(self._current.values()) + list(self._capture.values()) + self._retired + self._captured
        return sum(w.numel() * 4 + c.numel() * 4 for w, c in pairs)


#: the process-wide pool both families' launchers draw from
WORKSPACES = SplitKWorkspaces()

__all__ = ["WORKSPACES", "SplitKWorkspaces", "is_capturing"]
