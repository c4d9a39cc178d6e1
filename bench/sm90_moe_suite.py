"""The sm90 grouped-MoE cases of the H200 check (``bench/gpu_check.py``, built by
``bench/build_sm90_artifacts.py``): the MoE presets' layers (``nvgemm.templates.sm90_moe.policy``) at
decode token counts with the run-time policy's (GEMM1, GEMM2) pick, plus numerics cases with forced
configs (split-K, tile_m 16/32, per-row alpha, shared_out + residual, fp16). Pure Python."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SM_COUNT = 132
MOE_TIMED_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class MoeCase:
    name: str
    preset: str  # nvgemm.templates.sm90_moe.policy.MOE_LAYERS key
    m: int
    timed: bool
    configs: tuple = field(default=None)  # (config13 dict, config2 dict) forced; None: the policy's pick
    alpha13: str = "expert"  # "expert" | "row"
    extras: bool = False  # shared_out + residual
    x_dtype: str = "bf16"

    def to_json(self) -> dict:
        return asdict(self)


def _mc(tile_m=8, tile_n=128, tile_k=256, split_k=1, num_warps=4, stages=4, pdl=True) -> dict:
    return dict(tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, split_k=split_k, num_warps=num_warps, stages=stages,
                pdl=pdl)


def moe_cases() -> list[MoeCase]:
    from nvgemm.templates.sm90_moe.policy import MOE_LAYERS

    out = []
    for p in MOE_LAYERS:
        for m in MOE_TIMED_M:
            out.append(MoeCase(f"moe.{p}.m{m}", p, m, True))
    out += [
        MoeCase("moe.num.sk", "Qwen3-30B-A3B", 5, False, (_mc(split_k=4), _mc(tile_n=64, split_k=3))),
        MoeCase("moe.num.t16.row", "Qwen3-30B-A3B", 40, False, (_mc(tile_m=16), _mc(tile_m=16, tile_n=64)), "row"),
        MoeCase("moe.num.t32.extras", "DeepSeek-V3-TP8", 33, False,
                (_mc(tile_m=32, tile_n=64, num_warps=2), _mc(tile_m=32, stages=3)), extras=True),
        MoeCase("moe.num.fp16", "Mixtral-8x7B", 3, False, (_mc(tile_n=256, num_warps=8), _mc(split_k=2)),
                x_dtype="fp16"),
    ]
    return out


def case_configs(case: MoeCase):
    """(config13, config2) of a case: forced, or the run-time pick on an H200 (132 SMs)."""
    from nvgemm.templates.sm90_moe.policy import get_moe_layer, pick_moe_configs
    from nvgemm.templates.sm90_moe.config import Sm90MoeConfig

    if case.configs is not None:
        return Sm90MoeConfig(**case.configs[0]), Sm90MoeConfig(**case.configs[1])
    s = get_moe_layer(case.preset)
    return pick_moe_configs(case.m, s.num_experts, s.top_k, s.hidden, s.inter, True, SM_COUNT)


def case_specs(case: MoeCase, environ=None):
    """The two compile specs of a case (GEMM1: silu_mul in the activation dtype; GEMM2: fp32), built
    as the runtime builds them."""
    import torch

    from nvgemm.core.epilogue import EpilogueSpec
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.aot.abi import HardwareSpec

    c13, c2 = case_configs(case)
    xdt = torch.float16 if case.x_dtype == "fp16" else torch.bfloat16
    e13 = EpilogueSpec(alpha="vector" if case.alpha13 == "row" else "scalar", activation="silu_mul", out_dtype=xdt)
    e2 = EpilogueSpec(alpha="scalar", out_dtype=torch.float32)
    hw = HardwareSpec(sm_count=SM_COUNT)
    return [make_spec("sm90_moe_mma", c, "sm_90a", epilogue=e, hw=hw, a_format=case.x_dtype, b_format="nvfp4",
                      environ=environ) for c, e in ((c13, e13), (c2, e2))]
