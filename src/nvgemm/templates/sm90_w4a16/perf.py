"""Facts of the sm_90a W4A16 families ``mma`` and ``wgmma`` (``templates/sm90_w4a16/``).

Both read the prepared operand of ``templates/sm90_w4a16/operand.py`` (0.5625 bytes per weight element;
N padded to 16-row tiles, K to a multiple of 256) and run one kernel per call: split-K partials
are summed in-kernel by the CTA that arrives last at its tile's counter, the host allocates
nothing per call and launches no helper kernel for W4A16 (:data:`HOST_AUX_KERNELS` = 0).

``mma`` (the decode kernel): a CTA ring of ``stages`` cp.async stages; every copy is an
``LDGSTS`` (the stream-load pattern), so the SASS replay of the main loop -- which honours the
``DEPBAR.LE SB0, stages - 2`` at its top -- yields about ``1 / (stages - 1)`` serial DRAM round
trips per iteration. One iteration = one stage = ``tile_k`` K for the CTA's ``tile_n`` rows;
a thread consumes ``row_tiles x chunks x 32`` weight elements of it. Bytes in flight per CTA:
``stages - 1`` stages (:attr:`Geometry.depth`). M tiles run last in the grid (``grid_m``), so
with more than one the weights come from DRAM again unless they fit in L2 (80 % of it).

``wgmma`` (register-A WGMMA, tens to hundreds of tokens per CTA): the same cp.async ring, every
copy an ``LDGSTS`` (weights, scales and the 4-byte activation pairs), ``stages - 2`` stages in
flight ahead of the math (:attr:`Geometry.depth`; the SASS replay's ``DEPBAR.LE SB0, stages - 3``,
and ``min_round_trips`` = 1 / (stages - 2)). One iteration = one stage; a thread decodes
``row_tiles x chunks x 32`` weight elements of it. The grid runs the M tiles of a row block side
by side (M-fastest), so the weights come from DRAM once per wave of resident M tiles and the
other M tiles' weight loads hit L2. Tensor floor: the WGMMA FLOPs incl. tile padding at
:data:`WGMMA_TENSOR_EFFICIENCY` of the dense bf16 rate -- the efficiency the bf16 cuBLAS baseline
is given (:data:`nvgemm.heuristics.perfmodel.baseline.TENSOR_EFFICIENCY`), an assumption for both.

Main-loop identity (:meth:`loop_key`): both families compile one main loop per (tile_m, tile_n,
tile_k, num_warps, stages, pdl) -- split_k does not change it (pdl moves ~2 % of the loop's
instructions).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from nvgemm.templates.sm90_w4a16.config import (
    CHUNK,
    K_ALIGN,
    MMA_ROW_TILES,
    MMA_TILE_M,
    ROW_TILE,
    WGMMA_SHAPES,
    WGMMA_TILE_M,
    Sm90W4A16Config,
    config_from_name,
    mma_stage_bytes,
    shape_problem,
    validate_config,
    wgmma_stage_bytes,
    wgmma_tail_tiles,
)

from nvgemm.heuristics.perfmodel.baseline import TENSOR_EFFICIENCY
from nvgemm.heuristics.perfmodel.facts import FamilyFacts, Geometry, SplitKReduce, ceil_div
from nvgemm.heuristics.perfmodel.hardware import Hardware

#: bytes per weight element streamed: 0.5 (E2M1) + 1/16 (one scale byte per 16)
NVFP4_BYTES = 0.5625
#: helper kernels the sm90 W4A16 host path launches per call (none: no fills, no reduce kernel)
HOST_AUX_KERNELS = 0
#: fraction of L2 a streamed weight may occupy and still be re-read from L2 by later M tiles
L2_REUSE_FRACTION = 0.8
SM90_SPLITS = (1, 2, 3, 4, 6, 7, 8)
#: serial L2 round trips on the critical path of an in-kernel split-K reduction: partial stores +
#: fence, the counter atomic, the (batched) partial loads of the last CTA
SPLITK_L2_TRIPS = 3.0
#: share of the dense bf16 tensor-core rate the wgmma family reaches (the baseline's assumption)
WGMMA_TENSOR_EFFICIENCY = TENSOR_EFFICIENCY


def _pad(n: int, k: int) -> tuple[int, int]:
    return ceil_div(n, ROW_TILE) * ROW_TILE, ceil_div(k, K_ALIGN) * K_ALIGN


@lru_cache(maxsize=1024)
def _weight_bytes(n: int, k: int) -> float:
    """Padded weight + scale bytes (memoised: every config priced for a shape asks it)."""
    n_pad, k_pad = _pad(n, k)
    return n_pad * k_pad * NVFP4_BYTES


def _fits_l2(n: int, k: int, hw: Hardware) -> bool:
    return _weight_bytes(n, k) <= L2_REUSE_FRACTION * hw.l2_mb * 1e6


def _dram(n: int, k: int, m: int, grid_m: int, hw: Hardware, work: float = 0.0) -> float:
    reread = 1 if (grid_m == 1 or _fits_l2(n, k, hw)) else grid_m
    return _weight_bytes(n, k) * reread + m * k * 2 + m * n * 2 + work


def _l2_reread(n: int, k: int, grid_m: int, hw: Hardware) -> float:
    """Share of main-loop iterations whose weight loads hit L2: every M tile after the first, when
    the weights fit in L2 (M tiles run last in the grid)."""
    return (grid_m - 1) / grid_m if _fits_l2(n, k, hw) else 0.0


def _splitk(c: Sm90W4A16Config, m: int, n: int) -> tuple[SplitKReduce | None, float]:
    if c.split_k <= 1:
        return None, 0.0
    n_pad, _ = _pad(n, 1)
    ws = float(c.split_k * m * n_pad * 4) * 2  # fp32 partials written, then read by the last CTA
    return _reduce(c.split_k, ws), ws


@lru_cache(maxsize=4096)
def _reduce(splits: int, workspace: float) -> SplitKReduce:
    """The in-kernel batched reduction record (memoised: a frozen dataclass is slow to build)."""
    return SplitKReduce("batched", splits, workspace, dependent_l2_trips=SPLITK_L2_TRIPS)


@lru_cache(maxsize=4096)
def _stage(c: Sm90W4A16Config) -> tuple[int, int]:
    """(weight + scale bytes, activation bytes) of one stage of ``c`` (shape-independent)."""
    sb = mma_stage_bytes(c) if c.family == "mma" else wgmma_stage_bytes(c)
    return sb["weights"] + sb["scales"], c.tile_m * c.tile_k * 2


class _Sm90Base(FamilyFacts):
    arch = "sm_90a"
    engine = "sass_chain"
    family_field = ""
    dynamic_smem = True

    def matches(self, config) -> bool:
        return isinstance(config, Sm90W4A16Config) and config.family == self.family_field

    def template_id(self, config) -> str:
        return f"sm90_w4a16_{config.family}"

    def shape_problem(self, c, m, n, k):
        return shape_problem(c, m, n, k)

    def loop_key(self, config):
        """The main loop depends on neither split_k (a split runs fewer iterations of the same loop) nor
        pdl (``griddepcontrol`` sits before the ring's prologue and after the loop): the archs without PDL
        (sm_8x) price their configs with the PDL twin's main-loop facts."""
        return (self.name, config.tile_m, config.tile_n, config.tile_k, config.num_warps, config.stages)

    def batch_row(self, c) -> tuple:
        """The shape-independent integers :meth:`geometry_batch` reads of one config."""
        stream, other = _stage(c)
        return (c.family == "wgmma", c.tile_m, c.tile_n, c.tile_k, c.split_k, c.stages, c.threads, stream, other,
                c.pdl)

    def geometry_rows(self, rows, m: int, n: int, k: int, hw: Hardware) -> list:
        """:meth:`geometry` of each config (``rows``: one :meth:`batch_row` each) as a plain tuple
        ``(ctas, threads, iters_per_cta, stream bytes, other bytes, DRAM bytes, depth, L2 trips of
        the reduction, l2_reread_fraction, tensor FLOPs, tensor TFLOPS, tail_ctas, tail_iters,
        pdl)``: the scalar loop of ``nvgemm.heuristics.perfmodel.batch`` for small groups, where numpy's fixed
        cost exceeds it. The same operations as ``MmaFacts.geometry`` / ``WgmmaFacts.geometry``
        (``tests/cpu/test_policy_speed.py`` checks them bit for bit)."""
        n_pad, k_pad = _pad(n, k)
        wb = _weight_bytes(n, k)
        fits = _fits_l2(n, k, hw)
        sms = hw.sm_count
        act, out_b = m * k * 2, m * n * 2
        tf_wg, tf_mma = hw.bf16_tflops * WGMMA_TENSOR_EFFICIENCY, hw.bf16_tflops * hw.mma_sync_fraction
        out = []
        for wg, tm, tn, tk, s, stages, threads, stream, other, pdl in rows:
            grid_n, grid_m = -(-n // tn), -(-m // tm)
            n_stage = k_pad // tk
            if wg:
                tiles = grid_n * grid_m
                tail = wgmma_tail_tiles(tiles, s, sms)
                ws = float(tail * s * tm * tn * 4) * 2 if tail else 0.0
                out.append((tiles + tail * (s - 1), threads, n_stage, stream, other,
                            wb * -(-grid_m // sms) + act + out_b + ws, float(stages - 2),
                            SPLITK_L2_TRIPS if tail else 0.0, (grid_m - 1) / grid_m,
                            2.0 * grid_m * tm * grid_n * tn * k_pad, tf_wg, tail * s, -(-n_stage // s), pdl))
            else:
                ws = float(s * m * n_pad * 4) * 2 if s > 1 else 0.0
                reread = 1 if (grid_m == 1 or fits) else grid_m
                out.append((grid_n * s * grid_m, threads, -(-n_stage // s), stream, other,
                            wb * reread + act + out_b + ws, float(stages - 1),
                            SPLITK_L2_TRIPS if s > 1 else 0.0, (grid_m - 1) / grid_m if fits else 0.0,
                            2.0 * grid_m * tm * n_pad * k_pad, tf_mma, 0, 0, pdl))
        return out

    def geometry_batch(self, rows, m: int, n: int, k: int, hw: Hardware) -> dict:
        """:meth:`geometry` of many configs of both sm90 families for one shape, as numpy arrays
        (``rows``: one :meth:`batch_row` per config; ``nvgemm.heuristics.perfmodel.batch``). The same
        operations as the scalar ``MmaFacts.geometry`` / ``WgmmaFacts.geometry`` in the same
        order, per family selected with ``np.where`` (``tests/cpu/test_policy_speed.py`` checks
        them bit for bit). ``m``, ``n``, ``k`` may also be integer arrays, one shape per config
        (``batch.gemm_totals`` prices several shapes in one call; ``tests/cpu/test_moe_policy_speed.py``)."""
        import numpy as np

        wg, tm, tn, tk, s, stages, threads, stream, other, pdl = rows.T[:10]
        wg = wg.astype(bool)
        any_wg, all_wg = bool(wg.any()), bool(wg.all())

        def sel(f_wg, f_mma):  # per config its family's value (only the families present computed)
            return f_wg() if all_wg else f_mma() if not any_wg else np.where(wg, f_wg(), f_mma())

        n_pad, k_pad = _pad(n, k)
        if isinstance(n, np.ndarray):  # one shape per config (``batch.gemm_totals``): _weight_bytes' product
            wb = n_pad * k_pad * NVFP4_BYTES
            fits = wb <= L2_REUSE_FRACTION * hw.l2_mb * 1e6  # _fits_l2, per config
        else:
            wb = _weight_bytes(n, k)
            fits = _fits_l2(n, k, hw)
        grid_n, grid_m = -(-n // tn), -(-m // tm)
        n_stage = k_pad // tk
        split_iters = -(-n_stage // s)
        sms = hw.sm_count
        # wgmma: only the last partial wave's tiles split (wgmma_tail_tiles)
        tiles = grid_n * grid_m
        tail = np.where(s <= 1, 0, np.where(tiles < sms, tiles, tiles % sms)) if any_wg else None

        def mma_dram():  # every CTA a K slice; weights re-read per M tile unless they fit in L2
            ws = np.where(s > 1, (s * m * n_pad * 4).astype(float) * 2, 0.0)
            reread = np.where(grid_m == 1, 1, np.where(fits, 1, grid_m))
            return wb * reread + m * k * 2 + m * n * 2 + ws

        def wg_dram():
            ws = np.where(tail != 0, (tail * s * tm * tn * 4).astype(float) * 2, 0.0)
            return wb * -(-grid_m // sms) + m * k * 2 + m * n * 2 + ws

        zeros = np.zeros(s.shape, dtype=np.int64)
        return {
            "ctas": sel(lambda: tiles + tail * (s - 1), lambda: grid_n * s * grid_m),
            "threads": threads,
            "iters_per_cta": sel(lambda: n_stage, lambda: split_iters),
            "passes_per_cta": np.ones_like(s),
            "stream_bytes_per_iter": stream,
            "other_bytes_per_iter": other,
            "dram_bytes": sel(wg_dram, mma_dram),
            "depth": sel(lambda: stages - 2, lambda: stages - 1).astype(float),
            "trips": sel(lambda: np.where(tail != 0, SPLITK_L2_TRIPS, 0.0),
                         lambda: np.where(s > 1, SPLITK_L2_TRIPS, 0.0)),
            "l2_reread_fraction": sel(lambda: (grid_m - 1) / grid_m,
                                      lambda: np.where(fits, (grid_m - 1) / grid_m, 0.0)),
            "tensor_flops": sel(lambda: 2.0 * grid_m * tm * grid_n * tn * k_pad,
                                lambda: 2.0 * grid_m * tm * n_pad * k_pad),
            "tensor_tflops": sel(lambda: np.full(s.shape, hw.bf16_tflops * WGMMA_TENSOR_EFFICIENCY),
                                 lambda: np.full(s.shape, hw.bf16_tflops * hw.mma_sync_fraction)),
            "tail_ctas": sel(lambda: tail * s, lambda: zeros),
            "tail_iters": sel(lambda: split_iters, lambda: zeros),
            "epilogue_cycles": np.zeros(s.shape),
            "extra_launches": zeros,
            "aux_kernels": np.full(s.shape, HOST_AUX_KERNELS),
            "pdl": pdl.astype(bool),
        }

    def elems_per_thread_iter(self, c) -> float:
        """Weight elements a thread decodes per main-loop iteration: row tiles x chunks x 32."""
        return c.row_tiles * c.chunks_per_stage * 32

    def parse_name(self, name: str):
        try:
            c = config_from_name(name)
        except ValueError:
            return None
        return c if self.matches(c) else None


class MmaFacts(_Sm90Base):
    name = "sm90.mma"
    family_field = "mma"
    stream_load = r"^LDGSTS"

    def min_round_trips(self, c) -> float:
        return 1.0 / (c.stages - 1)

    def geometry(self, c, m, n, k, hw):
        n_pad, k_pad = _pad(n, k)
        grid_n, grid_m = ceil_div(n, c.tile_n), ceil_div(m, c.tile_m)
        n_stage = k_pad // c.tile_k
        iters = ceil_div(n_stage, c.split_k)
        stream, other = _stage(c)
        sk, ws = _splitk(c, m, n)
        return Geometry(
            ctas=grid_n * c.split_k * grid_m, threads=c.threads, iters_per_cta=iters, passes_per_cta=1,
            stream_bytes_per_iter=stream, other_bytes_per_iter=other,
            dram_bytes=_dram(n, k, m, grid_m, hw, work=ws), weight_bytes=_weight_bytes(n, k),
            depth=float(c.stages - 1), aux_kernels=HOST_AUX_KERNELS, splitk=sk, pdl=c.pdl,
            l2_reread_fraction=_l2_reread(n, k, grid_m, hw),
            tensor_flops=2.0 * grid_m * c.tile_m * n_pad * k_pad, tensor_tflops=hw.bf16_tflops * hw.mma_sync_fraction,
        )

    def _bases(self) -> list:
        out = []
        for tm in MMA_TILE_M:
            for w in (2, 4, 8):
                for rt in MMA_ROW_TILES:
                    for st in (3, 4):
                        c = Sm90W4A16Config("mma", tile_m=tm, tile_n=ROW_TILE * rt * w, tile_k=4 * CHUNK,
                                            num_warps=w, stages=st, pdl=True)
                        if validate_config(c) and c.tile_n <= 256:
                            out.append(c)
        return out

    def table_configs(self) -> list:
        return self._bases()

    def search_space(self, m: int) -> list:
        out = []
        for base in self._bases():
            if base.tile_m < min(m, 32) and base.tile_m != 32:
                continue  # more M tiles than needed: never faster (weights re-read)
            for s in SM90_SPLITS:
                out.append(replace(base, split_k=s))
        return out


class WgmmaFacts(_Sm90Base):
    name = "sm90.wgmma"
    family_field = "wgmma"
    stream_load = r"^LDGSTS"

    def min_round_trips(self, c) -> float:
        return 1.0 / (c.stages - 2)

    def geometry(self, c, m, n, k, hw):
        n_pad, k_pad = _pad(n, k)
        grid_n, grid_m = ceil_div(n, c.tile_n), ceil_div(m, c.tile_m)
        n_stage = k_pad // c.tile_k
        stream, other = _stage(c)
        tiles = grid_n * grid_m
        # split_k > 1: only the tiles of the last, partial wave (tiles mod SMs; all of them when
        # fewer than the SMs) are split in K, each into split_k CTAs after the full waves
        tail = wgmma_tail_tiles(tiles, c.split_k, hw.sm_count)
        sk, ws = None, 0.0
        if tail:
            ws = float(tail * c.split_k * c.tile_m * c.tile_n * 4) * 2  # fp32 partials written + read
            sk = _reduce(c.split_k, ws)
        # M-fastest grid: the M tiles of a row block run side by side and share its weights in L2;
        # only M tiles that fall into a later wave of CTAs (one CTA per SM at least) read them again
        waves_m = ceil_div(grid_m, hw.sm_count)
        dram = _weight_bytes(n, k) * waves_m + m * k * 2 + m * n * 2 + ws
        return Geometry(
            ctas=tiles + tail * (c.split_k - 1), threads=c.threads, iters_per_cta=n_stage, passes_per_cta=1,
            stream_bytes_per_iter=stream, other_bytes_per_iter=other,
            dram_bytes=dram, weight_bytes=_weight_bytes(n, k), depth=float(c.stages - 2),
            aux_kernels=HOST_AUX_KERNELS, splitk=sk, pdl=c.pdl, l2_reread_fraction=(grid_m - 1) / grid_m,
            tensor_flops=2.0 * grid_m * c.tile_m * grid_n * c.tile_n * k_pad,
            tensor_tflops=hw.bf16_tflops * WGMMA_TENSOR_EFFICIENCY,
            tail_ctas=tail * c.split_k, tail_iters=ceil_div(n_stage, c.split_k),
        )

    def _bases(self) -> list:
        """Every tile_m with the policy's warp / row-block / stage shapes
        (:data:`nvgemm.templates.sm90_w4a16.config.WGMMA_SHAPES`, pdl on)."""
        out = []
        for tm in WGMMA_TILE_M:
            for tn, w, tk, st in WGMMA_SHAPES:
                c = Sm90W4A16Config("wgmma", tile_m=tm, tile_n=tn, tile_k=tk, num_warps=w, stages=st, pdl=True)
                if validate_config(c):
                    out.append(c)
        return out

    def table_configs(self) -> list:
        return self._bases()

    def search_space(self, m: int) -> list:
        out = []
        for base in self._bases():
            if -(-m // base.tile_m) > 4 and base.tile_m != WGMMA_TILE_M[-1]:
                continue  # more than 4 M tiles per row block: never the fastest
            for s in SM90_SPLITS:
                out.append(replace(base, split_k=s))
        return out


__all__ = ["HOST_AUX_KERNELS", "MmaFacts", "NVFP4_BYTES", "WGMMA_TENSOR_EFFICIENCY", "WgmmaFacts"]
