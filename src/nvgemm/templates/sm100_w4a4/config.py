"""Config space of the sm_100a NVFP4 (W4A4) block-scaled tcgen05 GEMM; pure Python, no cutlass.

Knobs (per style.md, one frozen dataclass per template family):
  tile_m      128 | 256   (256 = 2-CTA MMA: a CTA pair shares one 256-row tile)
  tile_n      8 | 16 | 32 | 64 | 128 | 192 | 256
  tile_k      256 (fixed: four 64-wide block-scaled MMA K steps per stage)
  cluster_m/n 1 | 2 | 4, product <= 16
  swap_ab     compute W·Xᵀ (weights fill the MMA's M side) and write the transposed view
  split_k     1 | 2 | 4 | 8 ... K-slices reduced by the kernel (see the template)
  pdl         launch with programmatic stream serialization + griddepcontrol
  l2_prefetch prefetch weight tiles into L2 ahead of the TMA loads

:func:`validate_config` holds the problem-independent rules; the problem-dependent rule is
:func:`nvgemm.templates.sm100_w4a4.validity.can_implement_problem`, which
``nvgemm.heuristics.can_implement`` (the predicate heuristics and tests use) and the host launcher
both call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvgemm.core.status import Status

TEMPLATE_ID = "sm100_nvfp4_gemm"
SM100_TILE_M = (128, 256)
SM100_TILE_N = (8, 16, 32, 64, 128, 192, 256)
SM100_TILE_K = 256
SM100_CLUSTER = (1, 2, 4)
SM100_SPLIT_K = (1, 2, 4, 8, 16)
SM100_ARCHS = ("sm_100a", "sm_100f", "sm_103a", "sm_110a")


@dataclass(frozen=True)
class Sm100Nvfp4GemmConfig:
    tile_m: int = 128
    tile_n: int = 128
    cluster_m: int = 1
    cluster_n: int = 1
    swap_ab: bool = False
    split_k: int = 1
    pdl: bool = True
    l2_prefetch: bool = False

    @property
    def use_2cta(self) -> bool:
        return self.tile_m == 256

    @property
    def tile_k(self) -> int:
        return SM100_TILE_K

    def name(self) -> str:
        s = f"nvgemm_cutedsl_sm100_nvfp4_t{self.tile_m}x{self.tile_n}x{self.tile_k}_c{self.cluster_m}x{self.cluster_n}"
        if self.swap_ab:
            s += "_swapab"
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.pdl:
            s += "_pdl"
        if self.l2_prefetch:
            s += "_pf"
        return s


_NAME_RE = re.compile(
    r"nvgemm_cutedsl_sm100_nvfp4_t(\d+)x(\d+)x256_c(\d+)x(\d+)(_swapab)?(?:_sk(\d+))?(_pdl)?(_pf)?"
)


def config_from_name(name: str) -> Sm100Nvfp4GemmConfig:
    """Inverse of :meth:`Sm100Nvfp4GemmConfig.name` (autotuned code names its kernel config)."""
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"not an sm100 NVFP4 config name: {name!r}")
    tm, tn, cm, cn, swap, sk, pdl, pf = m.groups()
    return Sm100Nvfp4GemmConfig(tile_m=int(tm), tile_n=int(tn), cluster_m=int(cm), cluster_n=int(cn),
                                swap_ab=bool(swap), split_k=int(sk or 1), pdl=bool(pdl), l2_prefetch=bool(pf))


def validate_config(c: Sm100Nvfp4GemmConfig) -> Status:
    """Problem-independent constraints of the config itself."""
    if c.tile_m not in SM100_TILE_M:
        return Status.fail(f"tile_m={c.tile_m} not in {SM100_TILE_M}")
    if c.tile_n not in SM100_TILE_N:
        return Status.fail(f"tile_n={c.tile_n} not in {SM100_TILE_N}")
    if c.cluster_m not in SM100_CLUSTER or c.cluster_n not in SM100_CLUSTER:
        return Status.fail(f"cluster ({c.cluster_m},{c.cluster_n}) dims must be in {SM100_CLUSTER}")
    if c.cluster_m * c.cluster_n > 16:
        return Status.fail("cluster_m * cluster_n must be <= 16")
    if c.use_2cta and c.cluster_m % 2:
        return Status.fail("tile_m=256 (2-CTA MMA) needs an even cluster_m")
    if c.tile_n < 64 and (c.tile_m != 128 or c.cluster_n != 1):
        return Status.fail(f"narrow tile_n={c.tile_n} needs tile_m=128 and cluster_n=1")
    if c.split_k not in SM100_SPLIT_K:
        return Status.fail(f"split_k={c.split_k} not in {SM100_SPLIT_K}")
    return Status.success()
