"""Run-time cluster occupancy: ``cuOccupancyMaxActiveClusters`` on the actual device.

:func:`query_max_active_clusters` asks the CUDA driver how many clusters of ``cluster_size``
CTAs (one CTA per SM: 192 threads, all of the opt-in shared memory, like nvgemm's persistent
sm100 kernel) can be resident at once on a device -- the number the persistent grid should be
sized by. The probe kernel is an empty PTX kernel JIT-compiled by the driver (no CuTeDSL, no
compiler import on the warm path); results are cached per (device, cluster size). Uses the
``cuda.bindings`` driver API (installed with ``nvidia-cutlass-dsl``).

:func:`resolve_max_active_clusters` combines the query with the AOT value the kernel cache keys
on (:func:`nvgemm.templates.sm100_w4a4.occupancy.aot_max_active_clusters`), see there.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Callable, Optional

log = logging.getLogger("nvgemm_cutedsl")

_PROBE_PTX = b"""
.version 7.8
.target sm_90
.address_size 64
.visible .entry nvgemm_occupancy_probe()
{
    ret;
}
"""
PROBE_THREADS = 192

_LOCK = threading.Lock()
_WARNED: set = set()


def _check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {int(err)} ({err})")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


@functools.lru_cache(maxsize=64)
def query_max_active_clusters(device_index: int, cluster_size: int, threads: int = PROBE_THREADS) -> int:
    """Clusters of ``cluster_size`` one-CTA-per-SM blocks resident at once on CUDA device
    ``device_index`` (its current context). Raises RuntimeError when the driver refuses."""
    from cuda.bindings import driver

    _check(driver.cuInit(0))
    dev = _check(driver.cuDeviceGet(device_index))
    ctx = _check(driver.cuCtxGetCurrent())
    if ctx is None or int(ctx) == 0:  # torch normally made the primary context current already
        ctx = _check(driver.cuDevicePrimaryCtxRetain(dev))
        _check(driver.cuCtxSetCurrent(ctx))
    module = _check(driver.cuModuleLoadData(_PROBE_PTX))
    func = _check(driver.cuModuleGetFunction(module, b"nvgemm_occupancy_probe"))
    smem = _check(driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev))
    _check(driver.cuFuncSetAttribute(
        func, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    if cluster_size > 8:
        _check(driver.cuFuncSetAttribute(
            func, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = cluster_size, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = smem
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster_size, 1, 1
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    try:
        return int(_check(driver.cuOccupancyMaxActiveClusters(func, cfg)))
    finally:
        driver.cuModuleUnload(module)


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
    from nvgemm.templates.sm100_w4a4.occupancy import aot_max_active_clusters

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


__all__ = ["PROBE_THREADS", "query_max_active_clusters", "resolve_max_active_clusters"]
