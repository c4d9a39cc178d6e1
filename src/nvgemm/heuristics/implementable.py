"""``can_implement(problem, config, target) -> Status``: THE single implementability predicate.

Templates, the candidate policy and the tests all call this one function. It finds the kernel family
whose config space holds ``config`` (:func:`nvgemm.core.family.family_of_config`) and asks that family's
registered ``can_implement`` (e.g. :func:`nvgemm.templates.sm100_w4a4.validity.can_implement`,
:func:`nvgemm.templates.sm90_w4a16.validity.can_implement`): the problem's own checks
(:func:`nvgemm.core.problem.validate_problem`), the config's problem-independent checks and the
family's problem-dependent rules.

It never raises for a bad problem or config: the answer is a ``Status`` whose ``reason`` names the
problem (shape, alignment, arch ...).
"""

from __future__ import annotations

from dataclasses import replace

from nvgemm.core.family import family_of_config, resolve
from nvgemm.core.problem import GemmProblem, Target
from nvgemm.core.status import Status


def can_implement(problem: GemmProblem, config, target: Target | None = None) -> Status:
    """Whether ``config`` implements ``problem`` on ``target`` (default: ``problem.target``)."""
    if not isinstance(problem, GemmProblem):
        return Status.fail(f"problem must be a GemmProblem, got {type(problem).__name__}")
    if target is not None and target != problem.target:
        problem = replace(problem, target=target)
    pred = _PREDICATES.get(type(config), _MISSING)
    if pred is _MISSING:
        fam = family_of_config(config)
        # no family, or a family whose configs are not dense GEMMs (MoE configs have their own rule)
        pred = None if fam is None or fam.gemm_kind is None else resolve(fam.can_implement)
        _PREDICATES[type(config)] = pred
    if pred is None:
        return Status.fail(f"unknown config type {type(config).__name__}")
    return pred(problem, config)


_MISSING = object()
#: config type -> its family's predicate (the policy asks per candidate: no registry walk per call)
_PREDICATES: dict = {}
