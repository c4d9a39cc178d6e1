"""The sm120 NVFP4 W4A4 family's validity rules (pure Python: no cutlass, no torch).

:func:`can_implement_problem` answers "can this config compute this GEMM correctly?" for plain
problem numbers (the host launcher applies it per call); :func:`can_implement` is the family's
predicate for a :class:`~nvgemm.core.problem.GemmProblem` (registered with the family): the
problem's own checks, the format and arch, then :func:`can_implement_problem`.
"""

from __future__ import annotations

from nvgemm.core.problem import OUT_BYTES, GemmProblem, validate_problem
from nvgemm.core.status import Status
from nvgemm.templates.sm120_w4a4.config import (
    ROW_TILE, SM120_ARCHS, SMEM_CAPACITY, Sm120W4A4Config, k_stages, validate_config,
)

#: Packed FP4 rows are copied in 16-byte pieces (32 elements): K % 32 == 0. K % 64 != 0 leaves a
#: half slab at the end, zero-filled (codes and block scales) by the copy predicates.
K_ALIGN = 32
ACTIVATIONS = ("none", "silu", "gelu_tanh", "silu_mul")
#: grid.z = M tiles (CUDA's limit on gridDim.z)
MAX_GRID_Z = 65535


def can_implement_problem(config: Sm120W4A4Config, *, m: int, n: int, k: int, activation: str = "none",
                          arch: str | None = None, cluster: tuple[int, int] = (1, 1)) -> Status:
    """Whether ``config`` computes ``out[m, n(/2)] = epilogue(X[m, k] @ W[n, k]^T)`` correctly on ``arch``.

    ``m`` is the token count (its upper bound for an M range), ``n`` the GEMM's output features
    (gate and up together for ``silu_mul``). Never raises; the reason names the problem."""
    st = validate_config(config)
    if not st:
        return st
    if arch is not None and arch not in SM120_ARCHS:
        return Status.fail(f"arch {arch} not supported by the sm120 NVFP4 family (needs one of {SM120_ARCHS})")
    if tuple(cluster) != (1, 1):
        return Status.fail(f"cluster {cluster}: sm_120a / sm_121a kernels run 1x1 clusters (no multicast)")
    if min(m, n, k) < 1:
        return Status.fail(f"empty problem M={m} N={n} K={k}")
    if activation not in ACTIVATIONS:
        return Status.fail(f"activation {activation!r} not in {ACTIVATIONS}")
    if k % K_ALIGN:
        return Status.fail(f"K={k} is not a multiple of {K_ALIGN}: packed FP4 rows are copied in 16-byte pieces")
    if activation == "silu_mul":
        if n % 2 or (n // 2) % ROW_TILE:
            return Status.fail(f"silu_mul needs N/2 = {n / 2:g} to be a multiple of {ROW_TILE} (whole gate and up "
                               "row tiles)")
        if config.row_tiles % 2:
            return Status.fail(f"silu_mul needs an even number of row tiles per warp (gate + up), got "
                               f"{config.row_tiles}")
    stages = k_stages(k, config.tile_k)
    if config.split_k > stages:
        return Status.fail(f"split_k={config.split_k} exceeds the {stages} pipeline stages of K={k} "
                           f"(tile_k={config.tile_k})")
    if -(-m // config.tile_m) > MAX_GRID_Z:
        return Status.fail(f"M={m} needs more than {MAX_GRID_Z} M tiles of {config.tile_m}")
    return Status.success()


def can_implement(problem: GemmProblem, config: Sm120W4A4Config) -> Status:
    """Whether ``config`` implements ``problem`` (the family's predicate; a reason on failure)."""
    st = validate_problem(problem)
    if not st:
        return st
    if not isinstance(config, Sm120W4A4Config):
        return Status.fail(f"expects Sm120W4A4Config, got {type(config).__name__}")
    if problem.kind != "w4a4":
        return Status.fail(f"sm120 NVFP4 GEMM needs nvfp4 x nvfp4 (W4A4); problem is {problem.a_format} x "
                           f"{problem.b_format}")
    return can_implement_problem(config, m=problem.m_hi, n=problem.n, k=problem.k, activation=problem.epilogue,
                                 arch=problem.target.arch)


__all__ = ["ACTIVATIONS", "K_ALIGN", "MAX_GRID_Z", "SMEM_CAPACITY", "can_implement", "can_implement_problem"]
