"""The sm100 NVFP4 family's problem-level validity rule (pure Python: no cutlass, no torch).

:func:`can_implement_problem` answers "can this config compute this GEMM correctly?" for plain
problem numbers. ``nvgemm.heuristics.can_implement`` (the policy's and the tests' predicate) and
the host launcher (:func:`nvgemm.templates.sm100_w4a4.launch.prepare_sm100_args`) both call it, so the
kernel's own limits live next to the kernel. Policy preferences that are not correctness limits
(e.g. split-K only in equal whole-tile slices) stay in the heuristics.
"""

from __future__ import annotations

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


__all__ = ["K_ALIGN", "MIN_TMA_STORE_COLS", "NARROW_TILE_N", "SWAP_AB_MAX_M", "can_implement_problem", "k_tiles"]
