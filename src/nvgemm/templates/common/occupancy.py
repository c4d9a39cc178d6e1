"""Run-time cluster occupancy: ``cuOccupancyMaxActiveClusters`` on the actual device.

:func:`query_max_active_clusters` asks the CUDA driver how many clusters of ``cluster_size``
CTAs (one CTA per SM: 192 threads, all of the opt-in shared memory, like nvgemm's persistent
sm100 kernel) can be resident at once on a device -- the number the persistent grid should be
sized by. The probe kernel is an empty PTX kernel JIT-compiled by the driver (no CuTeDSL, no
compiler import on the warm path); results are cached per (device, cluster size). Uses the
``cuda.bindings`` driver API (installed with ``nvidia-cutlass-dsl``).

The sm100 family combines the query with the AOT value its kernel cache keys on
(:func:`nvgemm.templates.sm100_w4a4.occupancy.resolve_max_active_clusters`).
"""

from __future__ import annotations

import functools
import logging

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


__all__ = ["PROBE_THREADS", "query_max_active_clusters"]
