"""Adapter to nvMatmulHeuristics (package ``nvMatmulHeuristics``, optional, imported lazily).

What it does for a family's policy: rank tile/cluster/split-K choices **inside the family's own config
space** (an :class:`NvmmhSpace` the policy passes; the sm100 W4A4 family's is
``nvgemm.templates.sm100_w4a4.policy.NVMMH_SPACE``) for a W4A4 problem, with a runtime estimate.

* Precision string: per-operand codes ``F4`` (NVFP4), ``T`` (bf16), ``H`` (fp16), ``S`` (fp32); W4A4
  is ``"F4F4" + out`` (``F4F4T`` for a bf16 output). nvMatmulHeuristics 0.1 has no mixed
  bf16 x FP4 precision (``TF4T``/``F4TT`` return only empty configs), so W4A16 gets no picks.
* K is the **logical** K (FP4 elements). PyTorch 2.15 passes the packed K/2; that halves the
  modelled reduction and skews split-K and runtime estimates.
* Layout ``TN_ROW_MAJOR``: both operands K-major, in either orientation (swap-AB computes
  W[N,K] · X[M,K]ᵀ, again two K-major operands).
* The library's CUTLASS3 model reports per-CTA tiles. The backend property
  CTA_TILE_M_DIV_REQUIREMENT=128 restricts its search to 128-row CTAs (nvgemm's only per-CTA
  height); answers outside the space's tile_n / cluster sets are dropped. Split-K is NOT
  restricted: the library fixes one split-K per tile and rejecting it drops the tile (it then
  returns nothing for e.g. M=6144); :mod:`nvgemm.templates.sm100_w4a4.policy` snaps an
  unsupported split-K (3, 5, 6 ...) to the nearest factor nvgemm implements;
  :mod:`nvgemm.templates.sm100_w4a4.policy` maps a per-CTA 128-row pick to the 1-CTA ``tile_m=128`` config
  and, with an even cluster_m, to the 2-CTA ``tile_m=256`` config.
* The interface, its hardware descriptor (named GPU) and backend are created once per GPU and
  cached; results are memoised per (gpu, precision, M, N, K, count, space). Calls are serialised by a
  lock (the C handle is not documented as thread-safe; Inductor compiles on several threads).
* If the package is missing, fails to load, is disabled with ``NVGEMM_NVMMH=0``, or a query
  raises, :func:`query` returns ``None`` and logs the reason ONCE per reason kind; the policy then
  uses its decode rules alone.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import lru_cache

from nvgemm import settings

from nvgemm.core.problem import GPUS, GemmProblem, Target

log = logging.getLogger("nvgemm.heuristics")

PRECISION_CODES = {"nvfp4": "F4", "bf16": "T", "fp16": "H", "fp32": "S"}
# Fallback named GPU per arch when the target carries no GPU name.
_ARCH_DEFAULT_GPU = {"sm_100a": "B200", "sm_100f": "B200", "sm_103a": "B300", "sm_110a": "B200", "sm_90a": "H100"}

PER_CTA_TILE_M = 128


@dataclass(frozen=True)
class NvmmhSpace:
    """The per-CTA configs a family's kernel implements: 128-row CTAs, these tile_n and cluster extents,
    at most ``max_cluster_ctas`` CTAs per cluster."""

    tile_n: frozenset[int]
    cluster: frozenset[int]
    max_cluster_ctas: int = 16


@dataclass(frozen=True)
class NvmmhPick:
    """One nvMatmulHeuristics answer, in its per-CTA key space."""

    tile_m: int
    tile_n: int
    cluster_m: int
    cluster_n: int
    split_k: int
    runtime_us: float
    rank: int


def precision_string(a_format: str, b_format: str, out_dtype: str) -> str | None:
    """nvMatmulHeuristics precision for a problem's formats, or None when it has none."""
    if a_format == "nvfp4" and b_format == "nvfp4" and out_dtype in ("bf16", "fp16", "fp32"):
        return f"F4F4{PRECISION_CODES[out_dtype]}"
    return None  # W4A16 (bf16/fp16 x nvfp4): no mixed-input precision in nvMatmulHeuristics 0.1


def problem_dims(problem: GemmProblem, swap_ab: bool) -> tuple[int, int, int]:
    """(M, N, K) handed to nvMatmulHeuristics: kernel orientation, LOGICAL K, M upper bound."""
    m = problem.m_hi
    return (problem.n, m, problem.k) if swap_ab else (m, problem.n, problem.k)


def nvmmh_gpu_name(target: Target) -> str | None:
    gpu = target.gpu or _ARCH_DEFAULT_GPU.get(target.arch)
    return (GPUS[gpu].nvmmh_gpu or None) if gpu in GPUS else None


generation = 0  # bumped by reset(); part of the policy's memo key

# ---- lazy state --------------------------------------------------------------------------------
_lock = threading.RLock()
_module = None  # the imported nvMatmulHeuristics module
_unavailable: str | None = None  # reason, once known
_handles: dict[tuple, tuple] = {}  # (gpu enum name, space) -> (interface, backend)
_logged: set[str] = set()


def _log_once(kind: str, msg: str, *args) -> None:
    if kind not in _logged:
        _logged.add(kind)
        log.warning("nvgemm_cutedsl: " + msg, *args)


