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
TIMING_M = (1, 2, 4, 8, 16, 32, 64, 128)
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


def timing_cases() -> list[Case]:
    return [Case(f"{nm}.m{m}", m, n, k, timed=True) for nm, (n, k) in LLAMA_SHAPES.items() for m in TIMING_M]


MMA = dict(family="mma", tile_m=8, tile_n=16, tile_k=512, split_k=1, num_warps=4, stages=1, pdl=False)


def numeric_cases() -> list[Case]:
    """Numerics beyond the timed (plain-epilogue) cases: every epilogue part, fp16, W4A4 (qdq),
    split-K (forced), ragged N / M tails and K not a multiple of the CTA step."""
    gemv = dict(family="gemv", tile_n=8, tile_k=4096, num_warps=4, stages=1, pdl=False)
    return [
        Case("ragged.n1000.m3", 3, 1000, 4096),
        Case("ragged.k4128.m5", 5, 1032, 4128),  # K % 4096 != 0: last step partially valid
        Case("ragged.m13.splitk3", 13, 2056, 6144, config=dict(gemv, tile_m=4, tile_n=16, split_k=3)),
        Case("epi.bias.silu.vector", 2, 4096, 4096, activation="silu", bias=True, vector_alpha=True),
        Case("epi.gelu.fp16.out32", 4, 2048, 8192, activation="gelu_tanh", x_dtype="fp16", out_dtype="fp32"),
        Case("epi.silu_mul.res", 1, 28672, 4096, activation="silu_mul", bias=True, residual=True),
        Case("epi.silu_mul.splitk", 7, 8192, 8192, activation="silu_mul", residual=True,
             config=dict(gemv, tile_m=8, tile_n=16, split_k=2)),
        Case("w4a4.qdq.m1", 1, 4096, 4096, w4a4=True),
        Case("w4a4.qdq.m9.fp16", 9, 6144, 4096, w4a4=True, x_dtype="fp16", out_dtype="fp16"),
        Case("m100.k4128.gemv8", 100, 1000, 4128),  # M > 32, K % 64 != 0: gemv with tile_m=8 over M tiles
        # WGMMA family (M > 32)
        Case("wgmma.m48.ragged", 48, 1000, 4096),
        Case("wgmma.m200.silu_mul.res", 200, 8192, 4096, activation="silu_mul", bias=True, residual=True),
        Case("wgmma.m96.fp16.gelu.vector", 96, 2048, 2048, activation="gelu_tanh", vector_alpha=True,
             x_dtype="fp16", out_dtype="fp16"),
        Case("wgmma.m64.splitk3", 64, 1024, 8192,
             config=dict(family="wgmma", tile_m=64, tile_n=64, tile_k=64, split_k=3, num_warps=4, stages=2)),
        Case("wgmma.m130.w4a4", 130, 4096, 4096, w4a4=True),
        # small-M tensor-core family (mma.sync; not chosen by the runtime until measured)
        Case("mma.m5.ragged", 5, 1000, 4096, config=dict(MMA, tile_m=8, tile_n=16)),
        Case("mma.m20.silu_mul.res.splitk", 20, 8192, 4096, activation="silu_mul", bias=True, residual=True,
             config=dict(MMA, tile_m=16, tile_n=32, split_k=2)),
        Case("mma.m32.fp16.gelu.vector", 32, 2048, 8192, activation="gelu_tanh", vector_alpha=True, x_dtype="fp16",
             out_dtype="fp16", config=dict(MMA, tile_m=32, tile_n=16, num_warps=8, tile_k=1024)),
        Case("mma.m3.w4a4.k14336", 3, 4096, 14336, w4a4=True, config=dict(MMA, tile_m=8, tile_n=16, tile_k=1024)),
    ]




def variant_cases() -> list[Case]:
    """A small timed config sweep (the policy's pick is one of them) to rank configs on the H200."""
    out = []
    for shape in ("8b.gate_up", "70b.down"):
        n, k = LLAMA_SHAPES[shape]
        for m, variants in (
            (1, [(8, 4096, 4), (16, 4096, 4), (32, 4096, 4), (16, 8192, 4), (16, 8192, 8), (32, 2048, 2)]),
            (4, [(8, 4096, 4), (32, 4096, 4), (16, 8192, 8)]),
        ):
            tm = 1 if m == 1 else 4
            for tn, tk, w in variants:
                cfg = dict(family="gemv", tile_m=tm, tile_n=tn, tile_k=tk, split_k=1, num_warps=w, stages=1, pdl=False)
                out.append(Case(f"{shape}.m{m}.v{tn}x{tk}w{w}", m, n, k, config=cfg, timed=True))
        # where do the tensor-core families overtake the gemv kernel? (the policy switches at M > 32)
        for m in (8, 16, 32):
            cfg = dict(family="wgmma", tile_m=64, tile_n=128, tile_k=64, split_k=1, num_warps=4, stages=4, pdl=False)
            out.append(Case(f"{shape}.m{m}.wgmma64x128", m, n, k, config=cfg, timed=True))
        for m in (1, 4, 8, 16, 32):
            tm = max(8, m)
            for tn, w, u in ((16, 4, 1), (32, 4, 2), (16, 8, 1)):
                cfg = dict(MMA, tile_m=tm, tile_n=tn, tile_k=128 * w * u, num_warps=w)
                out.append(Case(f"{shape}.m{m}.mma{tn}w{w}u{u}", m, n, k, config=cfg, timed=True))
    return out


def all_cases() -> list[Case]:
    return timing_cases() + numeric_cases() + variant_cases()
