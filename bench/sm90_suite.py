"""The sm90 W4A16 GPU-check suite, shared by ``bench/build_sm90_artifacts.py`` (builds every kernel
it needs, here, without a GPU) and ``bench/gpu_check.py`` (runs on the H200 without cutlass-dsl).

Shapes are the per-GPU (TP=1) linear layers of Llama-3.1-8B and Llama-3.3-70B (fused q/k/v and
gate/up), N x K = output features x input features.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

LLAMA_SHAPES = {
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336),
    "70b.qkv": (10240, 8192),
    "70b.o": (8192, 8192),
    "70b.gate_up": (57344, 8192),
    "70b.down": (8192, 28672),
}
TIMING_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SM_COUNT = 132  # H100 SXM / H200

_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Case:
    """One kernel use: a problem, its epilogue and (optionally) a forced config."""

    name: str
    m: int
    n: int
    k: int
    activation: str = "none"
    bias: bool = False
    residual: bool = False
    vector_alpha: bool = False
    x_dtype: str = "bf16"
    out_dtype: str = "bf16"
    w4a4: bool = False
    config: dict | None = None  # Sm90W4A16Config fields; None = the runtime's pick_config
    timed: bool = False

    @property
    def torch_x_dtype(self) -> torch.dtype:
        return _DT[self.x_dtype]

    @property
    def torch_out_dtype(self) -> torch.dtype:
        return _DT[self.out_dtype]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def mma(tile_m=8, tile_n=128, tile_k=256, split_k=1, num_warps=4, stages=4, pdl=True) -> dict:
    return dict(family="mma", tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, split_k=split_k, num_warps=num_warps,
                stages=stages, pdl=pdl)


def wgmma(tile_m=64, tile_n=256, tile_k=128, split_k=1, num_warps=8, stages=4, pdl=True) -> dict:
    return dict(family="wgmma", tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, split_k=split_k, num_warps=num_warps,
                stages=stages, pdl=pdl)


def timing_cases() -> list[Case]:
    """The policy's pick on every shape at M = 1..64 (the issue-14 targets)."""
    return [Case(f"{nm}.m{m}", m, n, k, timed=True) for nm, (n, k) in LLAMA_SHAPES.items() for m in TIMING_M]


def numeric_cases() -> list[Case]:
    """Numerics beyond the timed (plain-epilogue) cases: every epilogue part, fp16, W4A4 (qdq),
    split-K (forced; in-kernel reduction), ragged N / M tails, K not a multiple of the stage and of
    256 (padded), subnormal / zero / negative block scales, both families."""
    return [
        Case("ragged.n1000.m3", 3, 1000, 4096),
        Case("ragged.k4128.m5", 5, 1032, 4128),  # K % 256 != 0: the last stage is partly padding
        Case("ragged.m13.splitk3", 13, 2056, 6144, config=mma(tile_m=16, split_k=3)),
        Case("epi.bias.silu.vector", 2, 4096, 4096, activation="silu", bias=True, vector_alpha=True),
        Case("epi.gelu.fp16.out32", 4, 2048, 8192, activation="gelu_tanh", x_dtype="fp16", out_dtype="fp32"),
        Case("epi.silu_mul.res", 1, 28672, 4096, activation="silu_mul", bias=True, residual=True),
        Case("epi.silu_mul.splitk", 7, 8192, 8192, activation="silu_mul", residual=True,
             config=mma(tile_m=8, split_k=4, stages=3)),
        Case("w4a4.qdq.m1", 1, 4096, 4096, w4a4=True),
        Case("w4a4.qdq.m9.fp16", 9, 6144, 4096, w4a4=True, x_dtype="fp16", out_dtype="fp16"),
        Case("m100.k4128", 100, 1000, 4128),  # M > 32: M tiles; K padded
        Case("mma.m32.fp16.gelu.vector", 32, 2048, 8192, activation="gelu_tanh", vector_alpha=True, x_dtype="fp16",
             out_dtype="fp16", config=mma(tile_m=32, tile_n=128, num_warps=4, stages=3)),
        Case("mma.m3.k14336.split7", 3, 4096, 14336, config=mma(split_k=7)),
        Case("mma.u2.w2.s3", 6, 1536, 2048, config=mma(tile_n=64, tile_k=128, num_warps=2, stages=3)),
        # the kernels tests/gpu runs with a weight holding every e4m3 scale byte (policy configs)
        Case("scales.allbytes.bf16", 3, 256, 256, out_dtype="fp32"),
        Case("scales.allbytes.fp16", 3, 256, 256, x_dtype="fp16", out_dtype="fp32"),
        Case("scales.allbytes.bf16.wgmma", 3, 256, 256, out_dtype="fp32", config=wgmma(tile_m=16, tile_n=128, num_warps=4)),
        Case("scales.allbytes.fp16.wgmma", 3, 256, 256, x_dtype="fp16", out_dtype="fp32",
             config=wgmma(tile_m=16, tile_n=128, num_warps=4)),
        # WGMMA family (register-A decode, tokens as the WGMMA's N): M and K tails, every epilogue
        # part, fp16, split-K, W4A4 via qdq, one and two warpgroups, tile_k 128 / 256, 3-4 stages
        Case("wgmma.m48.ragged", 48, 1000, 4096, config=wgmma(tile_m=48, tile_n=128)),
        Case("wgmma.m200.silu_mul.res", 200, 8192, 4096, activation="silu_mul", bias=True, residual=True,
             config=wgmma(tile_m=104)),
        Case("wgmma.m96.fp16.gelu.vector", 96, 2048, 2048, activation="gelu_tanh", vector_alpha=True,
             x_dtype="fp16", out_dtype="fp16", config=wgmma(tile_m=96, tile_n=128, num_warps=4)),
        Case("wgmma.m64.splitk3", 64, 1024, 8192, config=wgmma(tile_m=64, split_k=3)),  # 4 tiles: all split
        # 140 tiles on 132 SMs: 132 whole tiles, then the last 8 as 3 split CTAs each
        Case("wgmma.m40.wholes_and_tail.sk3", 40, 17920, 1024, config=wgmma(tile_m=40, tile_n=128, split_k=3)),
        Case("wgmma.m130.w4a4", 130, 4096, 4096, w4a4=True, config=wgmma(tile_m=72)),
        Case("wgmma.m256.k4128.t256", 256, 1032, 4128, config=wgmma(tile_m=256, tile_n=128, stages=3)),
        Case("wgmma.m17.k96.t24", 17, 512, 96, config=wgmma(tile_m=24, tile_n=256, tile_k=256, stages=3)),
        Case("wgmma.m33.fp16.out32.nopdl", 33, 2048, 4096, x_dtype="fp16", out_dtype="fp32",
             config=wgmma(tile_m=40, tile_n=128, pdl=False)),
    ]


