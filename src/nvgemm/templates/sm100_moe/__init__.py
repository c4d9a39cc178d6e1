"""sm_100a grouped MoE kernels: the swap-AB tcgen05 W4A4 decode kernel over stacked experts and a work list.

Config space and shape rule (:mod:`.config`: ``moe_shape_problem`` is the family's predicate), the CuTeDSL
kernel (:mod:`.kernel`), the host launcher (:mod:`.launch`), the ``cutedsl_sm100_moe`` backend
(:mod:`.backend`), the candidate rules (:mod:`.policy`) and the performance model's pricing
(:mod:`.perf`). This ``__init__`` registers the family by name and imports nothing else.
"""

from nvgemm.core.family import register_family

_P = __name__

register_family(
    name="sm100_moe",
    package=_P,
    summary="grouped NVFP4 W4A4 MoE (swap-AB tcgen05 over stacked experts and a work list) for sm_100a",
    backends=(("moe", f"{_P}.backend:BACKEND"),),
    configs=(f"{_P}.config:Sm100MoeConfig",),
    can_implement=f"{_P}.config:moe_shape_problem",
    kernels=(("sm100_moe_nvfp4", f"{_P}.kernel"),),
    launcher=f"{_P}.launch",
    policy=f"{_P}.policy",
    perf=f"{_P}.perf",
    archs=("sm_100a",),
)
