"""The sm90 W4A16 family's implementability predicate (pure Python: no cutlass, no torch).

:func:`can_implement` (registered with the family; ``nvgemm.heuristics.can_implement`` dispatches to it)
is the problem's own rules (:func:`sm90_problem_status`: formats, arch, K alignment; memoised per
problem) plus the config's (:func:`sm90_config_fits`: the config's own validity and
:func:`~nvgemm.templates.sm90_w4a16.config.shape_problem`). The policy checks the problem once and then
each config with :func:`sm90_config_fits`.
"""

from __future__ import annotations

from functools import lru_cache

from nvgemm.core.problem import GemmProblem, validate_problem
from nvgemm.core.status import Status
from nvgemm.templates.sm90_w4a16 import config as sm90_config
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config

# W4A16: 16-byte packed-FP4 weight loads -> K % 32 == 0.
W4A16_K_ALIGN = 32

_OK = Status.success()


def can_implement(problem: GemmProblem, config: Sm90W4A16Config) -> Status:
    """Whether ``config`` implements ``problem`` (the family's predicate; a reason on failure)."""
    st = sm90_problem_status(problem)
    if not st:
        return st
    return sm90_config_fits(problem, config)


def sm90_config_fits(problem: GemmProblem, config: Sm90W4A16Config) -> Status:
    """The config-dependent half of :func:`can_implement`, for a problem whose own rules
    (:func:`sm90_problem_status`) hold -- the policy checks those once per problem."""
    st = _sm90_config_status(config)
    if not st:
        return st
    # tile shapes, warps, stages and pdl: sm90_config.validate_config; K, gated layouts and the
    # split count against the K range: sm90_config.shape_problem. Any M (M tiles) and any N (rows
    # padded to 16-row tiles, predicated stores).
    if why := sm90_config.shape_problem(config, problem.m_hi, problem.n, problem.k, problem.epilogue == "silu_mul"):
        return Status.fail(why)
    # the target arch: the family's archs, PDL (sm_90+) and the arch's shared memory
    if why := _arch_problem(config, problem.target.arch):
        return Status.fail(why)
    return _OK


@lru_cache(maxsize=8192)
def _arch_problem(config: Sm90W4A16Config, arch: str) -> str | None:
    return sm90_config.arch_problem(config, arch)


@lru_cache(maxsize=4096)
def _sm90_config_status(config: Sm90W4A16Config) -> Status:
    """The config's own validity (shape-independent; memoised: the policy asks it per problem)."""
    return sm90_config.validate_config(config)


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
    if arch not in sm90_config.ALL_ARCHS:
        return Status.fail(f"arch {arch} not supported by the sm90 W4A16 family (needs one of {sm90_config.ALL_ARCHS})")
    if problem.k % W4A16_K_ALIGN:
        return Status.fail(
            f"K={problem.k} is not a multiple of {W4A16_K_ALIGN}: packed-FP4 weight rows are loaded in 16-byte units"
        )
    return Status.success()


__all__ = ["W4A16_K_ALIGN", "can_implement", "sm90_config_fits", "sm90_problem_status"]
