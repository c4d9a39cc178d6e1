"""The consumer-Blackwell (sm_120a / sm_121a) NVFP4 W4A4 decode GEMM family, in one place.

==================  ==========================================================================
``config``          :class:`Sm120W4A4Config` (the config space), ``validate_config`` and the
                    shared-memory / register budgets
``validity``        ``can_implement`` (the family's predicate) and ``can_implement_problem``
``kernel``          the CuTeDSL kernel (``mma.sync`` m16n8k64 ``kind::mxf4nvf4.block_scale``) and
                    its template (C ABI, compile)
``launch``          host launcher: activation quantization, alpha / bias, split-K workspaces (torch)
``backend``         the ``cutedsl_sm120`` backends (``supports``/``run``) for ``nvfp4_linear`` and the
                    fused requant / prequant ops
``policy``          candidates ranked by the performance model
``perf``            the family's byte / latency model (sourced sm_120 / sm_121 device numbers) and
                    its facts for nvgemm's performance model (``Sm120Facts``)
==================  ==========================================================================

``config`` and ``validity`` are pure Python; ``kernel`` imports cutlass (only the cache's compile
path imports it); ``launch`` and ``backend`` import torch. This ``__init__`` registers the family
by name and imports nothing else.
"""

from nvgemm.core.family import register_family

_P = __name__

register_family(
    name="sm120_w4a4",
    package=_P,
    summary="warp-level block-scaled NVFP4 x NVFP4 decode GEMM (W4A4, mma.sync mxf4nvf4) for sm_120a / sm_121a",
    backends=(("linear", f"{_P}.backend:BACKEND"), ("requant", f"{_P}.backend:REQUANT_BACKEND"),
              ("prequant", f"{_P}.backend:PREQUANT_BACKEND")),
    configs=(f"{_P}.config:Sm120W4A4Config",),
    can_implement=f"{_P}.validity:can_implement",
    kernels=(("sm120_nvfp4_gemm", f"{_P}.kernel"),),
    launcher=f"{_P}.launch",
    policy=f"{_P}.policy",
    perf=f"{_P}.perf",
    perf_facts=(f"{_P}.perf:Sm120Facts",),
    gemm_kind="w4a4",
    archs=("sm_120a", "sm_121a"),
)
