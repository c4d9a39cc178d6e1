"""sm_120a / sm_121a grouped MoE kernels: the warp-level block-scaled (``mma.sync`` mxf4nvf4) W4A4
decode kernel over stacked experts and a work list.

Config space and shape rule (:mod:`.config`: ``moe_shape_problem`` is the family's predicate), the
CuTeDSL kernel (:mod:`.kernel`, built on :mod:`nvgemm.templates.sm120_w4a4`'s main loop), the host
launcher (:mod:`.launch`, on the sm100 grouped family's operand layout, prep and the shared
finalize), the ``cutedsl_sm120_moe`` backend (:mod:`.backend`), the candidate rules (:mod:`.policy`)
and the performance model's pricing (:mod:`.perf`). This ``__init__`` registers the family by name
and imports nothing else.
"""

from nvgemm.core.family import register_family

_P = __name__

register_family(
    name="sm120_moe",
    package=_P,
    summary="grouped NVFP4 W4A4 MoE (swap-AB mma.sync mxf4nvf4 over stacked experts and a work list) for "
            "sm_120a / sm_121a",
    backends=(("moe", f"{_P}.backend:BACKEND"),),
    configs=(f"{_P}.config:Sm120MoeConfig",),
    can_implement=f"{_P}.config:moe_shape_problem",
    kernels=(("sm120_moe_nvfp4", f"{_P}.kernel"),),
    launcher=f"{_P}.launch",
    policy=f"{_P}.policy",
    perf=f"{_P}.perf",
    archs=("sm_120a", "sm_121a"),
)
