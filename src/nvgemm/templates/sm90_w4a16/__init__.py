"""The sm_90a NVFP4 weight-only (W4A16) kernel families, one folder: config space (:mod:`.config`), the
family's predicate (:mod:`.validity`), the weight operand layout and its exact decode in torch
(:mod:`.operand`), the CuTeDSL kernels (:mod:`.mma` decode kernel, :mod:`.wgmma`; shared pieces in
:mod:`.common`), the pure-torch host launcher (:mod:`.launch`), the ``cutedsl_sm90`` backend
(:mod:`.backend`), the candidate rules (:mod:`.policy`) and the performance model's facts (:mod:`.perf`).

This ``__init__`` registers the family by name and imports nothing else: the kernel modules import
cutlass and are loaded only to compile.
"""

from nvgemm.core.family import register_family

_P = __name__

register_family(
    name="sm90_w4a16",
    package=_P,
    summary="NVFP4 weight x bf16/fp16 activation GEMM (W4A16): mma.sync decode kernel (sm_80..sm_121a) and the "
            "sm_90a wgmma kernel",
    backends=(("linear", f"{_P}.backend:BACKEND"), ("linear", f"{_P}.backend:MMA_BACKEND")),
    configs=(f"{_P}.config:Sm90W4A16Config",),
    can_implement=f"{_P}.validity:can_implement",
    kernels=(("sm90_w4a16_mma", f"{_P}.mma"), ("sm90_w4a16_wgmma", f"{_P}.wgmma")),
    template_of=f"{_P}.config:template_id_of",
    launcher=f"{_P}.launch",
    policy=f"{_P}.policy",
    perf=f"{_P}.perf",
    perf_facts=(f"{_P}.perf:MmaFacts", f"{_P}.perf:WgmmaFacts"),
    gemm_kind="w4a16",
    archs=("sm_90a", "sm_80", "sm_86", "sm_89", "sm_120a", "sm_121a"),
)
