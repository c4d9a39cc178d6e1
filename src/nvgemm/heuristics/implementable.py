"""``can_implement(problem, config, target) -> Status``: THE single implementability predicate.

Templates, the candidate policy and the tests all call this one function. It combines

1. the problem's own checks (:func:`nvgemm.core.problem.validate_problem`),
2. the config's problem-independent checks, owned by the template modules
   (``nvgemm.templates.sm100_w4a4.config.validate_config`` / ``sm90.config.validate_config``), and
3. the problem-dependent rules: the sm100 family's own rule
   (:func:`nvgemm.templates.sm100_w4a4.validity.can_implement_problem`), the sm90 rules below, and the
   policy's split-K preference (equal whole-tile slices).

It never raises for a bad problem or config: the answer is a ``Status`` whose ``reason`` names the
problem (shape, alignment, arch ...).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from nvgemm.templates.sm90_w4a16 import config as sm90_config
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config
from nvgemm.templates.sm100_w4a4 import validity as sm100_validity
from nvgemm.templates.sm100_w4a4.config import SM100_ARCHS, Sm100Nvfp4GemmConfig
from nvgemm.core.status import Status

from nvgemm.core.problem import OUT_BYTES, GemmProblem, Target, validate_problem

# W4A4 (sm100) limits are the template's own (nvgemm.templates.sm100_w4a4.validity).
W4A4_K_ALIGN = sm100_validity.K_ALIGN
NARROW_TILE_N = sm100_validity.NARROW_TILE_N
SWAP_AB_MAX_M = sm100_validity.SWAP_AB_MAX_M
# W4A16: 16-byte packed-FP4 weight loads -> K % 32 == 0.
W4A16_K_ALIGN = 32


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _out_alignment(problem: GemmProblem) -> Status:
    out_cols = problem.n // 2 if problem.epilogue == "silu_mul" else problem.n
    nbytes = OUT_BYTES[problem.out_dtype]
    if (out_cols * nbytes) % 16:
        return Status.fail(
            f"output row of {out_cols} {problem.out_dtype} values is {out_cols * nbytes} bytes, not a multiple "
            f"of 16 (TMA store alignment); N must be a multiple of {16 // nbytes * (2 if problem.epilogue == 'silu_mul' else 1)}"
        )
    return Status.success()


def _split_k_ok(k: int, tile_k: int, split_k: int) -> Status:
    k_tiles = _ceil_div(k, tile_k)
    if split_k > k_tiles:
        return Status.fail(f"split_k={split_k} exceeds the {k_tiles} K tiles of {tile_k} (K={k})")
    if k_tiles % split_k:
        return Status.fail(
            f"split_k={split_k} does not divide the {k_tiles} K tiles of {tile_k} (K={k}) into equal whole-tile slices"
        )
    return Status.success()


def can_implement_sm100(problem: GemmProblem, config: Sm100Nvfp4GemmConfig) -> Status:
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
    st = sm100_validity.can_implement_problem(
        config, m=problem.m_hi, n=problem.n, k=problem.k, out_bytes=OUT_BYTES[problem.out_dtype],
        activation=problem.epilogue, arch=arch,
    )
    if not st:
        return st
    # policy preference on top of the kernel's rule: split K into equal whole-tile slices
    return _split_k_ok(problem.k, config.tile_k, config.split_k)


def can_implement_sm90(problem: GemmProblem, config: Sm90W4A16Config) -> Status:
    st = sm90_problem_status(problem)
    if not st:
        return st
    return sm90_config_fits(problem, config)


def sm90_config_fits(problem: GemmProblem, config: Sm90W4A16Config) -> Status:
    """The config-dependent half of :func:`can_implement_sm90`, for a problem whose own rules
    (:func:`sm90_problem_status`) hold -- the policy checks those once per problem."""
    st = _sm90_config_status(config)
    if not st:
        return st
    # tile shapes, warps, stages and pdl: sm90_config.validate_config; K, gated layouts and the
    # split count against the K range: sm90_config.shape_problem. Any M (M tiles) and any N (rows
    # padded to 16-row tiles, predicated stores).
    if why := sm90_config.shape_problem(config, problem.m_hi, problem.n, problem.k, problem.epilogue == "silu_mul"):
        return Status.fail(why)
    return _OK


@lru_cache(maxsize=4096)
def _sm90_config_status(config: Sm90W4A16Config) -> Status:
    """The config's own validity (shape-independent; memoised: the policy asks it per problem)."""
    return sm90_config.validate_config(config)


_OK = Status.success()


def sm90_problem_status(problem: GemmProblem) -> Status:
    """The problem-only rules of the sm90 family (memoised per hashable problem)."""
    try:
        return _sm90_problem_status(problem)
    except TypeError:  # an unhashable field value: without the memo
        return _sm90_problem_status.__wrapped__(problem)


@lru_cache(maxsize=4096)
def _sm90_problem_status(problem: GemmProblem) -> Status:
    """The problem-only rules of the sm90 family (memoised per problem)."""
    st = validate_problem(problem)
    if not st:
        return st
    if problem.kind != "w4a16":
        return Status.fail(
            f"sm90 W4A16 GEMM needs bf16/fp16 activations x nvfp4 weights; problem is {problem.a_format} x {problem.b_format}"
        )
    arch = problem.target.arch
    if arch not in sm90_config.SM90_ARCHS:
        return Status.fail(f"arch {arch} not supported by the sm90 W4A16 family (needs one of {sm90_config.SM90_ARCHS})")
    if problem.k % W4A16_K_ALIGN:
        return Status.fail(
            f"K={problem.k} is not a multiple of {W4A16_K_ALIGN}: packed-FP4 weight rows are loaded in 16-byte units"
        )
    return Status.success()


def can_implement(problem: GemmProblem, config, target: Target | None = None) -> Status:
    """Whether ``config`` implements ``problem`` on ``target`` (default: ``problem.target``)."""
    if not isinstance(problem, GemmProblem):
        return Status.fail(f"problem must be a GemmProblem, got {type(problem).__name__}")
    if target is not None and target != problem.target:
        problem = replace(problem, target=target)
    if isinstance(config, Sm100Nvfp4GemmConfig):
        return can_implement_sm100(problem, config)
    if isinstance(config, Sm90W4A16Config):
        return can_implement_sm90(problem, config)
    return Status.fail(f"unknown config type {type(config).__name__}")
