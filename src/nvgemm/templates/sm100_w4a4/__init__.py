"""The Blackwell (sm_100a family) NVFP4 W4A4 GEMM family, in one place.

==================  ==========================================================================
``config``          :class:`Sm100Nvfp4GemmConfig` (the config space) and ``validate_config``
``validity``        ``can_implement`` (the family's predicate) and ``can_implement_problem``: the
                    problem-level rule (shapes, alignment, narrow tiles, split-K) the policy and
                    the launcher both apply
``occupancy``       clusters resident at once per arch (the AOT ``max_active_clusters``)
``kernel``          the CuTeDSL kernel (TMA / MMA roles, host ``__call__``) and its template
``epilogue``        the epilogue warps (TMEM load, epilogue math, stores, split-K reduce)
``requant``         the fused NVFP4 requantization epilogue (the gated MLP's next-layer input)
``launch``          host launcher: argument preparation, split-K workspaces, launch (torch)
``backend``         the ``cutedsl_sm100`` backends (``supports``/``run``) for ``nvfp4_linear`` and the
                    fused requant / prequant ops
``policy``          the candidate rules (rule tiles + nvMatmulHeuristics picks)
``perf``            the performance model's facts of the kernel (``Sm100Facts``)
==================  ==========================================================================

``config`` and ``validity`` are pure Python; ``kernel`` and ``epilogue`` import cutlass (only the
cache's compile path imports them); ``launch`` and ``backend`` import torch. This ``__init__``
registers the family by name and imports nothing else.
"""

from nvgemm.core.family import register_family

_P = __name__

register_family(
    name="sm100_w4a4",
    package=_P,
    summary="tcgen05 block-scaled NVFP4 x NVFP4 GEMM (W4A4) for sm_100a / sm_100f / sm_103a / sm_110a",
    backends=(("linear", f"{_P}.backend:BACKEND"), ("requant", f"{_P}.backend:REQUANT_BACKEND"),
              ("prequant", f"{_P}.backend:PREQUANT_BACKEND")),
    configs=(f"{_P}.config:Sm100Nvfp4GemmConfig",),
    can_implement=f"{_P}.validity:can_implement",
    kernels=(("sm100_nvfp4_gemm", f"{_P}.kernel"),),
    launcher=f"{_P}.launch",
    policy=f"{_P}.policy",
    perf=f"{_P}.perf",
    perf_facts=(f"{_P}.perf:Sm100Facts",),
    gemm_kind="w4a4",
    archs=("sm_100a", "sm_100f", "sm_103a", "sm_110a"),
)
