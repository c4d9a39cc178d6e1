"""Which accumulator element each epilogue thread of the sm_100a kernel owns -- computed FROM THE
KERNEL'S OWN CuTe layouts, on CPU.

``nvgemm.templates.sm100_w4a4.epilogue.thread_ownership`` traces the kernel's ``_t2r_copy`` /
``_acc_coords`` / ``_out_copy`` / ``_out_tiles`` (the tiled MMA's C partition, the TMEM copy atom
the kernel selects, the epilogue tile) with static thread indices and reads off, for every
epilogue thread and register, the GEMM-tile (row, col) it holds after ``tcgen05.ld`` and the
output (row, col) its output partition addresses. Nothing is re-derived by hand: change the atom
selection, the epilogue tile or the MMA partition in the kernel and these facts change with it.

Asserted for every epilogue path -- native and swap-AB, fp32 / bf16 / fp16 output, every tile_n,
1-CTA and 2-CTA:

* coverage: the registers of all threads (and both CTAs of a pair) hold every element of the MMA
  tile exactly once;
* row ownership: thread t of CTA v holds only row 128*v + t, sub-tile st holds columns
  st*epi_n .. st*epi_n + epi_n - 1 in register order (what the vector loads of alpha/bias/residual,
  the in-thread gate/up pairs and the TMA-store staging rely on);
* gate/up pairing (silu_mul on interleaved features 2j = gate, 2j+1 = up): swap-AB -- lane 2j's
  register i and lane 2j+1's register i hold rows r, r+1 (r even) of the same column, so one
  ``shfl.bfly 1`` pairs them; native -- registers 2i, 2i+1 of one thread hold columns c, c+1 (c even);
* store coalescing: swap-AB -- for every register, the 32 lanes of a warp hold 32 consecutive rows
  (features) of one column (token): 32 consecutive elements of the row-major [tokens, N] output;
  native -- the output partition (residual loads, register -> smem copy of the TMA store) of
  thread t is output row t with out_w consecutive columns, the same row as its accumulator
  registers and the columns they produce (c, or c // 2 for gated outputs).

The checker is itself checked: with the TMEM-load selection the kernel had before this fix (the
real output layout as the hint, i.e. ``tcgen05.ld.16x256b`` for column-major 16-bit swap-AB output)
it must report the pairing failure.
"""

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")

import functools  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("cutlass")

from nvgemm.epilogues import EpilogueSpec  # noqa: E402
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C  # noqa: E402

pytestmark = pytest.mark.compile_only

WARP = 32


def _kernel(cfg: C, epi: EpilogueSpec, kernel_cls=None):
    from nvgemm.templates.sm100_w4a4.kernel import Sm100Nvfp4GemmKernel

    return (kernel_cls or Sm100Nvfp4GemmKernel)(cfg, epi, max_active_clusters=148)


@functools.lru_cache(maxsize=None)
def ownership(cfg: C, epi: EpilogueSpec):
    from nvgemm.templates.sm100_w4a4.epilogue import thread_ownership

    k = _kernel(cfg, epi)
    return thread_ownership(k), k


def check_coverage_and_rows(own, cfg: C, epi_n: int):
    seen = {}
    for (v, t), (acc, _out) in own.items():
        for st, regs in enumerate(acc):
            assert len(regs) == epi_n, (v, t, st, len(regs))
            for i, (r, c) in enumerate(regs):
                assert r == 128 * v + t, f"CTA {v} thread {t} holds row {r}"
                assert c == st * epi_n + i, f"thread {t} sub-tile {st} register {i} holds column {c}"
                assert (r, c) not in seen, f"({r}, {c}) held by {seen[(r, c)]} and {(v, t, st, i)}"
                seen[(r, c)] = (v, t, st, i)
    assert len(seen) == cfg.tile_m * cfg.tile_n, f"{len(seen)} of {cfg.tile_m * cfg.tile_n} tile elements held"


def check_gate_up_pairing(own, swap_ab: bool):
    for (v, t), (acc, _out) in own.items():
        for st, regs in enumerate(acc):
            if swap_ab:
                if t % 2:
                    continue
                partner = own[(v, t ^ 1)][0][st]
                for i, ((r, c), (r2, c2)) in enumerate(zip(regs, partner)):
                    assert r % 2 == 0 and (r2, c2) == (r + 1, c), (
                        f"swap-AB gate/up: lane {t} register {i} holds {(r, c)}, lane {t ^ 1} holds {(r2, c2)}"
                    )
            else:
                for i in range(0, len(regs), 2):
                    (r, c), (r2, c2) = regs[i], regs[i + 1]
                    assert c % 2 == 0 and (r2, c2) == (r, c + 1), (
                        f"native gate/up: thread {t} registers {i},{i + 1} hold {regs[i]}, {regs[i + 1]}"
                    )


