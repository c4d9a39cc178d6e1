"""The bounded, shape-aware candidate policy: ``candidates(problem)`` and the M buckets.

* :func:`candidates` returns at most ``max_candidates`` (default 8) ranked :class:`Candidate`s
  (config, reason, nvMatmulHeuristics runtime estimate or None) for one problem. Deterministic:
  the same problem (and the same nvMatmulHeuristics availability) gives the same list. Answers
  are memoised per (problem, cap, use_nvmmh) until ``nvmmh.reset()``.
  An invalid problem gives ``[]``; :func:`problem_status` says why (never an exception).
* :func:`m_buckets` gives the dynamic-batch split points that Inductor range dispatch uses; they
  follow the policy's bands and narrow tile sizes, so one bucket = one kernel choice.
* :func:`bucket_candidates` runs the policy once per bucket of an M range; a candidate chosen for
  a bucket is implementable for every M in it (narrow tiles cover the bucket's upper bound).

Family selection: the registered kernel family (:func:`nvgemm.core.family.families`) whose GEMM kind is the
problem's (W4A4 = nvfp4 x nvfp4, W4A16 = bf16/fp16 x nvfp4) and whose arches hold the target's; its policy
module's ``candidates`` ranks the configs.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import lru_cache

from nvgemm.core.family import KernelFamily, families
from nvgemm.core.status import Status

from nvgemm.heuristics import nvmmh
from nvgemm.heuristics.implementable import can_implement
from nvgemm.core.problem import Candidate, GemmProblem, Target, as_gemm_problem, validate_problem

log = logging.getLogger("nvgemm.heuristics")

DEFAULT_MAX_CANDIDATES = 8
# Upper bounds of the M buckets: narrow token tiles 8/16/32, then the policy bands.
BUCKET_BOUNDS = (8, 16, 32, 64, 128, 256, 512, 1024)

def _gemm_families(kind: str) -> list[KernelFamily]:
    return [f for f in families() if f.gemm_kind == kind]


def family_of(problem: GemmProblem) -> KernelFamily | None:
    """The kernel family whose policy serves ``problem`` (None: no family for its kind on its arch)."""
    for fam in _gemm_families(problem.kind):
        if problem.target.arch in fam.archs:
            return fam
    return None


def problem_status(problem: GemmProblem) -> Status:
    """Why (not) this problem has nvgemm candidates: shape, formats, arch, K alignment."""
    st = validate_problem(problem)
    if not st:
        return st
    fam = family_of(problem)
    if fam is None:
        want = "/".join(a for f in _gemm_families(problem.kind) for a in f.archs) or "a registered family"
        return Status.fail(
            f"no nvgemm kernel family for {problem.kind} on {problem.target.arch} ({problem.kind} needs {want})"
        )
    # The family's most permissive config carries every problem-only rule (K and N alignment).
    return can_implement(problem, fam.probe_config())


def candidates(
    problem, max_candidates: int = DEFAULT_MAX_CANDIDATES, *, use_nvmmh: bool = True, target: Target | None = None
) -> list[Candidate]:
    """Ranked, capped candidate configs for ``problem`` ([] when it cannot be implemented).

    ``problem`` is a :class:`GemmProblem` or a ``nvgemm.core.validation.LinearProblem`` (its target then
    comes from ``target`` or the named GPU of its CUDA capability; no capability -> []).
    """
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")
    problem = as_gemm_problem(problem, target)
    if problem is None:
        return []
    try:
        return list(_candidates_memo(problem, max_candidates, use_nvmmh, nvmmh.generation))
    except TypeError:  # an unhashable field value: compute without the memo
        return list(_candidates_uncached(problem, max_candidates, use_nvmmh))


@lru_cache(maxsize=8192)
def _candidates_memo(problem: GemmProblem, max_candidates: int, use_nvmmh: bool, _generation: int):
    return _candidates_uncached(problem, max_candidates, use_nvmmh)


def _candidates_uncached(problem: GemmProblem, max_candidates: int, use_nvmmh: bool) -> tuple[Candidate, ...]:
    st = problem_status(problem)
    if not st:
        log.debug("nvgemm_cutedsl: no candidates for %s: %s", problem, st.reason)
        return ()
    arch = problem.target.arch  # each candidate names its target arch (its backend depends on it)
    return tuple(c if c.arch == arch else replace(c, arch=arch)
                 for c in family_of(problem).candidates(problem, max_candidates, use_nvmmh=use_nvmmh))


def m_buckets(max_m: int = 256) -> list[tuple[int, int]]:
    """Contiguous inclusive (lo, hi) buckets covering 1..max_m without gaps or overlap.

    Bounds 8, 16, 32 (narrow token tiles), 64, 128, 256 (policy bands), 512, 1024, then doubling.
    """
    if max_m < 1:
        raise ValueError(f"max_m must be >= 1, got {max_m}")
    out: list[tuple[int, int]] = []
    lo = 1
    bounds = list(BUCKET_BOUNDS)
    while bounds[-1] < max_m:
        bounds.append(bounds[-1] * 2)
    for b in bounds:
        hi = min(b, max_m)
        out.append((lo, hi))
        if hi == max_m:
            break
        lo = hi + 1
    return out


def bucket_for(m: int, buckets: list[tuple[int, int]]) -> tuple[int, int]:
    for lo, hi in buckets:
        if lo <= m <= hi:
            return (lo, hi)
    raise ValueError(f"M={m} is outside the buckets {buckets[0][0]}..{buckets[-1][1]}")


def bucket_candidates(
    problem: GemmProblem, max_candidates: int = DEFAULT_MAX_CANDIDATES, *, use_nvmmh: bool = True
) -> list[tuple[tuple[int, int], list[Candidate]]]:
    """Per-bucket candidates for a dynamic-M problem (``m_range``) or an exact M (one bucket)."""
    lo, hi = (problem.m_lo, problem.m_hi) if validate_problem(problem) else (1, 0)
    out = []
    for blo, bhi in m_buckets(hi) if hi >= 1 else []:
        if bhi < lo:
            continue
        sub = problem.with_m_range(max(blo, lo), bhi)
        out.append(((max(blo, lo), bhi), candidates(sub, max_candidates, use_nvmmh=use_nvmmh)))
    return out
