"""Facts of the sm_100a NVFP4 (W4A4) tcgen05 GEMM (``templates/sm100_w4a4/kernel.py``).

A warp-specialised persistent kernel: a TMA warp fills ``stages`` shared-memory stages of one
256-deep K tile each, an MMA warp consumes them, four epilogue warps drain TMEM. For decode the
kernel is a weight stream, so the model (``engine = "pipeline"``) uses bytes in flight and
pipeline depth, not instruction counts:

* stage bytes (per CTA): A ``cta_m x 128`` + B ``tile_n / v x 128`` (v = 2 for 2-CTA tiles) +
  SFA ``cta_m x 16`` + SFB ``round_up(tile_n, 128) x 16`` (scale tiles are whole 128-row atoms);
  the weight side is A + SFA with swap-AB, B + SFB without;
* stages = ``clamp((232448 - 2048 - C staging) // stage_bytes, 2, 12)`` -- the template's
  ``_compute_ab_stages``; the SASS tool reads the compiled kernel's dynamic shared memory and the
  compile test checks the formula against it;
* TMEM columns: accumulators ``tile_n x acc_stages`` (acc_stages 1 at tile_n 256, else 2) + SFA
  ``cta_m / 32 x 4`` + SFB ``round_up(tile_n, 128) / 32 x 4`` <= 512;
* persistent grid = min(work units, :func:`persistent_ctas`) -- the launcher's own bound
  (:func:`nvgemm.templates.sm100_w4a4.kernel.max_active_clusters_for` bakes
  :func:`nvgemm.templates.sm100_w4a4.occupancy.aot_max_active_clusters` into the kernel: the clusters
  the arch's GPC topology guarantees, x cluster size); one function, so model and launcher agree;
* work units = M tiles x N tiles (rounded up to whole clusters) x split_k; the busiest CTA takes
  ``ceil(units / grid)`` units of ``ceil(K tiles / split_k)`` stages each;
* epilogue per unit: ``tile_n / epi_n`` sub-tiles (epi_n = min(tile_n, 32)) at
  :data:`EPI_SUBTILE_CYCLES` each; with two accumulator stages only the last unit's epilogue is
  exposed, with one (tile_n 256) every unit's is;
* split-K (S > 1): each unit stores its fp32 partial, fences and bumps a counter (2 dependent L2
  round trips); the last split of a tile then reduces. The current kernel's reduce is "batched"
  (all partial loads of a round issued first as 16-byte vectors, then a fixed-order sum): one
  round trip per sub-tile. The kernel before (nvgemm b453ecf) had a rolled per-element loop:
  ``sub-tiles x epi_n x (S - 1)`` dependent L2 round trips per thread. Which one a compiled kernel
  has is read from its SASS (``rolled_reduce`` in the table: a loop outside the main pipeline
  holding one 32-bit LDG and an FADD); configs not in the table take :data:`DEFAULT_REDUCE`
  (the current kernel's batched reduce);
* DRAM bytes: weights ``N x K / 2`` + swizzled weight scales ``round_up(N, 128) x
  round_up(K/16, 4)`` + activations ``M x K / 2`` + activation scales padded to 128 rows +
  output;
* host path per call (``templates/sm100_w4a4/launch.prepare_sm100_args``): the activation quantize
  kernel and the ``input_scale * weight_scale_2`` product -> :data:`HOST_AUX_KERNELS` = 2.
"""

from __future__ import annotations

from nvgemm.templates.sm100_w4a4.config import (
    SM100_SPLIT_K,
    SM100_TILE_K,
    Sm100Nvfp4GemmConfig,
    config_from_name,
    validate_config,
)

from nvgemm.templates.sm100_w4a4.occupancy import aot_max_active_clusters

from nvgemm.heuristics.perfmodel.facts import (
    FamilyFacts,
    Geometry,
    KernelFacts,
    SplitKReduce,
    ceil_div,
)
from nvgemm.heuristics.perfmodel.hardware import Hardware
from nvgemm.heuristics.perfmodel import sass as S

SMEM_CAPACITY = 232448
SMEM_RESERVED = 2048
MAX_STAGES = 12
TMEM_COLS = 512
EPI_SUBTILE_CYCLES = 200  # TMEM load + fp32 epilogue + stores of one 128 x epi_n sub-tile (assumption)
DEFAULT_REDUCE = "batched"
HOST_AUX_KERNELS = 2
NARROW_TILE_N = 64
SWAP_AB_MAX_M = 256


