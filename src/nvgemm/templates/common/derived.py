"""Memo of tensors the launchers derive from model weights (prepared layouts, interleaved copies, fp32 vectors).

One entry per (tag, source tensor), where the source is identified by what it *is*, not by the
Python object that happens to hold it: its storage, offset, shape, strides, dtype and device. A
view made per call (vLLM hands a fused W4A4 layer's GEMMs ``weight[a:b]``; ``weight_scale.view(
torch.float8_e4m3fn)`` of a uint8 checkpoint scale) therefore hits the entry of the first call. An
entry lives as long as the storage (``weakref.finalize`` on the storage object, which torch keeps
unique per storage): it goes when the last tensor using that memory goes, and a live storage's
address cannot be reused, so the key cannot name another weight.

Invalidation: the entry records the version counters of its inputs (views share their base's
counter). An in-place update of a weight (``weight.copy_(new)``, a weight reload) re-derives the
value **into the same buffers** (``refill``), so a CUDA graph captured earlier keeps valid pointers
and replays the new weights; nothing a graph may still read is freed. Re-deriving while a CUDA
graph is being captured is refused with an error (it would only be recorded, not run). Inference
tensors (made under ``torch.inference_mode()``) have no version counter: their entries never
expire by version; updating such a weight in place is not detected (update weights outside
inference mode, or call :meth:`DerivedCache.clear`).

Repeated calls with the very same tensor objects (a layer's own parameters) take a fast path: the
entry remembers weak references to its inputs and their (version, data pointer, shape); it is dropped
with the anchor object, and any difference falls through to the storage-keyed lookup above.

A miss *during* CUDA-graph capture derives the value inside the capture (the work is recorded and
replayed with the graph, which stays correct) but does not store it: the buffers would hold
nothing until the graph first replays, and an eager call must never read them. A warning says so
once per tag; run one eager call (warm-up) before capturing to avoid it.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, Callable, Optional

import torch


def version_of(t: torch.Tensor) -> Optional[int]:
    """``t._version``, or None for an inference tensor (which has no version counter)."""
    return None if t.is_inference() else t._version


def source_key(t: torch.Tensor) -> tuple:
    """What ``t`` is, independent of the Python object: storage, offset, shape, strides, dtype, device."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
            str(t.device))


def _identity(t: torch.Tensor) -> tuple:
    """What the fast path re-checks of an input it holds a reference to: version, data pointer, shape (an
    inference tensor has no version; re-pointing it with ``set_`` changes the pointer)."""
    return version_of(t), t.data_ptr(), t.shape


def state_of(inputs: tuple) -> tuple:
    """The part of the inputs whose change invalidates a derived value (identity + version)."""
    return tuple((source_key(t), version_of(t)) if isinstance(t, torch.Tensor) else t for t in inputs)


def refill_tensors(old: Any, new: Any) -> bool:
    """Copy ``new``'s tensors into ``old``'s (same shapes and dtypes); False when they differ.

    Works on a tensor, a tuple of tensors or a dataclass whose tensor fields match."""
    if isinstance(old, torch.Tensor):
        if not isinstance(new, torch.Tensor) or old.shape != new.shape or old.dtype != new.dtype:
            return False
        old.copy_(new)
        return True
    if isinstance(old, tuple):
        pairs = list(zip(old, new)) if isinstance(new, tuple) and len(new) == len(old) else None
    elif hasattr(old, "__dataclass_fields__") and type(old) is type(new):
        pairs = [(getattr(old, f), getattr(new, f)) for f in old.__dataclass_fields__]
    else:
        return False
    if pairs is None:
        return False
    ts = [(a, b) for a, b in pairs if isinstance(a, torch.Tensor)]
    if any(not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype for a, b in ts):
        return False
    if any(a != b for a, b in pairs if not isinstance(a, torch.Tensor)):
        return False
    for a, b in ts:
        a.copy_(b)
    return True


def value_nbytes(v: Any) -> int:
    """Device bytes held by a derived value (a tensor, a tuple of them or a dataclass of them)."""
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, tuple):
        return sum(value_nbytes(x) for x in v)
    if hasattr(v, "__dataclass_fields__"):
        return sum(value_nbytes(getattr(v, f)) for f in v.__dataclass_fields__)
    return 0


_CACHES: "weakref.WeakSet[DerivedCache]" = weakref.WeakSet()


def device_memo(table: dict) -> dict:
    """The dict a per-device tensor memo (keyed by device, e.g. an index vector built once per device) reads
    and fills: ``table`` itself, or while a FakeTensorMode is active (tracing, shape propagation on a fake
    device) that mode's own dict. A FakeTensor is only valid in its mode: kept in ``table`` it would be served
    to real calls on that device and to later modes. The mode's dict goes with the mode."""
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if mode is None:
        return table
    memos = mode.__dict__.setdefault("_nvgemm_device_memos", {})
    return memos.setdefault(id(table), {})


