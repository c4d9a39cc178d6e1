"""Config space of the sm_90a NVFP4 weight-only (W4A16) kernels; pure Python, no cutlass.

Two families (see the Hopper templates):
  "gemv"   small M (1..32): bandwidth kernel, split-K, 16-byte weight loads, in-register
           FP4 -> bf16 decode.
  "wgmma"  larger M: dequantize weight tiles to bf16 in shared memory, WGMMA.
"""

from __future__ import annotations

from dataclasses import dataclass

from .status import Status

SM90_FAMILIES = ("gemv", "wgmma")
SM90_ARCHS = ("sm_90a",)


@dataclass(frozen=True)
class Sm90W4A16Config:
    family: str = "gemv"
    tile_m: int = 8  # gemv: activation rows per CTA; wgmma: 64 | 128
    tile_n: int = 64  # output columns (weight rows) per CTA
    tile_k: int = 256  # logical K elements per main-loop step
    split_k: int = 1
    num_warps: int = 4
    stages: int = 2
    pdl: bool = True

    def name(self) -> str:
        s = (
            f"nvgemm_cutedsl_sm90_w4a16_{self.family}_t{self.tile_m}x{self.tile_n}x{self.tile_k}"
            f"_w{self.num_warps}_s{self.stages}"
        )
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.pdl:
            s += "_pdl"
        return s


def validate_config(c: Sm90W4A16Config) -> Status:
    if c.family not in SM90_FAMILIES:
        return Status.fail(f"family={c.family!r} not in {SM90_FAMILIES}")
    if c.split_k < 1:
        return Status.fail(f"split_k={c.split_k} must be >= 1")
    if c.num_warps not in (1, 2, 4, 8, 12):
        return Status.fail(f"num_warps={c.num_warps} unsupported")
    if c.tile_k % 32:
        return Status.fail(f"tile_k={c.tile_k} must be a multiple of 32 (16-byte packed-FP4 loads)")
    return Status.success()
