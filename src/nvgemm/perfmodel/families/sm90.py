"""Facts of the sm_90a W4A16 families ``gemv``, ``mma`` and ``wgmma`` (templates/sm90_*.py).

All three stream the same operands (``runtime/sm90_launch.py``): re-laid-out E2M1 weights
``[N, K/2]`` and linear e4m3 scales ``[N, K/16]`` (0.5625 bytes per weight element), 16-byte
``ld.global.nc.L1::no_allocate`` weight loads and 2-byte scale loads -- both show up in SASS as
``LDG.E.NA.*`` (the stream-load pattern). Activations are ``ld.global.nc`` through L1
(``LDG.E.128.CONSTANT`` without ``.NA``), modelled at L2 latency and not counted as DRAM bytes
more than once. Grid = (N tiles, split_k, M tiles): M tiles run last, so with ``grid_m > 1`` the
weights come from DRAM again unless they fit in L2 (taken as 80 % of its capacity); re-reads that
hit L2 (later M tiles of weights that fit, a gemv CTA's second M pass) wait for the L2 latency
(``Geometry.l2_reread_fraction``).

Normalisation (weight elements one thread consumes per main-loop iteration):

* gemv: ``U * RP * 32`` (U 16-byte vectors per thread per step, RP weight rows per register pass)
* mma: ``U * 64`` (per 128-element chunk a lane loads one vector of row g and one of row g + 8)
* wgmma: ``tile_n * 64 / threads`` (the CTA's weight tile of one 64-deep K step, shared out)

Main-loop identity (:meth:`loop_key`): gemv and mma compile the same main loop for every tile_n
and split_k with equal (tile_m, tile_k, num_warps); wgmma for equal (tile_m, tile_n).
``tests/compile/test_perfmodel_table.py`` checks that on a pair of configs.

Host path per call (``prepare_sm90_args``): two ``torch.zeros`` fills for the absent bias and
residual -> :data:`HOST_AUX_KERNELS` = 2 tiny kernels; a split-K call launches the fixed-order
reduce kernel as a second launch.
"""

from __future__ import annotations

from dataclasses import replace

from nvgemm.templates.sm90_config import (
    GEMV_MAX_VEC_PER_THREAD,
    GEMV_TILE_M,
    GEMV_VEC_ELEMS,
    GEMV_WARPS,
    MMA_CHUNK,
    MMA_TILE_M,
    Sm90W4A16Config,
    config_from_name,
    gemv_passes,
    validate_config,
)

from ..facts import FamilyFacts, Geometry, SplitKReduce, ceil_div, register_family
from ..hardware import Hardware

#: bytes per weight element streamed: 0.5 (E2M1) + 1/16 (one e4m3 scale per 16)
NVFP4_BYTES = 0.5625
#: tiny kernels the sm90 host path launches per call (``torch.zeros`` dummies for absent bias
#: and residual in ``runtime/sm90_launch.prepare_sm90_args``); set to 0 when that is fixed.
HOST_AUX_KERNELS = 2
#: fraction of L2 a streamed weight may occupy and still be re-read from L2 by later M tiles
L2_REUSE_FRACTION = 0.8
SM90_SPLITS = (1, 2, 4, 8)


def _variants(bases, tile_ns, splits=SM90_SPLITS) -> list:
    """Every valid (base config x tile_n x split_k) variant; ``tile_ns=None`` keeps the base's tile_n."""
    out = []
    for base in bases:
        for tn in tile_ns or (base.tile_n,):
            for s in splits:
                c = replace(base, tile_n=tn, split_k=s)
                if validate_config(c):
                    out.append(c)
    return out


def _weight_bytes(n: int, k: int) -> float:
    return n * k * NVFP4_BYTES


def _fits_l2(n: int, k: int, hw: Hardware) -> bool:
    return _weight_bytes(n, k) <= L2_REUSE_FRACTION * hw.l2_mb * 1e6


