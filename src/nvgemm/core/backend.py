"""What a dispatch backend is: the per-call problem descriptors and the :class:`Backend` record.

Kernel families build their backends from these types and the dispatch registry
(:mod:`nvgemm.dispatch.registry`) selects among them, so they live here, below both. One op kind is one
of :data:`OP_KINDS`:

* ``linear``: ``nvgemm::nvfp4_linear`` (problem :class:`LinearProblem`);
* ``moe``: ``nvgemm::nvfp4_moe`` (problem :class:`MoeProblem`);
* ``requant`` / ``prequant``: the fused gated-MLP ops ``nvgemm::nvfp4_linear_requant`` and
  ``nvgemm::nvfp4_linear_prequant`` (problem :class:`LinearProblem`).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from nvgemm.core.validation import LinearProblem  # noqa: F401  (one call's problem; defined with its validation)

LINEAR = "linear"
MOE = "moe"
REQUANT = "requant"
PREQUANT = "prequant"
#: every op kind a backend can serve
OP_KINDS = (LINEAR, MOE, REQUANT, PREQUANT)


@dataclass(frozen=True)
class MoeProblem:
    """What a backend needs to decide whether it can run one ``nvfp4_moe`` call."""

    m: int  # tokens
    top_k: int
    num_experts: int  # local experts E (leading dim of the stacked weights)
    num_global_experts: int  # expert_map length, or E without a map
    hidden: int  # H
    intermediate: int  # I (w2's K); gated w13 has 2I rows
    activation: str
    weight_only: bool  # W4A16 (no input scales)
    alpha13: str  # "expert" ([E] weight_scale_2) | "row" ([E, R13]: unequal gate/up scales)
    x_dtype: torch.dtype
    out_dtype: torch.dtype
    device_type: str
    capability: tuple[int, int] | None
    router_weight_on_input: bool
    expert_map: bool
    shared_out: bool
    residual: bool

    @property
    def gated(self) -> bool:
        return self.activation == "silu_mul"


@dataclass(frozen=True)
class Backend:
    """A named implementation of one op kind: ``supports(problem) -> reason | None`` and ``run`` taking the
    op's arguments in schema order. The op runs the highest-``priority`` backend that supports the problem."""

    name: str
    priority: int  # higher wins
    supports: Callable[..., str | None]
    run: Callable[..., object] = field(repr=False)
    #: offered to Inductor's autotuner as a choice; False for tools that only run when forced
    #: (the PTX emulator's backends: seconds per call on the CPU)
    autotune: bool = True
    #: optional ``bind(*args) -> run | None`` (args in schema order, of a call ``run`` has just served): a
    #: callable with ``run``'s signature for later calls with the same static operands and call metadata,
    #: which may skip everything those determine (kernel arguments packed once); see
    #: :func:`nvgemm.dispatch.registry.bind_call`
    bind: Optional[Callable[..., object]] = field(default=None, repr=False)


_WARNED: set[str] = set()


def warn_once(key: str, msg: str) -> None:
    """Log ``msg`` and raise it as a ``RuntimeWarning``, once per ``key`` per process (a backend's fallback
    notices: one per cause, never one per call)."""
    if key not in _WARNED:
        _WARNED.add(key)
        logging.getLogger("nvgemm_cutedsl").warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


__all__ = ["Backend", "LINEAR", "LinearProblem", "MOE", "MoeProblem", "OP_KINDS", "PREQUANT", "REQUANT", "warn_once"]
