"""Config space of the sm_90a NVFP4 weight-only (W4A16) kernels; pure Python, no cutlass.

Two families (see the Hopper templates):

``"gemv"`` (``sm90_w4a16_gemv.py``) small M (1..32): bandwidth kernel, split-K, 16-byte weight
loads, in-register FP4 -> fp32 decode. Field meanings for this family:

    tile_m     activation rows per CTA (1, 2, 4, 8, 16, 32); M > tile_m adds grid rows that
               re-read the weights (served by L2 when they fit)
    tile_n     weight rows (GEMM output columns) per CTA, a multiple of 8 in [8, 128]; a CTA
               walks them in register passes of ``max(1, 8 // tile_m)`` rows
    tile_k     K elements the CTA streams per main-loop step = 32 (a 16-byte vector) x
               threads x vectors-per-thread (1, 2 or 4): 4096 / 8192 / 16384 for 4 warps
    split_k    CTAs along K (partials in an fp32 workspace, fixed-order reduction kernel)
    num_warps  1, 2, 4 or 8 warps per CTA, all splitting K
    stages     1 (the step's loads are all issued before the first use; no smem pipeline)
    pdl        must be False (programmatic dependent launch is not implemented)

``"mma"`` (``sm90_w4a16_mma.py``) M of 4..32 on the tensor cores (mma.sync m16n8k16, weight as the
16-row operand, same operand layout as gemv): tile_m 8 | 16 | 32 (groups of 8 activation rows),
tile_n a multiple of 16 in [16, 128], tile_k = 128 * num_warps * U (U 1..2), stages 1, pdl False.
Not chosen by the policy or the runtime until measured (``bench/gpu_check.py`` times it).

``"wgmma"`` (``sm90_w4a16_wgmma.py``) larger M: dequantize weight tiles to bf16/fp16 in shared
memory, WGMMA with fp32 accumulators. Fields: tile_m 64 | 128 (one warpgroup per 64 rows, so
num_warps = tile_m / 16), tile_n a multiple of 16 in [16, 128], tile_k 64, stages >= 2 (the
current kernel has a single shared-memory stage; the field is kept for the pipelined version),
split_k >= 1, pdl False.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .status import Status

SM90_FAMILIES = ("gemv", "wgmma", "mma")
SM90_ARCHS = ("sm_90a",)

#: gemv weight re-layout: where each element of a 32-bit weight word (8 E2M1 codes, K order,
#: little-endian bytes) lives after ``nvgemm.runtime.sm90_launch.relayout_weight``: element e ->
#: (bit of the lsb of its 3 magnitude bits, bit of its sign). Pair j = elements (2j, 2j+1)
#: decodes to fp16x2 register j holding E2M1 * 2**-14 (magnitude at fp16 bits 11..9, sign 15):
#:   j=0: w & 0x8E008E00
#:   j=1: (w << 3) & 0x8E008E00
#:   j=2: ((w << 9) & 0x0E000E00) | ((w << 2) & 0x80008000)
#:   j=3: ((w << 6) & 0x0E000E00) | ((w << 1) & 0x80008000)
WORD_LAYOUT = (
    (9, 15),
    (25, 31),
    (6, 12),
    (22, 28),
    (0, 13),
    (16, 29),
    (3, 14),
    (19, 30),
)
#: The decode yields E2M1 * 2**-14; the epilogue multiplies the accumulator by 2**14 (exact).
DECODE_UNSCALE = 16384.0

GEMV_TILE_M = (1, 2, 4, 8, 16, 32)
MMA_TILE_M = (8, 16, 32)
#: K elements one warp consumes per mma-family chunk (4 lanes x 32-element vectors).
MMA_CHUNK = 128
GEMV_WARPS = (1, 2, 4, 8)
GEMV_MAX_VEC_PER_THREAD = 4
#: Elements one thread streams per 16-byte weight load.
GEMV_VEC_ELEMS = 32


@dataclass(frozen=True)
class Sm90W4A16Config:
    family: str = "gemv"
    tile_m: int = 1  # gemv: activation rows per CTA; wgmma: 64 | 128
    tile_n: int = 8  # output columns (weight rows) per CTA
    tile_k: int = 4096  # gemv: K elements per CTA main-loop step (32 * threads * vectors per thread)
    split_k: int = 1
    num_warps: int = 4
    stages: int = 1
    pdl: bool = False

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

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @property
    def vec_per_thread(self) -> int:
        """gemv: 16-byte weight vectors per thread per row per main-loop step."""
        return self.tile_k // (GEMV_VEC_ELEMS * self.threads)


def gemv_passes(c: Sm90W4A16Config) -> tuple[int, int]:
    """(weight rows, activation rows) of one register pass of the gemv kernel."""
    rp = max(1, 8 // c.tile_m)
    while rp > 1 and c.tile_n % rp:
        rp //= 2
    return rp, min(c.tile_m, 4)


def _validate_gemv(c: Sm90W4A16Config) -> Status:
    if c.tile_m not in GEMV_TILE_M:
        return Status.fail(f"gemv tile_m={c.tile_m} not in {GEMV_TILE_M}")
    if c.tile_n % 8 or not 8 <= c.tile_n <= 128:
        return Status.fail(f"gemv tile_n={c.tile_n} must be a multiple of 8 in [8, 128]")
    if c.tile_n * c.tile_m > 1024:
        return Status.fail(f"gemv tile_n*tile_m={c.tile_n * c.tile_m} > 1024 (shared-memory totals)")
    if c.num_warps not in GEMV_WARPS:
        return Status.fail(f"gemv num_warps={c.num_warps} not in {GEMV_WARPS}")
    step = GEMV_VEC_ELEMS * c.threads
    if c.tile_k % step or not 1 <= c.tile_k // step <= GEMV_MAX_VEC_PER_THREAD:
        return Status.fail(
            f"gemv tile_k={c.tile_k} must be 32*threads*v = {step}*v with v in 1..{GEMV_MAX_VEC_PER_THREAD} "
            f"(one 16-byte weight vector = 32 elements per thread per load)"
        )
    rp, mp = gemv_passes(c)
    if c.vec_per_thread * (4 * rp + 16 * mp) > 96:
        return Status.fail(
            f"gemv tile_k={c.tile_k} with tile_m={c.tile_m}: {c.vec_per_thread} vectors x ({rp} weight rows + "
            f"{mp} activation rows) per pass need too many registers"
        )
    if c.stages != 1:
        return Status.fail(f"gemv stages={c.stages}: the gemv kernel has no shared-memory pipeline (use 1)")
    if c.pdl:
        return Status.fail("gemv pdl=True: programmatic dependent launch is not implemented")
    return Status.success()


def _validate_wgmma(c: Sm90W4A16Config) -> Status:
    if c.tile_m not in (64, 128):
        return Status.fail(f"wgmma tile_m={c.tile_m} not in (64, 128)")
    if c.tile_n % 16 or not 16 <= c.tile_n <= 128:
        return Status.fail(f"wgmma tile_n={c.tile_n} must be a multiple of 16 in [16, 128] (fp32 tile staged in smem)")
    if c.num_warps != 4 * c.tile_m // 64:
        return Status.fail(
            f"wgmma num_warps={c.num_warps}: the kernel runs one warpgroup per 64 rows ({4 * c.tile_m // 64} warps)"
        )
    if c.tile_k != 64:
        return Status.fail(f"wgmma tile_k={c.tile_k}: the kernel steps K by 64 (4 WGMMA k-steps)")
    if c.stages < 2:
        return Status.fail(f"wgmma stages={c.stages} must be >= 2")
    if c.pdl:
        return Status.fail("wgmma pdl=True: programmatic dependent launch is not implemented")
    return Status.success()


def _validate_mma(c: Sm90W4A16Config) -> Status:
    if c.tile_m not in MMA_TILE_M:
        return Status.fail(f"mma tile_m={c.tile_m} not in {MMA_TILE_M} (groups of 8 activation rows)")
    if c.tile_n % 16 or not 16 <= c.tile_n <= 128:
        return Status.fail(f"mma tile_n={c.tile_n} must be a multiple of 16 in [16, 128]")
    if c.num_warps not in GEMV_WARPS:
        return Status.fail(f"mma num_warps={c.num_warps} not in {GEMV_WARPS}")
    step = MMA_CHUNK * c.num_warps
    if c.tile_k % step or not 1 <= c.tile_k // step <= 2:
        return Status.fail(f"mma tile_k={c.tile_k} must be {MMA_CHUNK}*warps*U = {step}*U with U in 1..2")
    if c.stages != 1:
        return Status.fail(f"mma stages={c.stages}: no shared-memory pipeline (use 1)")
    if c.pdl:
        return Status.fail("mma pdl=True: programmatic dependent launch is not implemented")
    return Status.success()


_NAME_RE = re.compile(r"nvgemm_cutedsl_sm90_w4a16_([a-z]+)_t(\d+)x(\d+)x(\d+)_w(\d+)_s(\d+)(?:_sk(\d+))?(_pdl)?")


def config_from_name(name: str) -> Sm90W4A16Config:
    """Inverse of :meth:`Sm90W4A16Config.name` (autotuned code names its kernel config)."""
    m = _NAME_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"not an sm90 W4A16 config name: {name!r}")
    fam, tm, tn, tk, nw, st, sk, pdl = m.groups()
    return Sm90W4A16Config(family=fam, tile_m=int(tm), tile_n=int(tn), tile_k=int(tk), split_k=int(sk or 1),
                           num_warps=int(nw), stages=int(st), pdl=bool(pdl))


def validate_config(c: Sm90W4A16Config) -> Status:
    if c.family not in SM90_FAMILIES:
        return Status.fail(f"family={c.family!r} not in {SM90_FAMILIES}")
    if c.split_k < 1:
        return Status.fail(f"split_k={c.split_k} must be >= 1")
    if c.tile_k % 32:
        return Status.fail(f"tile_k={c.tile_k} must be a multiple of 32 (16-byte packed-FP4 loads)")
    if c.family == "gemv":
        return _validate_gemv(c)
    if c.family == "mma":
        return _validate_mma(c)
    return _validate_wgmma(c)