def _dram(n: int, k: int, m: int, grid_m: int, hw: Hardware, out_bytes: int = 2, work: float = 0.0) -> float:
    w = _weight_bytes(n, k)
    reread = 1 if (grid_m == 1 or _fits_l2(n, k, hw)) else grid_m
    return w * reread + m * k * 2 + m * n * out_bytes + work


def _l2_reread(n: int, k: int, grid_m: int, m_passes: int, hw: Hardware) -> float:
    """Share of main-loop iterations that re-read weights from L2: every M pass after a CTA's
    first, and (when the weights fit L2) every M tile after the first."""
    in_cta = (m_passes - 1) / m_passes
    first_tile = 1.0 / grid_m if _fits_l2(n, k, hw) else 1.0
    return 1.0 - (1.0 - in_cta) * first_tile


def _splitk(c: Sm90W4A16Config, m: int, n: int) -> tuple[SplitKReduce | None, float, int]:
    if c.split_k <= 1:
        return None, 0.0, 0
    ws = float(c.split_k * m * n * 4)  # fp32 partials: written by the main kernel, read by the reduce kernel
    return SplitKReduce("kernel", c.split_k, ws), ws, 1


class _Sm90Base(FamilyFacts):
    arch = "sm_90a"
    engine = "sass_chain"
    stream_load = r"^LDG\..*\bNA\b"
    family_field = ""

    def matches(self, config) -> bool:
        return isinstance(config, Sm90W4A16Config) and config.family == self.family_field

    def template_id(self, config) -> str:
        return f"sm90_w4a16_{config.family}"

    def loop_key(self, config):
        return (self.name, config.tile_m, config.tile_k, config.num_warps)

    def parse_name(self, name: str):
        try:
            c = config_from_name(name)
        except ValueError:
            return None
        return c if self.matches(c) else None

    def _aux(self) -> int:
        return HOST_AUX_KERNELS


