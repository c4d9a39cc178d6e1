"""How many clusters of the sm100 NVFP4 kernel are resident at once: the per-arch AOT value.

The kernel is persistent: its grid is ``max_active_clusters`` clusters that loop over the work
tiles. If that number exceeds what the GPU can hold at once, the surplus clusters form a second,
partial wave and the whole GEMM takes up to twice as long. ``sm_count // cluster_size`` is not
the right number: every CTA of a cluster must sit in **one GPC** (graphics processing cluster),
and SMs left over in a GPC when its SM count is not a multiple of the cluster size are unusable
for that cluster size.

At run time nvgemm asks the driver (``cuOccupancyMaxActiveClusters``,
:mod:`nvgemm.templates.common.occupancy`) and :func:`resolve_max_active_clusters` keys the kernel on
its answer where it differs. Ahead of time (kernels built without a GPU) the compile key
needs a number that is right for the target: :func:`aot_max_active_clusters`, the **guaranteed**
count for the arch's topology, i.e. the minimum over every way the enabled SMs can be spread
over the GPCs. A guaranteed count never causes a partial wave; at worst it leaves a few SMs
idle when the real part is better balanced than the worst case.

Topology of the sm_100 family (B200, GB200, B300/GB300: two dies of 4 GPCs, each GPC at most
10 TPCs of 2 SMs; parts enable whole TPCs, so every GPC holds an even number of SMs). This is the
published die organisation, not a measurement of a specific part; the first Blackwell run checks
it (``tests/gpu/test_sm100_gemm.py::test_aot_cluster_occupancy_is_a_lower_bound``).

Guaranteed counts for B200 (148 SMs = 74 TPCs in 8 GPCs):

    cluster size      1    2    4    8   16
    sm_count // c   148   74   37   18    9     (the old rule: 8 and 16 cannot even fit)
    guaranteed      148   74   34   14    6

(the guaranteed count for c=4 assumes up to six GPCs with an SM count of 2 mod 4; a balanced
B200 with GPCs of 18 and 20 SMs holds 34-37 clusters of 4, 16 of 8, 8 of 16). Parts with another
SM count (a GB200 or B300 SKU) get the value computed for their own count by the same rule.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Callable, Optional

log = logging.getLogger("nvgemm_cutedsl")
_LOCK = threading.Lock()
_WARNED: set = set()

#: sm_100-family die organisation (see the module docstring).
SM100_GPCS = 8
SM100_MAX_SMS_PER_GPC = 20
SM100_SMS_PER_TPC = 2


@functools.lru_cache(maxsize=None)
def guaranteed_clusters(
    sm_count: int,
    cluster_size: int,
    gpcs: int = SM100_GPCS,
    max_sms_per_gpc: int = SM100_MAX_SMS_PER_GPC,
    sms_per_tpc: int = SM100_SMS_PER_TPC,
) -> int:
    """min over every split of ``sm_count`` SMs into ``gpcs`` GPCs (each a multiple of
    ``sms_per_tpc``, at most ``max_sms_per_gpc``) of sum(GPC SMs // cluster_size).

    Raises ValueError when ``sm_count`` cannot be split that way (another topology)."""
    if cluster_size < 1 or sm_count < 1:
        raise ValueError(f"cluster_size and sm_count must be >= 1, got {cluster_size}, {sm_count}")
    if sm_count % sms_per_tpc or sm_count > gpcs * max_sms_per_gpc:
        raise ValueError(
            f"{sm_count} SMs do not fit the sm_100 topology ({gpcs} GPCs x <= {max_sms_per_gpc} SMs, "
            f"{sms_per_tpc} SMs per TPC)"
        )
    inf = float("inf")
    # best[s] = minimum clusters over the GPCs placed so far holding s SMs in total
    best = [inf] * (sm_count + 1)
    best[0] = 0
    for _ in range(gpcs):
        nxt = [inf] * (sm_count + 1)
        for s, b in enumerate(best):
            if b == inf:
                continue
            for g in range(0, min(max_sms_per_gpc, sm_count - s) + 1, sms_per_tpc):
                v = b + g // cluster_size
                if v < nxt[s + g]:
                    nxt[s + g] = v
        best = nxt
    return int(best[sm_count])


def aot_max_active_clusters(arch: str, sm_count: int, cluster_size: int) -> int:
    """The value baked into kernels compiled ahead of time for ``arch`` with ``sm_count`` SMs.

    sm_100 family: :func:`guaranteed_clusters`; an SM count outside that topology (or another
    arch) falls back to ``sm_count // cluster_size`` (one CTA per SM)."""
    if arch.startswith(("sm_100", "sm_103")):
        try:
            return max(1, guaranteed_clusters(sm_count, cluster_size))
        except ValueError:
            pass
    return max(1, sm_count // cluster_size)


def resolve_max_active_clusters(
    arch: str,
    sm_count: int,
    cluster_size: int,
    query: Optional[Callable[[int], int]],
) -> int:
    """The ``HardwareSpec.max_active_clusters`` a run-time compile spec carries.

    The driver's answer whenever it differs from the template's per-arch AOT value -- more
    clusters (a balanced B200 holds 37 clusters of 4 where 34 are guaranteed) fill the SMs the
    guaranteed count leaves idle, fewer (a partitioned GPU, MPS, another SKU) keep the persistent
    grid from spilling into a second wave. ``0`` (= "the AOT value", the key an ahead-of-time
    build uses) when they agree, when there is no query (ahead of time) or when the query fails
    (warned once). Where the device-sized kernel is not in the cache and cannot be built, the
    backend runs the precompiled AOT kernel (:func:`nvgemm.templates.sm100_w4a4.backend.kernel_for`)."""
    aot = aot_max_active_clusters(arch, sm_count, cluster_size)
    if query is None:
        return 0
    try:
        hw = int(query(cluster_size))
    except Exception as e:  # noqa: BLE001 - any driver failure falls back to the AOT value
        key = (arch, sm_count, cluster_size)
        with _LOCK:
            first = key not in _WARNED
            _WARNED.add(key)
        if first:
            log.warning("nvgemm_cutedsl: cluster occupancy query failed (%s); using the AOT value %d for "
                        "cluster size %d on %s", e, aot, cluster_size, arch)
        return 0
    if hw < 1:
        raise RuntimeError(f"nvgemm_cutedsl: a cluster of {cluster_size} CTAs does not fit on this device")
    return 0 if hw == aot else hw


__all__ = ["SM100_GPCS", "SM100_MAX_SMS_PER_GPC", "aot_max_active_clusters", "guaranteed_clusters",
           "resolve_max_active_clusters"]
