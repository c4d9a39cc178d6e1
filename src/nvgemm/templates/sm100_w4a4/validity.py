"""The sm100 NVFP4 family's validity rules (pure Python: no cutlass, no torch).

:func:`can_implement_problem` answers "can this config compute this GEMM correctly?" for plain
problem numbers; the host launcher (:func:`nvgemm.templates.sm100_w4a4.launch.prepare_sm100_args`)
calls it, so the kernel's own limits live next to the kernel. :func:`can_implement` is the family's
predicate for a :class:`~nvgemm.core.problem.GemmProblem` (registered with the family;
``nvgemm.heuristics.can_implement`` dispatches to it): the problem's own checks, the format and arch,
:func:`can_implement_problem`, and the policy's preference of split-K in equal whole-tile slices.
"""

from __future__ import annotations

from nvgemm.core.problem import OUT_BYTES, GemmProblem, validate_problem
from nvgemm.core.status import Status
from nvgemm.templates.sm100_w4a4.config import SM100_ARCHS, SM100_TILE_K, Sm100Nvfp4GemmConfig, validate_config

# One TMA row of packed FP4 must be a whole number of 16-byte units -> K % 32 == 0 (this also
# makes the K/16 scale blocks whole).
K_ALIGN = 32
# Tiles narrower than this on the kernel's N axis are "narrow": one tile must hold the whole
# kernel-N extent (with swap-AB that is the token count) and cluster_n must be 1.
NARROW_TILE_N = 64
# swap-AB (W·Xᵀ into the transposed output) is nvgemm's decode layout: token count <= 256.
SWAP_AB_MAX_M = 256
ACTIVATIONS = ("none", "silu", "gelu_tanh", "silu_mul")
# Native tiles store (128 x columns) output sub-tiles with TMA from a swizzled smem stage, whose
# layout needs >= 8 columns: a 32-wide (or tile_n-wide) sub-tile, halved for gated outputs.
MIN_TMA_STORE_COLS = 8


def k_tiles(k: int) -> int:
    """Number of 256-wide K tiles (the last one may be ragged)."""
    return -(-k // SM100_TILE_K)


def can_implement_problem(
    config: Sm100Nvfp4GemmConfig,
    *,
    m: int,
    n: int,
    k: int,
    out_bytes: int,
    activation: str = "none",
    arch: str | None = None,
) -> Status:
    """Whether ``config`` computes ``out[m, n(/2)] = epilogue(X[m, k] @ W[n, k]^T)`` correctly.

    ``m`` is the token count (its upper bound for an M range), ``n`` the GEMM's output features
    (gate and up together for ``silu_mul``), ``out_bytes`` the output element size. Never raises;
    the reason names the problem."""
    st = validate_config(config)
    if not st:
        return st
    if arch is not None and arch not in SM100_ARCHS:
        return Status.fail(f"arch {arch} not supported by the sm100 NVFP4 family (needs one of {SM100_ARCHS})")
    if min(m, n, k) < 1:
        return Status.fail(f"empty problem M={m} N={n} K={k}")
    if activation not in ACTIVATIONS:
        return Status.fail(f"activation {activation!r} not in {ACTIVATIONS}")
    if k % K_ALIGN:
        return Status.fail(f"K={k} is not a multiple of {K_ALIGN}: a TMA row of packed FP4 must be a multiple of 16 bytes")
    gated = activation == "silu_mul"
    if gated and n % 2:
        return Status.fail(f"silu_mul needs an even number of GEMM features (gate|up), got N={n}")
    out_cols = n // 2 if gated else n
    if (out_cols * out_bytes) % 16:
        return Status.fail(
            f"output row of {out_cols} values x {out_bytes} bytes is not a multiple of 16 bytes (TMA store "
            f"alignment); N must be a multiple of {16 // out_bytes * (2 if gated else 1)}"
        )
    if config.swap_ab and m > SWAP_AB_MAX_M:
        return Status.fail(f"swap_ab is the decode layout (M <= {SWAP_AB_MAX_M}); M upper bound is {m}")
    kernel_n = m if config.swap_ab else n
    if not config.swap_ab and min(config.tile_n, 32) // (2 if gated else 1) < MIN_TMA_STORE_COLS:
        return Status.fail(
            f"gated native tile_n={config.tile_n} writes {config.tile_n // 2}-column output sub-tiles; the TMA-store "
            f"epilogue needs >= {MIN_TMA_STORE_COLS} (use tile_n >= 16)"
        )
    if config.tile_n < NARROW_TILE_N:
        if kernel_n > config.tile_n:
            what = "token count M" if config.swap_ab else "N"
            return Status.fail(f"narrow tile_n={config.tile_n} must cover the whole kernel-N extent ({what} up to {kernel_n})")
        if config.cluster_n != 1:
            return Status.fail(f"narrow tile_n={config.tile_n} needs cluster_n=1")
    if config.split_k > k_tiles(k):
        return Status.fail(f"split_k={config.split_k} exceeds the {k_tiles(k)} K tiles of {SM100_TILE_K} (K={k})")
    return Status.success()


def split_k_ok(k: int, tile_k: int, split_k: int) -> Status:
    """The policy's split-K preference: ``split_k`` divides the K tiles into equal whole-tile slices."""
    k_tiles_ = -(-k // tile_k)
    if split_k > k_tiles_:
        return Status.fail(f"split_k={split_k} exceeds the {k_tiles_} K tiles of {tile_k} (K={k})")
    if k_tiles_ % split_k:
        return Status.fail(
            f"split_k={split_k} does not divide the {k_tiles_} K tiles of {tile_k} (K={k}) into equal whole-tile slices"
        )
    return Status.success()


def can_implement(problem: GemmProblem, config: Sm100Nvfp4GemmConfig) -> Status:
    """Whether ``config`` implements ``problem`` (the family's predicate; a reason on failure)."""
    st = validate_problem(problem)
    if not st:
        return st
    if problem.kind != "w4a4":
        return Status.fail(
            f"sm100 NVFP4 GEMM needs nvfp4 x nvfp4 (W4A4); problem is {problem.a_format} x {problem.b_format}"
        )
    arch = problem.target.arch
    if arch not in SM100_ARCHS:
        return Status.fail(f"arch {arch} not supported by the sm100 NVFP4 family (needs one of {SM100_ARCHS})")
    st = can_implement_problem(
        config, m=problem.m_hi, n=problem.n, k=problem.k, out_bytes=OUT_BYTES[problem.out_dtype],
        activation=problem.epilogue, arch=arch,
    )
    if not st:
        return st
    # policy preference on top of the kernel's rule: split K into equal whole-tile slices
    return split_k_ok(problem.k, config.tile_k, config.split_k)


__all__ = ["K_ALIGN", "MIN_TMA_STORE_COLS", "NARROW_TILE_N", "SWAP_AB_MAX_M", "can_implement", "can_implement_problem",
           "k_tiles", "split_k_ok"]
