"""sm_90a grouped MoE kernels: the W4A16 mma.sync decode family over stacked experts and a work list.

Config space and shape rule (:mod:`.config`: ``moe_shape_problem`` is the family's predicate), the CuTeDSL
kernel (:mod:`.kernel`), the host launcher and work list (:mod:`.launch`), the ``cutedsl_sm90_moe``
backend (:mod:`.backend`), the candidate rules (:mod:`.policy`) and the performance model's grouped-GEMM
pricing (:mod:`.perf`). This ``__init__`` registers the family by name and imports nothing else.
"""

from nvgemm.core.family import register_family

_P = __name__

register_family(
    name="sm90_moe",
    package=_P,
    summary="grouped NVFP4 W4A16 MoE (mma.sync over stacked experts and a work list) for sm_90a",
    backends=(("moe", f"{_P}.backend:BACKEND"),),
    configs=(f"{_P}.config:Sm90MoeConfig",),
    can_implement=f"{_P}.config:moe_shape_problem",
    kernels=(("sm90_moe_mma", f"{_P}.kernel"),),
    launcher=f"{_P}.launch",
    policy=f"{_P}.policy",
    perf=f"{_P}.perf",
    archs=("sm_90a",),
)
