"""nvgemm candidate policy: problem descriptor, the single ``can_implement`` predicate, the
bounded decode-aware ``candidates()`` policy (nvMatmulHeuristics + decode rules), M buckets for
dynamic batch, and model presets. Pure Python; nvMatmulHeuristics is imported lazily."""

from nvgemm.heuristics.implementable import can_implement
from nvgemm.heuristics.policy import bucket_candidates, bucket_for, candidates, m_buckets, problem_status
from nvgemm.core.problem import GPUS, Candidate, GemmProblem, Target, validate_problem

__all__ = [
    "GPUS",
    "Candidate",
    "GemmProblem",
    "Target",
    "bucket_candidates",
    "bucket_for",
    "can_implement",
    "candidates",
    "m_buckets",
    "problem_status",
    "validate_problem",
]