def persistent_ctas(hw: Hardware, cluster_size: int) -> int:
    """CTAs of the persistent grid on ``hw``: the clusters the launcher bakes into the kernel
    (:func:`nvgemm.templates.sm100_w4a4.occupancy.aot_max_active_clusters` -- the same function) x
    the cluster size."""
    return aot_max_active_clusters(hw.arch, hw.sm_count, cluster_size) * cluster_size


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def stage_bytes(c: Sm100Nvfp4GemmConfig) -> dict:
    v = 2 if c.use_2cta else 1
    cta_m = c.tile_m // v
    a = cta_m * SM100_TILE_K // 2
    b = c.tile_n // v * SM100_TILE_K // 2
    sfa = cta_m * SM100_TILE_K // 16
    sfb = round_up(c.tile_n, 128) * SM100_TILE_K // 16
    w, act = (a + sfa, b + sfb) if c.swap_ab else (b + sfb, a + sfa)
    return {"a": a, "b": b, "sfa": sfa, "sfb": sfb, "total": a + b + sfa + sfb, "weight": w, "activation": act}


def c_smem_bytes(c: Sm100Nvfp4GemmConfig, out_bytes: int = 2) -> int:
    """Shared memory of the TMA-store epilogue (native tiles only; swap-AB stores from registers):
    two staged 128 x min(tile_n, 32) output sub-tiles (reference epilogue: bf16 out, not gated)."""
    if c.swap_ab:
        return 0
    cta_m = c.tile_m // (2 if c.use_2cta else 1)
    return cta_m * min(c.tile_n, 32) * 2 * out_bytes