def reset() -> None:
    """Forget the import result, handles, memoised answers and log-once flags (tests)."""
    global _module, _unavailable, generation
    with _lock:
        generation += 1
        _module = None
        _unavailable = None
        _handles.clear()
        _logged.clear()
        _query_cached.cache_clear()


def _load():
    global _module, _unavailable
    if _module is not None or _unavailable is not None:
        return _module
    if not settings.NVGEMM_NVMMH:
        _unavailable = "disabled by NVGEMM_NVMMH=0"
    else:
        try:
            import nvMatmulHeuristics as mod

            _module = mod
        except Exception as e:  # ImportError, or the shared library failing to load
            _unavailable = f"cannot import nvMatmulHeuristics ({type(e).__name__}: {e})"
    if _unavailable:
        _log_once("unavailable", "%s; candidate policy uses nvgemm's decode rules only", _unavailable)
    return _module


def available() -> bool:
    with _lock:
        return _load() is not None


def unavailable_reason() -> str | None:
    with _lock:
        _load()
        return _unavailable


def _in_space(space: NvmmhSpace, tile_m: int, tile_n: int, cluster_m: int, cluster_n: int) -> bool:
    return (
        tile_m == PER_CTA_TILE_M
        and tile_n in space.tile_n
        and cluster_m in space.cluster
        and cluster_n in space.cluster
        and cluster_m * cluster_n <= space.max_cluster_ctas
    )


def _validity(space: NvmmhSpace):
    def check(kernel_ptr, _problem_ptr) -> int:
        k = kernel_ptr.contents
        return int(_in_space(space, k.cta[0], k.cta[1], k.cluster[0], k.cluster[1]))

    return check


def _handle(gpu: str | None, space: NvmmhSpace):
    key = (gpu or "default", space)
    h = _handles.get(key)
    if h is None:
        import ctypes

        mod = _module
        lh = mod.NvMatmulHeuristicsInterfaceEx(
            backend=mod.NvMatmulHeuristicsTarget.CUTLASS3,
            flags=mod.NvMatmulHeuristicsFlags.PERF_MODEL_BASED_AUTO_TUNING,
            load_discovery_implicitly=True,
            gpu=getattr(mod.NvMatmulHeuristicsNvidiaGpu, gpu) if gpu else None,
        )
        backend = lh.createBackend(mod.NvMatmulHeuristicsTarget.CUTLASS3)
        # Per-CTA tile_m must be a multiple of 128: a native backend property, about half the CPU
        # time of the Python validity callback (which is called once per considered kernel). The
        # rest of nvgemm's space (tile_n, cluster) is filtered on the answers; the callback is the
        # fallback if the property cannot be set.
        try:
            req = ctypes.c_int(PER_CTA_TILE_M)
            lh.setBackendValueProperty(
                backend, mod.NvMatmulHeuristicsBackendProperty.CTA_TILE_M_DIV_REQUIREMENT,
                ctypes.byref(req), ctypes.sizeof(req),
            )
        except Exception:
            lh.setBackendCallbackProperty(
                backend, mod.NvMatmulHeuristicsBackendPropertyCallbackKind.KERNEL_ADDITIONAL_VALIDITY_CHECK,
                _validity(space)
            )
        h = _handles[key] = (lh, backend)
    return h


@lru_cache(maxsize=4096)
def _query_cached(gpu: str | None, precision: str, m: int, n: int, k: int, count: int,
                  space: NvmmhSpace) -> tuple[NvmmhPick, ...]:
    mod = _module
    lh, backend = _handle(gpu, space)
    layout = mod.NvMatmulHeuristicsMatmulLayout.TN_ROW_MAJOR
    problem = lh.makeNvMatmulHeuristicsProblem(m, n, k, layout)
    raw = lh.getEx(problem, count, backend, precision=precision)
    best: dict[tuple, float] = {}
    for r in raw:
        c = r["kernel"]
        if not _in_space(space, c.cta_tile_m, c.cta_tile_n, c.cluster_m, c.cluster_n):
            continue  # includes the zeroed configs the library returns for an unknown precision
        key = (c.cta_tile_m, c.cta_tile_n, c.cluster_m, c.cluster_n, c.split_k)
        rt = float(r["runtime"]) * 1e6
        if key not in best or rt < best[key]:
            best[key] = rt  # tile_k / stages / warp tiles differ only inside the CUTLASS3 model
    ordered = sorted(best.items(), key=lambda kv: (kv[1], kv[0]))
    return tuple(NvmmhPick(*key, runtime_us=rt, rank=i) for i, (key, rt) in enumerate(ordered))


def query(problem: GemmProblem, swap_ab: bool, count: int = 6, *, space: NvmmhSpace) -> tuple[NvmmhPick, ...] | None:
    """nvMatmulHeuristics' ranked picks for ``problem`` in one orientation, inside ``space``.

    Returns None when the library is unavailable or failed (logged once); an empty tuple when it
    has no precision for the formats or found nothing in the space.
    """
    with _lock:
        if _load() is None:
            return None
        precision = precision_string(problem.a_format, problem.b_format, problem.out_dtype)
        if precision is None:
            return ()
        m, n, k = problem_dims(problem, swap_ab)
        try:
            return _query_cached(nvmmh_gpu_name(problem.target), precision, m, n, k, count, space)
        except Exception as e:  # a C-library or ctypes failure must not break compilation
            _log_once("query", "nvMatmulHeuristics query failed (%s: %s); using decode rules only", type(e).__name__, e)
            return None