@register_family
class GemvFacts(_Sm90Base):
    name = "sm90.gemv"
    family_field = "gemv"

    def elems_per_thread_iter(self, c) -> float:
        rp, _ = gemv_passes(c)
        return c.vec_per_thread * rp * GEMV_VEC_ELEMS

    def shape_problem(self, c, m, n, k):
        if k % 32:
            return f"K={k} is not a multiple of 32"
        return None

    def geometry(self, c, m, n, k, hw):
        rp, mp = gemv_passes(c)
        nt, u = c.threads, c.vec_per_thread
        grid_n, grid_m = ceil_div(n, c.tile_n), ceil_div(m, c.tile_m)
        kv = k // 32
        n_iter = ceil_div(ceil_div(kv, c.split_k), nt * u)
        passes = (c.tile_n // rp) * (c.tile_m // mp)
        sk, ws, extra = _splitk(c, m, n)
        return Geometry(
            ctas=grid_n * c.split_k * grid_m, threads=nt, iters_per_cta=passes * n_iter, passes_per_cta=passes,
            stream_bytes_per_iter=rp * nt * u * 16 * (1 + 1 / 8), other_bytes_per_iter=mp * nt * u * 64,
            dram_bytes=_dram(n, k, m, grid_m, hw, work=ws), weight_bytes=_weight_bytes(n, k),
            extra_launches=extra, aux_kernels=self._aux(), splitk=sk,
            l2_reread_fraction=_l2_reread(n, k, grid_m, c.tile_m // mp, hw),
        )

    def table_configs(self) -> list:
        out = []
        for tm in GEMV_TILE_M:
            for w in GEMV_WARPS:
                for u in range(1, GEMV_MAX_VEC_PER_THREAD + 1):
                    c = Sm90W4A16Config("gemv", tile_m=tm, tile_n=16, tile_k=GEMV_VEC_ELEMS * 32 * w * u, num_warps=w)
                    if tm <= 16 and validate_config(c):
                        out.append(c)
        return out

    def search_space(self, m: int) -> list:
        """Configs the model searches for its best pick at token count ``m``."""
        return _variants(self.table_configs(), (8, 16, 32, 64))


@register_family
class MmaFacts(_Sm90Base):
    name = "sm90.mma"
    family_field = "mma"

    def elems_per_thread_iter(self, c) -> float:
        return (c.tile_k // (MMA_CHUNK * c.num_warps)) * 64

    def shape_problem(self, c, m, n, k):
        if k % 128:
            return f"the mma family needs K % 128 == 0, got K={k}"
        return None

    def geometry(self, c, m, n, k, hw):
        nw = c.num_warps
        u = c.tile_k // (MMA_CHUNK * nw)
        mg = c.tile_m // 8
        grid_n, grid_m = ceil_div(n, c.tile_n), ceil_div(m, c.tile_m)
        n_iter = ceil_div(ceil_div(k // MMA_CHUNK, c.split_k), nw * u)
        passes = c.tile_n // 16
        sk, ws, extra = _splitk(c, m, n)
        return Geometry(
            ctas=grid_n * c.split_k * grid_m, threads=c.threads, iters_per_cta=passes * n_iter, passes_per_cta=passes,
            stream_bytes_per_iter=nw * u * 16 * MMA_CHUNK * NVFP4_BYTES, other_bytes_per_iter=mg * nw * u * 8 * MMA_CHUNK * 2,
            dram_bytes=_dram(n, k, m, grid_m, hw, work=ws), weight_bytes=_weight_bytes(n, k),
            extra_launches=extra, aux_kernels=self._aux(), splitk=sk,
            tensor_flops=2.0 * grid_m * c.tile_m * grid_n * c.tile_n * k, tensor_tflops=hw.bf16_tflops * hw.mma_sync_fraction,
            l2_reread_fraction=_l2_reread(n, k, grid_m, 1, hw),
        )

    def table_configs(self) -> list:
        out = []
        for tm in MMA_TILE_M:
            for w in GEMV_WARPS:
                for u in (1, 2):
                    c = Sm90W4A16Config("mma", tile_m=tm, tile_n=16, tile_k=MMA_CHUNK * w * u, num_warps=w)
                    if validate_config(c):
                        out.append(c)
        return out

    def search_space(self, m: int) -> list:
        return _variants(self.table_configs(), (16, 32, 64, 128))


@register_family
class WgmmaFacts(_Sm90Base):
    name = "sm90.wgmma"
    family_field = "wgmma"

    def loop_key(self, config):
        return (self.name, config.tile_m, config.tile_n)

    def elems_per_thread_iter(self, c) -> float:
        return c.tile_n * 64 / c.threads

    def shape_problem(self, c, m, n, k):
        if k % 64:
            return f"the wgmma family needs K % 64 == 0, got K={k}"
        return None

    def geometry(self, c, m, n, k, hw):
        grid_n, grid_m = ceil_div(n, c.tile_n), ceil_div(m, c.tile_m)
        n_iter = ceil_div(k // 64, c.split_k)
        sk, ws, extra = _splitk(c, m, n)
        return Geometry(
            ctas=grid_n * c.split_k * grid_m, threads=c.threads, iters_per_cta=n_iter, passes_per_cta=1,
            stream_bytes_per_iter=c.tile_n * 64 * NVFP4_BYTES, other_bytes_per_iter=c.tile_m * 64 * 2,
            dram_bytes=_dram(n, k, m, grid_m, hw, work=ws), weight_bytes=_weight_bytes(n, k),
            extra_launches=extra, aux_kernels=self._aux(), splitk=sk,
            tensor_flops=2.0 * grid_m * c.tile_m * grid_n * c.tile_n * k, tensor_tflops=hw.bf16_tflops,
            l2_reread_fraction=_l2_reread(n, k, grid_m, 1, hw),
        )

    def table_configs(self) -> list:
        out = []
        for tm in (64, 128):
            for tn in (16, 32, 64, 128):
                c = Sm90W4A16Config("wgmma", tile_m=tm, tile_n=tn, tile_k=64, num_warps=4 * tm // 64, stages=2)
                if validate_config(c):
                    out.append(c)
        return out

    def search_space(self, m: int) -> list:
        return _variants(self.table_configs(), None)


__all__ = ["GemvFacts", "HOST_AUX_KERNELS", "MmaFacts", "NVFP4_BYTES", "WgmmaFacts"]