def num_stages(c: Sm100Nvfp4GemmConfig) -> int:
    free = SMEM_CAPACITY - SMEM_RESERVED - c_smem_bytes(c)
    return max(2, min(MAX_STAGES, free // stage_bytes(c)["total"]))


def tmem_columns(c: Sm100Nvfp4GemmConfig) -> int:
    v = 2 if c.use_2cta else 1
    acc_stages = 1 if c.tile_n == 256 else 2
    return c.tile_n * acc_stages + (c.tile_m // v // 32) * 4 + (round_up(c.tile_n, 128) // 32) * 4


class Sm100Facts(FamilyFacts):
    name = "sm100.nvfp4"
    arch = "sm_100a"
    engine = "pipeline"
    stream_load = r"^UTMALDG"
    dynamic_smem = True

    def matches(self, config) -> bool:
        return isinstance(config, Sm100Nvfp4GemmConfig)

    def template_id(self, config) -> str:
        return "sm100_nvfp4_gemm"

    def parse_name(self, name: str):
        try:
            return config_from_name(name)
        except ValueError:
            return None

    def elems_per_thread_iter(self, c) -> float:
        return 0.0  # warp-specialised: instruction counts are not the model's input

    def loop_key(self, c):
        # stages and the split-K reduction do not depend on pdl / l2_prefetch
        return (self.name, c.tile_m, c.tile_n, c.cluster_m, c.cluster_n, c.swap_ab, c.split_k)

    def shape_problem(self, c, m, n, k):
        if k % 32:
            return f"K={k} is not a multiple of 32"
        if c.split_k > ceil_div(k, SM100_TILE_K):
            return f"split_k={c.split_k} exceeds the {ceil_div(k, SM100_TILE_K)} K tiles"
        kn = m if c.swap_ab else n
        if c.tile_n < NARROW_TILE_N and kn > c.tile_n:
            return f"narrow tile_n={c.tile_n} needs the kernel-N extent ({kn}) <= tile_n"
        if c.swap_ab and m > SWAP_AB_MAX_M:
            return f"swap-AB serves M <= {SWAP_AB_MAX_M}"
        if tmem_columns(c) > TMEM_COLS:
            return f"TMEM over-subscribed ({tmem_columns(c)} columns)"
        return None

    def estimate_static(self, c) -> KernelFacts | None:
        sb = stage_bytes(c)
        st = num_stages(c)
        return KernelFacts(
            config=c.name(), arch=self.arch, family=self.name, regs=0, smem_bytes=st * sb["total"] + SMEM_RESERVED,
            extra={"stages": st, "stage_bytes": sb["total"], "tmem_cols": tmem_columns(c),
                   "rolled_reduce": DEFAULT_REDUCE == "rolled" and c.split_k > 2},
            source="estimate",
        )

    def geometry(self, c, m, n, k, hw: Hardware, reduce_kind: str | None = None) -> Geometry:
        v = 2 if c.use_2cta else 1
        cta_m = c.tile_m // v
        km, kn = (n, m) if c.swap_ab else (m, n)
        tiles_m = round_up(ceil_div(km, cta_m), c.cluster_m)
        tiles_n = round_up(ceil_div(kn, c.tile_n), c.cluster_n)
        units = tiles_m * tiles_n * c.split_k
        csize = c.cluster_m * c.cluster_n
        grid = min(units, persistent_ctas(hw, csize))
        units_per_cta = ceil_div(units, grid)
        k_tiles = ceil_div(k, SM100_TILE_K)
        k_per_unit = ceil_div(k_tiles, c.split_k)
        sb = stage_bytes(c)
        epi_n = min(c.tile_n, 32)
        subtiles = c.tile_n // epi_n
        acc_stages = 1 if c.tile_n == 256 else 2
        epi_unit = subtiles * EPI_SUBTILE_CYCLES
        exposed_units = units_per_cta if acc_stages == 1 else 1
        kb = round_up(ceil_div(k, 16), 4)
        weights = n * k / 2 + round_up(n, 128) * kb
        acts = m * k / 2 + round_up(m, 128) * kb
        dram = weights + acts + m * n * 2
        sk = None
        if c.split_k > 1:
            kind = reduce_kind or DEFAULT_REDUCE
            trips = 2 + (subtiles * epi_n * (c.split_k - 1) if kind == "rolled" else subtiles)
            ws = 2.0 * tiles_m * tiles_n * c.split_k * cta_m * c.tile_n * 4
            sk = SplitKReduce(kind, c.split_k, ws, dependent_l2_trips=trips)
        return Geometry(
            ctas=grid, threads=192, iters_per_cta=units_per_cta * k_per_unit, passes_per_cta=units_per_cta,
            stream_bytes_per_iter=sb["weight"], other_bytes_per_iter=sb["activation"], dram_bytes=dram,
            weight_bytes=weights, depth=num_stages(c), units_per_cta=units_per_cta, total_units=units,
            aux_kernels=HOST_AUX_KERNELS,
            tensor_flops=2.0 * tiles_m * cta_m * tiles_n * c.tile_n * k_tiles * SM100_TILE_K,
            tensor_tflops=hw.fp4_tflops, epilogue_cycles=exposed_units * epi_unit, splitk=sk, persistent=True,
            pdl=c.pdl, resident_ctas=1,
            note=f"{units} work units on {grid} CTAs",
        )

    def extra_facts(self, c, compiled, funcs) -> dict:
        fn = S.find_function(funcs, self.stream_load)
        loops = S.find_loops(fn)
        rolled = False
        for lp in loops:
            if any(lp.contains(o) for o in loops):
                continue  # not innermost
            b = S.body(fn, lp)
            bases = [i.base for i in b]
            if bases.count("LDG") == 1 and "FADD" in bases and not any(x.startswith(("UTMA", "UTC")) for x in bases):
                rolled = True  # one dependent workspace load per iteration: the rolled split-K sum
        sb = stage_bytes(c)
        return {"stages": num_stages(c), "stage_bytes": sb["total"], "tmem_cols": tmem_columns(c),
                "rolled_reduce": rolled}

    # ----------------------------------------------------------------- table and search space
    def table_configs(self) -> list:
        out = []
        for tn in (8, 16, 32, 64, 128):
            for cm in (1, 2, 4):
                for sk in (1, 2):
                    c = Sm100Nvfp4GemmConfig(128, tn, cm, 1, swap_ab=True, split_k=sk)
                    if validate_config(c):
                        out.append(c)
        for tm, tn, cm in ((256, 64, 2), (256, 128, 2), (128, 128, 1), (128, 64, 1)):
            c = Sm100Nvfp4GemmConfig(tm, tn, cm, 1, swap_ab=tm == 256 or tn == 128)
            out.append(c)
        return out

    def search_space(self, m: int) -> list:
        out = []
        for tn in (8, 16, 32, 64, 128):
            for cm in (1, 2, 4):
                for tm in (128, 256):
                    for sk in SM100_SPLIT_K:
                        for pf in (False, True):
                            c = Sm100Nvfp4GemmConfig(tm, tn, cm, 1, swap_ab=True, split_k=sk, l2_prefetch=pf)
                            if validate_config(c):
                                out.append(c)
        return out


__all__ = ["DEFAULT_REDUCE", "HOST_AUX_KERNELS", "Sm100Facts", "num_stages", "persistent_ctas", "stage_bytes", "tmem_columns"]