def derived_nbytes(t: torch.Tensor) -> int:
    """Bytes every launcher's cache holds derived from tensors sharing ``t``'s storage (the extra
    device memory a weight costs beyond its checkpoint copy; the load logs report it)."""
    return sum(c.nbytes_for(t) for c in list(_CACHES))


class DerivedCache:
    """See the module docstring. ``get(tag, anchor, inputs, make)`` is the whole interface."""

    def __init__(self) -> None:
        self._d: dict[tuple, tuple[Any, tuple, Any]] = {}
        #: (tag, id(anchor)) -> (weakrefs of the tensor inputs, their versions, the other inputs, value): a hit
        #: for the very same tensor objects at the same versions skips the storage-keyed lookup
        self._fast: dict[tuple, tuple] = {}
        self._lock = threading.Lock()
        self._warned: set = set()
        self.made = 0  # derivations run (tests count them)
        _CACHES.add(self)

    def nbytes_for(self, t: torch.Tensor) -> int:
        """Bytes of the entries derived from tensors sharing ``t``'s storage."""
        ptr, dev = t.untyped_storage().data_ptr(), str(t.device)
        with self._lock:
            vals = [v for (tag, key), (_, _, v) in self._d.items() if key[0] == ptr and key[5] == dev]
        return sum(value_nbytes(v) for v in vals)

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._fast.clear()

    def get(self, tag: str, anchor: torch.Tensor, inputs: tuple, make: Callable[[], Any], *,
            capturing: "bool | Callable[[], bool]" = False,
            refill: Callable[[Any, Any], bool] = refill_tensors) -> Any:
        """The value derived by ``make()`` from ``inputs`` (``anchor``: the tensor whose storage owns the entry).
        ``capturing`` (a bool, or a callable asked only when the value must be derived): whether a CUDA graph
        is being captured."""
        fk = (tag, id(anchor))
        fast = self._fast.get(fk)
        if fast is not None and fast[0][0]() is anchor:
            refs, versions, others, value = fast
            i = 0
            for t in inputs:
                if isinstance(t, torch.Tensor):
                    if i >= len(refs) or refs[i]() is not t or versions[i] != _identity(t):
                        break
                    i += 1
            else:
                if i == len(refs) and others == tuple(t for t in inputs if not isinstance(t, torch.Tensor)):
                    return value
        if callable(capturing):
            capturing = capturing()
        value = self._get(tag, anchor, inputs, make, capturing, refill)
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        if not capturing and tensors and tensors[0] is anchor:
            fast_d = self._fast

            def drop(ref, fk=fk):  # the anchor object died: its fast entry goes (the storage-keyed one stays)
                hit = fast_d.get(fk)
                if hit is not None and hit[0][0] is ref:
                    fast_d.pop(fk, None)

            refs = (weakref.ref(anchor, drop), *(weakref.ref(t) for t in tensors[1:]))
            self._fast[fk] = (refs, tuple(map(_identity, tensors)),
                              tuple(t for t in inputs if not isinstance(t, torch.Tensor)), value)
        return value

    def _get(self, tag, anchor, inputs, make, capturing, refill):
        slot = (tag, source_key(anchor))
        storage = anchor.untyped_storage()
        state = state_of(inputs)
        with self._lock:
            hit = self._d.get(slot)
        if hit is not None and hit[0]() is not storage:
            hit = None  # defensive: the finalizer drops an entry when its storage dies
        if hit is not None and hit[1] == state:
            return hit[2]
        if capturing:
            if hit is not None:
                raise RuntimeError(
                    f"nvgemm: a weight behind '{tag}' was updated in place since it was prepared, and it cannot be "
                    "re-prepared during CUDA-graph capture; run one eager call after updating weights, then capture"
                )
            if tag not in self._warned:
                self._warned.add(tag)
                warnings.warn(
                    f"nvgemm: '{tag}' is first prepared inside a CUDA-graph capture: the preparation is recorded into "
                    "the graph and re-run on every replay; run one eager call before capturing", RuntimeWarning,
                    stacklevel=3)
            self.made += 1
            return make()
        value = make()
        self.made += 1
        if hit is not None and refill(hit[2], value):
            value = hit[2]  # same buffers, new contents: graphs captured on them replay the new weight
        with self._lock:
            new = slot not in self._d
            self._d[slot] = (weakref.ref(storage), state, value)
        if new:
            weakref.finalize(storage, self._d.pop, slot, None)
        return value


__all__ = ["DerivedCache", "derived_nbytes", "device_memo", "refill_tensors", "value_nbytes", "source_key", "state_of", "version_of"]