def variant_cases() -> list[Case]:
    """Timed alternatives to the policy's pick, so one H200 run ranks the configs and checks the
    model: tiles / warps / ring depth / split-K / PDL of the decode kernel at M <= 32, and the WGMMA
    family's tokens per CTA, rows per CTA and stage shapes at M = 32..256."""
    out = []
    for shape in ("8b.gate_up", "8b.down", "8b.o", "70b.down"):
        n, k = LLAMA_SHAPES[shape]
        for m in (1, 16, 32):
            tm = 8 if m <= 8 else (16 if m <= 16 else 32)
            alts = {
                "w4rt2s4": mma(tile_m=tm, tile_n=128, num_warps=4, stages=4),
                "w4rt2s3": mma(tile_m=tm, tile_n=128, num_warps=4, stages=3),
                "w2rt4s4": mma(tile_m=tm, tile_n=128, num_warps=2, stages=4) if tm < 32 else None,
                "w4rt4s3": mma(tile_m=tm, tile_n=256, num_warps=4, stages=3) if tm < 32 else None,
                "w4rt2s4.nopdl": mma(tile_m=tm, tile_n=128, num_warps=4, stages=4, pdl=False),
            }
            for split in (2, 4, 8):
                alts[f"w4rt2s4.sk{split}"] = mma(tile_m=tm, tile_n=128, num_warps=4, stages=4, split_k=split)
            if m == 32:
                alts["wg32x256"] = wgmma(tile_m=32)
            for nm, cfg in alts.items():
                if cfg is not None:
                    out.append(Case(f"{shape}.m{m}.{nm}", m, n, k, config=cfg, timed=True))
        for m in (64, 128, 256):
            alts = {
                "mma32": mma(tile_m=32, tile_n=128, num_warps=8, stages=3),
                "wg64x256": wgmma(tile_m=64),
                "wg64x256k256": wgmma(tile_m=64, tile_k=256, stages=3),
                "wg64x128": wgmma(tile_m=64, tile_n=128),
                "wg128x256": wgmma(tile_m=128),
                "wg256x128": wgmma(tile_m=256, tile_n=128, stages=3) if m == 256 else None,
                "wg64x256.nopdl": wgmma(tile_m=64, pdl=False),
                "wg64x256.sk2": wgmma(tile_m=64, split_k=2),
            }
            for nm, cfg in alts.items():
                if cfg is not None:
                    out.append(Case(f"{shape}.m{m}.{nm}", m, n, k, config=cfg, timed=True))
    return out


def all_cases() -> list[Case]:
    return timing_cases() + numeric_cases() + variant_cases()