def check_store_coalescing(own, cfg: C, gated: bool, out_w: int):
    v_count = 2 if cfg.use_2cta else 1
    for v in range(v_count):
        for w in range(4):
            lanes = [own[(v, w * WARP + lane)][0] for lane in range(WARP)]
            for st in range(len(lanes[0])):
                for i in range(len(lanes[0][st])):
                    held = [lanes[lane][st][i] for lane in range(WARP)]
                    if cfg.swap_ab:
                        rows = [r for r, _ in held]
                        assert {c for _, c in held} == {held[0][1]}, f"warp {w} register {i}: columns differ"
                        assert rows == list(range(rows[0], rows[0] + WARP)), f"warp {w} register {i}: rows {rows}"
    if not cfg.swap_ab:
        for (v, t), (acc, out) in own.items():
            for st, (regs, oregs) in enumerate(zip(acc, out)):
                assert len(oregs) == out_w
                for j, (orow, ocol) in enumerate(oregs):
                    r, c = regs[2 * j] if gated else regs[j]
                    assert orow == r - 128 * v, f"thread {t}: output row {orow} vs accumulator row {r}"
                    assert ocol == (c // 2 if gated else c), f"thread {t} sub-tile {st}: output column {ocol} vs {c}"


def run_all_checks(cfg: C, epi: EpilogueSpec):
    own, k = ownership(cfg, epi)
    gated = epi.activation == "silu_mul"
    assert len(own) == 128 * (2 if cfg.use_2cta else 1)
    check_coverage_and_rows(own, cfg, k.epi_n)
    check_gate_up_pairing(own, cfg.swap_ab)
    check_store_coalescing(own, cfg, gated, k.out_w)
    assert k.use_tma_store == (not cfg.swap_ab) and (cfg.swap_ab or k.out_w >= 8)


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
TILE_N = (8, 16, 32, 64, 128, 192, 256)
CASES = (
    # every tile_n, native and swap-AB (gated bf16: gated output partitions are half-width)
    [(C(tile_n=t), "silu_mul", BF16) for t in TILE_N if t > 8]  # gated native tile_n=8: refused
    + [(C(tile_n=t, swap_ab=True), "silu_mul", BF16) for t in TILE_N]
    # every output dtype on both orientations, gated and plain
    + [(C(tile_n=t, swap_ab=s), act, dt) for dt in (FP16, FP32) for s in (False, True) for t, act in
       ((16, "silu_mul"), (128, "none"))]
    + [(C(tile_n=64), "none", BF16), (C(tile_n=8), "none", BF16), (C(tile_n=8), "none", FP32)]
    # 2-CTA (256-row MMA tile split over a CTA pair)
    + [(C(tile_m=256, tile_n=64, cluster_m=2, swap_ab=True), "silu_mul", FP16),
       (C(tile_m=256, tile_n=128, cluster_m=2), "silu_mul", BF16),
       (C(tile_m=256, tile_n=192, cluster_m=2), "none", FP32),
       (C(tile_m=256, tile_n=256, cluster_m=2, swap_ab=True), "none", BF16)]
)


@pytest.mark.parametrize("cfg,act,dt", CASES, ids=[f"{c.name()}-{a}-{str(d)[6:]}" for c, a, d in CASES])
def test_epilogue_thread_ownership(cfg, act, dt):
    run_all_checks(cfg, EpilogueSpec(alpha="vector", activation=act, out_dtype=dt))


def test_checker_catches_the_16x256b_pairing_bug():
    """The TMEM-load choice before the fix passed the real output layout (column-major for
    swap-AB) to ``get_tmem_load_op``: 16x256b for 16-bit outputs, four lanes per row. The
    ownership checks must reject it (pairing and coalescing both break)."""
    import cutlass.utils as utils

    from nvgemm.templates.sm100_w4a4.epilogue import thread_ownership
    from nvgemm.templates.sm100_w4a4.kernel import Sm100Nvfp4GemmKernel

    class OldAtomChoice(Sm100Nvfp4GemmKernel):
        def _t2r_layout(self):
            return utils.LayoutEnum.COL_MAJOR if self.config.swap_ab else utils.LayoutEnum.ROW_MAJOR

    cfg = C(tile_n=16, swap_ab=True)
    k = _kernel(cfg, EpilogueSpec(alpha="vector", activation="silu_mul"), OldAtomChoice)
    own = thread_ownership(k)
    with pytest.raises(AssertionError, match="holds row"):
        check_coverage_and_rows(own, cfg, k.epi_n)
    with pytest.raises(AssertionError, match="swap-AB gate/up"):
        check_gate_up_pairing(own, swap_ab=True)
    with pytest.raises(AssertionError, match=r"warp \d+ register \d+"):
        check_store_coalescing(own, cfg, gated=True, out_w=k.out_w)
    # the same tile is still fully covered: the old choice was a pairing bug, not a coverage bug
    assert len({rc for acc, _ in own.values() for regs in acc for rc in regs}) == 128 * 16
