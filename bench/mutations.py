"""Mutation runner: does the default CI subset kill realistic single-edit kernel bugs?

Each mutation in :data:`MUTATIONS` is one bug a reviewer could plausibly write into a kernel source (a
shifted fragment offset, a dropped K-tail predicate, a split-K range that drops the leftover K tiles, a
wrong scale-swizzle term, a swapped alpha/bias index, a PDL wait after the loads it guards, ...): an exact
``old`` text of one source file and its ``new`` text (``extra`` holds further hunks of the same edit when
the bug moves a line). The runner

1. checks that every selected mutation's ``old`` text occurs exactly once in the tree (else it stops with
   the offending names: a rotted list must fail loudly, never run a no-op);
2. runs the unmutated baseline of the union of the selected subsets once (a failing baseline invalidates
   the run: exit 3);
3. per mutation, copies the tree to a scratch directory, applies the edit there, and runs the mutation's
   test subset with ``PYTHONPATH`` at the scratch ``src`` and fresh private ``NVGEMM_CACHE_DIR``,
   ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR`` and ``CUTE_DSL_CACHE_DIR`` (no artifact built from
   the unmutated sources can mask the edit), ``pytest -x`` so the first failure stops it;
4. records killed / survived / timeout, the first failing test, whether that test is a value test or a
   text check (:func:`kill_kind`), and the run time; writes ``--json`` and ``--md``.

The subset of a mutation is **derived, not hand-picked**: the families its file belongs to -- the
``nvgemm.templates.<family>`` packages that import the mutated module, directly or transitively
(:func:`affected_families`; the grouped kernels subclass the dense ones, the requant PTX helpers live in
the sm90 common module, the MoE prep kernels use the Triton helpers) -- and then every default-CI test file
of ``tests/emulator``, ``tests/cpu`` and ``tests/compile`` that imports a module of one of those families
or the mutated module itself, through its own imports or a helper module of ``tests/``
(:func:`subset_for`). Triton interpreter files (``tests/cpu/triton_interp/interp_*.py``) run, as in CI,
as the matching parameter of ``tests/cpu/test_triton_interpreter.py``. Opt-in tests (``slow``,
``emulator_full``, GPU markers) skip as they do under plain ``python -m pytest -q``.

The three folders run as three pytest processes (emulator, cpu, compile, in that order; cpu first for a
Triton kernel, whose value tests are the interpreter runs): value tests first, so a kill reported as a text
check means every value test of the subset passed. Inside a folder the files run fastest first by their
baseline time (a kill stops sooner). One process per folder: the folders have not always been
safe to run in one process (the CuTeDSL target arch was fixed by the first module that imported cutlass).

    python bench/mutations.py --list
    nice -n 10 python bench/mutations.py [--only NAME ...] [--src-tree PATH] [--timeout S]
        [--json bench/results/mutations.json] [--md bench/results/mutations.md]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime as _dt
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAMILIES = ("sm100_w4a4", "sm90_w4a16", "sm100_moe", "sm90_moe", "sm120_w4a4", "sm120_moe", "triton")
FOLDERS = ("tests/emulator", "tests/cpu", "tests/compile")
INTERP_TEST = "tests/cpu/test_triton_interpreter.py::test_triton_kernels_under_interpreter"
CACHE_VARS = ("NVGEMM_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR")


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One realistic bug: ``old`` -> ``new`` in ``file`` (plus ``extra`` (old, new) hunks of the same
    edit); each ``old`` must occur exactly once in the file."""

    name: str
    file: str
    old: str
    new: str
    bug: str
    extra: tuple = ()

    def hunks(self) -> tuple:
        return ((self.old, self.new),) + tuple(self.extra)


_K100 = "src/nvgemm/templates/sm100_w4a4/kernel.py"
_E100 = "src/nvgemm/templates/sm100_w4a4/epilogue.py"
_C90 = "src/nvgemm/templates/sm90_w4a16/common.py"
_K120 = "src/nvgemm/templates/sm120_w4a4/kernel.py"
_K120M = "src/nvgemm/templates/sm120_moe/kernel.py"

MUTATIONS: tuple[Mutation, ...] = (
    # ---- sm120 grouped MoE kernel (work list over stacked experts, fused requant on GEMM1)
    Mutation(
        "sm120moe-expert-offset-unpadded", _K120M,
        "st_lo, n_it, e * rows_padded)",
        "st_lo, n_it, e * rows)",
        "the expert's block in the stacked weights is taken at e x rows instead of e x rows_padded (the "
        "128-row padding per expert is ignored)"),
    Mutation(
        "sm120moe-requant-scale-atom-2d", _K120M,
        "return ((tok // self.tile_m) * kb4 + t // 4) * 512",
        "return ((tok // 128) * kb4 + t // 4) * 512",
        "GEMM1's requant writes its scale bytes into the dense 2-D swizzle's atom (token // 128) instead of "
        "the work slot's own 128-row atom that GEMM2 reads"),
    # ---- sm120 W4A4 decode kernel (mma.sync kind::mxf4nvf4 block_scale)
    Mutation(
        "sm120-a-fragment-half-offset", _K120,
        "(lane % 8 + 8 * (mat % 2)) * self.row_b",
        "(lane % 8 + 8 * (mat // 2)) * self.row_b",
        "the ldmatrix row offset of the A fragment takes rows g + 8 from the wrong matrix (registers 1 and 2 "
        "swap rows 8-15 with K 32-63)"),
    Mutation(
        "sm120-ktail-scale-bytes", _K120,
        "                nb = cutlass.max(cutlass.min(kb - slab * 4, 4), 0)\n",
        "                nb = Int32(4)\n",
        "the weight scale copies drop their K-tail predicate: a slab past K/16 copies 4 padding bytes"),
    Mutation(
        "sm120-requant-pair-shuffle", _K120,
        "q_hi = cute.arch.shuffle_sync_bfly(qv, offset=4)",
        "q_hi = cute.arch.shuffle_sync_bfly(qv, offset=8)",
        "the fused requant packs feature g with feature g + 2 (lane g ^ 2) instead of g + 1 in a byte"),
    Mutation(
        "sm120-splitk-range-drops-leftover", _K120,
        "per = (n_stage + self.split_k - 1) // self.split_k",
        "per = n_stage // self.split_k",
        "split-K ranges of floor(stages / S) stages: the leftover stages of an uneven split are never "
        "accumulated"),
    # ---- sm100 W4A4 dense kernel (the grouped MoE kernel inherits it)
    Mutation(
        "sm100-splitk-uneven-drops-leftover", _K100,
        "        begin = k_tile_total * split_idx // self.split_k\n"
        "        end = k_tile_total * (split_idx + 1) // self.split_k\n",
        "        begin = k_tile_total // self.split_k * split_idx\n"
        "        end = begin + k_tile_total // self.split_k\n",
        "split-K ranges of floor(T/S) K tiles each: the leftover K tiles of an uneven split are never "
        "accumulated"),
    Mutation(
        "sm100-k-tiles-rounded-down", _K100,
        "k_tile_total = cute.size(gA, mode=[3])",
        "k_tile_total = cute.size(mA_mkl, mode=[1]) // self.mma_tiler[2]",
        "the K-tile count is K // 256 (rounded down): the K tail past the last whole 256-wide tile is dropped"),
    Mutation(
        "sm100-pdl-wait-after-tma-loads", _K100,
        "                        cute.prefetch(tma_atom_sfb, tBgSFB[(None, self._sfb_slice_n(c0[1]), kb0 + i, 0)])\n"
        "            cute.arch.griddepcontrol_wait()\n",
        "                        cute.prefetch(tma_atom_sfb, tBgSFB[(None, self._sfb_slice_n(c0[1]), kb0 + i, 0)])\n",
        "the TMA warp's griddepcontrol.wait moved after its first activation (TMA) loads: it reads the "
        "predecessor's output before the wait",
        extra=((
            "                cute.copy(tma_atom_sfb, tBgSFB_s[(None, kt)], tBsSFB[(None, prod_state.index)], "
            "tma_bar_ptr=bar,\n                          mcast_mask=sfb_mask)\n",
            "                cute.copy(tma_atom_sfb, tBgSFB_s[(None, kt)], tBsSFB[(None, prod_state.index)], "
            "tma_bar_ptr=bar,\n                          mcast_mask=sfb_mask)\n"
            "                if cutlass.const_expr(self.pdl):\n"
            "                    cute.arch.griddepcontrol_wait()\n",
        ),)),
    Mutation(
        "sm100-splitk-reduce-skips-last-split", _E100,
        "for s in cutlass.range_constexpr(1, self.split_k):",
        "for s in cutlass.range_constexpr(1, self.split_k - 1):",
        "the last split's fp32 partial is skipped in the split-K reduction"),
    Mutation(
        "sm100-requant-sf-swizzle-32row-term", _E100,
        "+ (c % 32) * 16 + ((c // 32) % 4) * 4 + b % 4",
        "+ (c % 32) * 16 + b % 4",
        "the fused requant's 128x4 scale swizzle drops its 32-row group term ((row // 32) % 4) * 4: rows "
        "32-127 of an atom overwrite rows 0-31"),
    Mutation(
        "sm100-native-gated-up-bias-index", _E100,
        "self._bias_at(rBias, 2 * j + 1))",
        "self._bias_at(rBias, 2 * j))",
        "native gated tiles add the gate row's bias to the up value (alpha/bias index of the up row)"),
    Mutation(
        "sm100-swapab-feature-index", _E100,
        "            r, _c, _l = tTR_cC[0]\n",
        "            _c, r, _l = tTR_cC[0]\n",
        "swap-AB per-feature alpha/bias indexed by the token (MMA column) instead of the feature (MMA row)"),
    # ---- the fused SwiGLU + NVFP4 requant
    Mutation(
        "sm100-requant-e2m1-nibble-order", "src/nvgemm/templates/sm100_w4a4/requant.py",
        "cvt.rn.satfinite.e2m1x2.f32 t, $1, $2;",
        "cvt.rn.satfinite.e2m1x2.f32 t, $2, $1;",
        "the requant's packed E2M1 byte has its two codes in the wrong nibbles (odd feature low)"),
    Mutation(
        "requant-lane-model-amax-half-warp", "src/nvgemm/epilogues/requant.py",
        "AMAX_BFLY = (2, 4, 8, 16)",
        "AMAX_BFLY = (2, 4, 8)",
        "the requant lane model's block amax stops one butterfly short: 8 of the 16 features of a block"),
    # ---- the epilogue functors (every CuTeDSL kernel)
    Mutation(
        "epilogue-gated-gate-up-swapped", "src/nvgemm/epilogues/cute_apply.py",
        "return gate / (cutlass.Float32(1.0) + cute.math.exp(-gate)) * up",
        "return up / (cutlass.Float32(1.0) + cute.math.exp(-up)) * gate",
        "SwiGLU applies silu to the up value and multiplies by the gate (gate/up roles swapped)"),
    Mutation(
        "epilogue-bias-before-alpha", "src/nvgemm/epilogues/cute_apply.py",
        "        y = acc\n"
        "        if cutlass.const_expr(self.spec.alpha != \"none\"):\n"
        "            y = AlphaFold(self.spec.alpha).apply(y, alpha)\n"
        "        if cutlass.const_expr(self.spec.bias):\n"
        "            y = BiasAdd().apply(y, bias)\n"
        "        if cutlass.const_expr(self.spec.activation in (\"silu\", \"gelu_tanh\")):\n",
        "        y = acc\n"
        "        if cutlass.const_expr(self.spec.bias):\n"
        "            y = BiasAdd().apply(y, bias)\n"
        "        if cutlass.const_expr(self.spec.alpha != \"none\"):\n"
        "            y = AlphaFold(self.spec.alpha).apply(y, alpha)\n"
        "        if cutlass.const_expr(self.spec.activation in (\"silu\", \"gelu_tanh\")):\n",
        "the ungated epilogue adds the bias before scaling by alpha ((acc + bias) * alpha)"),
    # ---- sm90 W4A16 (mma, wgmma and their shared module; the grouped sm90 kernel inherits mma)
    Mutation(
        "sm90-mma-token-groups-read-first-8", "src/nvgemm/templates/sm90_w4a16/mma.py",
        "xa = base + x_lds + mg * 8 * self.x_row + u * 128",
        "xa = base + x_lds + u * 128",
        "every 8-token MMA group reads the B fragments of tokens 0-7 (rows > 8 of a tile get wrong "
        "activations)"),
    Mutation(
        "sm90-mma-b-fragment-offset-shifted", "src/nvgemm/templates/sm90_w4a16/mma.py",
        "self.off_x + g * self.x_row + q * 32",
        "self.off_x + g * self.x_row + q * 16",
        "a lane's B-fragment offset in the staged activation row is 16 bytes per quad lane instead of 32"),
    Mutation(
        "sm90-mma-scale-group-of-even-chunk", "src/nvgemm/templates/sm90_w4a16/mma.py",
        "sp = scale_pair(sw[rt][u // 2], u % 2, self.s_shift, self.s_add)",
        "sp = scale_pair(sw[rt][u // 2], 0, self.s_shift, self.s_add)",
        "the odd 64-element chunk of a scale word is decoded with the even chunk's block scales (wrong scale "
        "group)"),
    Mutation(
        "sm90-mma-k-tail-predicate-dropped", "src/nvgemm/templates/sm90_w4a16/mma.py",
        "cutlass.select_(ok, Int32(16), Int32(0))",
        "Int32(16)",
        "the activation copy's K-tail predicate is dropped: pieces past K are copied from memory past the row"),
    Mutation(
        "sm90-wgmma-k-tail-off-by-one", "src/nvgemm/templates/sm90_w4a16/wgmma.py",
        "nbytes = cutlass.select_(kc <= k_last, Int32(4), Int32(0))",
        "nbytes = cutlass.select_(kc < k_last, Int32(4), Int32(0))",
        "the wgmma activation copy's K-end predicate is off by one: the last in-range activation pair before K "
        "is zero-filled"),
    Mutation(
        "sm90-wgmma-desc-lbo-sbo-swapped", _C90,
        "WGMMA_DESC_SW128_KMAJOR = (1 << 62) | ((1024 >> 4) << 32) | (1 << 16)",
        "WGMMA_DESC_SW128_KMAJOR = (1 << 62) | ((1024 >> 4) << 16) | (1 << 32)",
        "the wgmma shared-memory descriptor has its leading and stride byte offsets (LBO/SBO) swapped"),
    Mutation(
        "sm90-splitk-uneven-drops-leftover", _C90,
        "per = (n_stage + self.split_k - 1) // self.split_k",
        "per = n_stage // self.split_k",
        "split-K stage ranges of floor(stages/S): the leftover K stages of an uneven split are never computed"),
    Mutation(
        "sm90-gated-up-alpha-index", _C90,
        "yu = yu * mAlpha[row_u]",
        "yu = yu * mAlpha[row_g]",
        "per-row alpha of a gated up row read at the gate row's index"),
    Mutation(
        "sm90-epilogue-bias-before-alpha", _C90,
        "        if cutlass.const_expr(self.epi.bias):\n"
        "            y = y + mBias[row_g]\n"
        "            if cutlass.const_expr(self.gated):\n"
        "                yu = yu + mBias[row_u]\n"
        "        if cutlass.const_expr(self.gated):\n"
        "            y = Activation",
        "        if cutlass.const_expr(self.gated):\n"
        "            y = Activation",
        "the sm90 epilogue adds the bias before scaling by alpha ((acc + bias) * alpha)",
        extra=((
            "        yu = acc_u * Float32(self.unscale)\n",
            "        yu = acc_u * Float32(self.unscale)\n"
            "        if cutlass.const_expr(self.epi.bias):\n"
            "            y = y + mBias[row_g]\n"
            "            if cutlass.const_expr(self.gated):\n"
            "                yu = yu + mBias[row_u]\n",
        ),)),
    # ---- sm100 grouped MoE kernel and its activation prep
    Mutation(
        "sm100-moe-tiles-per-expert", "src/nvgemm/templates/sm100_moe/kernel.py",
        "return _Work(mTiles, (m_gemm + 127) // 128, m_gemm, fin)",
        "return _Work(mTiles, (m_gemm + 255) // 256, m_gemm, fin)",
        "A tiles per expert counted in 256-row tiles: experts past 0 read another expert's weight rows when "
        "an expert has more than 128 rows"),
    Mutation(
        "sm100-moe-alpha-stride-without-next-scale", "src/nvgemm/templates/sm100_moe/kernel.py",
        "return s + 1 if self.spec.out_quant else s",
        "return s",
        "the per-expert alpha stride forgets the fused requant's next-input-scale slot"),
    Mutation(
        "sm100-moe-gemm2-activation-before-wait", _K100,
        "                        early_state.advance()\n",
        "                        cute.prefetch(tma_atom_b, tBgB[(None, c0[1], kb0 + i, 0)])\n"
        "                        early_state.advance()\n",
        "the grouped GEMM2's PDL prologue also touches the activations -- GEMM1's output -- before "
        "griddepcontrol.wait (an L2 prefetch of them)"),
    Mutation(
        "sm100-moe-prefetch-next-skips-last-unit", "src/nvgemm/templates/sm100_moe/kernel.py",
        "                    u = (coord[0] // v_size) * self.split_k + coord[2]\n",
        "                    u = (coord[0] // v_size) * self.split_k + coord[2]\n"
        "                    if u == units - 1:\n"
        "                        u = n_tiles\n",
        "GEMM1's L2 prefetch of GEMM2's weights (prefetch_next) leaves out the row tiles of each slot's last work "
        "unit: GEMM2 streams them from DRAM"),
    Mutation(
        "sm100-moe-prep-prefetch-neighbour-expert", "src/nvgemm/templates/sm100_moe/prep_triton.py",
        "_prefetch_l2(w13_ptr + e.to(tl.int64) * W13_LINES * L2_LINE",
        "_prefetch_l2(w13_ptr + (e ^ 1).to(tl.int64) * W13_LINES * L2_LINE",
        "the MoE prep L2-prefetches the GEMM1 weights of the neighbouring expert (e ^ 1) instead of the routed "
        "one: GEMM1 streams its weights from DRAM and L2 fills with unused lines"),
    Mutation(
        "sm100-tma-prologue-prefetch-every-lane", "src/nvgemm/templates/sm100_w4a4/kernel.py",
        "                    # one lane issues (a prefetch is per thread: a whole warp would request each box 32 times)\n"
        "                    with cute.arch.elect_one():\n",
        "                    if True:\n",
        "the dense kernel's PDL-prologue L2 prefetches issued by every lane of the TMA warp: each box requested "
        "32 times"),
    Mutation(
        "sm100-moe-prep-kb-tiles-rounded-down", "src/nvgemm/templates/sm100_moe/prep_triton.py",
        "kb_tiles = (K // 16 + 3) // 4",
        "kb_tiles = K // 64",
        "the MoE prep kernel's scale-atom column count is rounded down: K/16 not a multiple of 4 misplaces "
        "the slot atoms"),
    # ---- sm90 grouped MoE kernel, work list, finalize
    Mutation(
        "sm90-moe-expert-alpha-offset", "src/nvgemm/templates/sm90_moe/kernel.py",
        "a_off = e * n_pad if",
        "a_off = e * n_out if",
        "the per-row alpha of expert e starts at e x output width instead of e x weight rows (gated GEMM1)"),
    Mutation(
        "sm90-moe-signal-before-wait", "src/nvgemm/templates/sm90_moe/kernel.py",
        "        if cutlass.const_expr(self.pdl and not self.early_weights):\n"
        "            cute.arch.griddepcontrol_wait()",
        "        if cutlass.const_expr(self.pdl and not self.early_weights):\n"
        "            cute.arch.griddepcontrol_launch_dependents()\n"
        "            cute.arch.griddepcontrol_wait()",
        "GEMM1 signals its dependents before its own wait, so GEMM2 may start (and read the routing early) "
        "before the routing's producer completed"),
    Mutation(
        "sm90-moe-worklist-tiles-rounded-down", "src/nvgemm/templates/sm90_moe/prep_triton.py",
        "nt = (cnt + TM - 1) // TM",
        "nt = cnt // TM",
        "the work list's tiles per expert are rounded down: each expert's last partial tile is dropped"),
    Mutation(
        "sm90-w4a16-activations-before-pdl-wait", "src/nvgemm/templates/sm90_w4a16/mma.py",
        "        if cutlass.const_expr(pdl_wait):\n"
        "            cute.arch.griddepcontrol_wait()\n"
        "        for j in cutlass.range_constexpr(D - 1):\n"
        "            if j < n_it:\n"
        "                self.produce_x(ring + j * self.stage_bytes, st_lo + j, k, xp, xd, pk)\n"
        "            cp_async_commit()\n",
        "        for j in cutlass.range_constexpr(D - 1):\n"
        "            if j < n_it:\n"
        "                self.produce_x(ring + j * self.stage_bytes, st_lo + j, k, xp, xd, pk)\n"
        "            cp_async_commit()\n"
        "        if cutlass.const_expr(pdl_wait):\n"
        "            cute.arch.griddepcontrol_wait()\n",
        "the mma ring's prologue copies the activations -- the previous kernel's output -- before "
        "griddepcontrol.wait (the dense PDL kernel and the grouped GEMM2 alike)"),
    Mutation(
        "sm90-moe-finalize-unpermuted-row", "src/nvgemm/templates/sm90_moe/finalize_triton.py",
        "y = tl.load(y_ptr + p * H + cols, mask=mask, other=0.0)",
        "y = tl.load(y_ptr + (t * K + s) * H + cols, mask=mask, other=0.0)",
        "the finalize reads the expert output at the unpermuted (token, slot) row instead of its permuted row"),
    # ---- Triton kernels
    Mutation(
        "triton-quantize-k-mask-dropped", "src/nvgemm/templates/triton/quantize.py",
        "    mask = (rows[:, None] < M) & (cols[None, :] < K)\n"
        "    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)\n"
        "    pdl_launch_dependents(USE_GDC)\n"
        "    packed, sf = nvfp4_quantize_tile(",
        "    mask = rows[:, None] < M\n"
        "    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)\n"
        "    pdl_launch_dependents(USE_GDC)\n"
        "    packed, sf = nvfp4_quantize_tile(",
        "the activation quantizer's load drops its K predicate: the swizzle padding columns quantize memory "
        "past the row"),
    Mutation(
        "triton-fused-residual-sum-unrounded", "src/nvgemm/templates/triton/fused.py",
        "h = round_to_kind(h + res, X_KIND)",
        "h = h + res",
        "fused add + RMSNorm keeps x + residual in fp32 instead of rounding it to x's dtype first"),
    Mutation(
        "triton-gemm-gated-up-alpha-index", "src/nvgemm/templates/triton/gemm_w4a16.py",
        "_epi_pre(acc_up, alpha_ptr, bias_ptr, offs_n + N_OUT,",
        "_epi_pre(acc_up, alpha_ptr, bias_ptr, offs_n,",
        "the W4A16 Triton GEMM applies the gate rows' alpha / bias to the up rows"),
    Mutation(
        "triton-moe-router-weight-index", "src/nvgemm/templates/triton/moe.py",
        "y = tl.load(tw_ptr + pair, mask=valid, other=0.0)[:, None] * y",
        "y = tl.load(tw_ptr + pos, mask=valid, other=0.0)[:, None] * y",
        "the Triton MoE GEMM2 reads the router weight at the block position instead of the pair index"),
    Mutation(
        "triton-e2m1-tie-0.75-rounds-down", "src/nvgemm/templates/triton/_common.py",
        "code += (a >= 0.75).to(tl.int32)",
        "code += (a > 0.75).to(tl.int32)",
        "the Triton E2M1 encoder rounds the tie 0.75 down to 0.5 (RNE sends it up to the even code 1.0)"),
)


# ------------------------------------------------------------------------------------------------- subsets


def _imports(path: Path, package: str | None) -> set[str]:
    """Dotted names a Python file imports (module level and inside functions; ``from a import b`` gives
    ``a`` and ``a.b``; relative imports resolved against ``package``)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError:
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level and package:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            if mod:
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def _module_name(path: Path, src: Path) -> str:
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def import_graph(tree: Path) -> dict[str, frozenset[str]]:
    """module -> the nvgemm modules it imports, for every module under ``src/nvgemm``. The root package
    ``nvgemm`` is left out as a dependency: ``from nvgemm import settings`` depends on the settings module,
    not on everything the package root re-exports."""
    src = tree / "src"
    graph: dict[str, set[str]] = {}
    for p in sorted((src / "nvgemm").rglob("*.py")):
        mod = _module_name(p, src)
        pkg = mod if p.name == "__init__.py" else mod.rpartition(".")[0]
        graph[mod] = {m for m in _imports(p, pkg) if m.startswith("nvgemm")}
    known = set(graph) - {"nvgemm"}
    return {m: frozenset(d for d in deps if d in known) for m, deps in graph.items()}


def family_of(module: str) -> str | None:
    for fam in FAMILIES:
        if module == f"nvgemm.templates.{fam}" or module.startswith(f"nvgemm.templates.{fam}."):
            return fam
    return None


@functools.lru_cache(maxsize=None)
def affected_families(tree: Path, file: str) -> tuple[str, ...]:
    """Families whose package contains ``file``'s module or imports it, directly or transitively."""
    graph = import_graph(tree)
    target = _module_name(tree / file, tree / "src")
    users = {target}
    changed = True
    while changed:
        changed = False
        for mod, deps in graph.items():
            if mod not in users and deps & users:
                users.add(mod)
                changed = True
    return tuple(f for f in FAMILIES if any(family_of(m) == f for m in users))


@functools.lru_cache(maxsize=None)
def _test_imports(path: Path, tests: Path) -> frozenset[str]:
    """What a test file imports, including through helper modules of ``tests/`` it imports by name."""
    return frozenset(_test_imports_rec(path, tests, set()))


def _test_imports_rec(path: Path, tests: Path, seen: set[Path]) -> set[str]:
    if path in seen:
        return set()
    seen.add(path)
    names = _imports(path, None)
    out = set(names)
    for name in names:
        top = name.split(".")[0]
        for helper in (path.parent / f"{top}.py", tests / f"{top}.py"):
            if helper.is_file() and helper != path:
                out |= _test_imports_rec(helper, tests, seen)
    return out


def _touches(imports: set[str], families: tuple[str, ...], module: str) -> bool:
    for name in imports:
        if name == module or name.startswith(module + "."):
            return True
        if family_of(name) in families:
            return True
    return False


def subset_for(tree: Path, mutation: Mutation) -> dict[str, list[str]]:
    """The default-CI test subset of a mutation: ``{folder: [pytest node ids]}``, see the module docstring."""
    families = affected_families(tree, mutation.file)
    module = _module_name(tree / mutation.file, tree / "src")
    tests = tree / "tests"
    out: dict[str, list[str]] = {}
    for folder in FOLDERS:
        ids = []
        for p in sorted((tree / folder).glob("test_*.py")):
            if _touches(_test_imports(p, tests), families, module):
                ids.append(p.relative_to(tree).as_posix())
        if folder == "tests/cpu":
            interp = [f"{INTERP_TEST}[{p.name}]" for p in sorted((tree / folder / "triton_interp").glob("interp_*.py"))
                      if _touches(_test_imports(p, tests), families, module)]
            ids = interp + [i for i in ids if i != INTERP_TEST.split("::")[0]]
        if folder == "tests/compile":  # the value checks of the compile folder first
            ids.sort(key=lambda i: (kill_kind(i) != "value", i))
        if ids:
            out[folder] = ids
    if "import triton" in (tree / mutation.file).read_text():  # a Triton kernel: its interpreter tests first
        out = {f: out[f] for f in ("tests/cpu", "tests/emulator", "tests/compile") if f in out}
    return out


#: compile-folder files whose checks compare computed values (not PTX / SASS / constants / layouts)
COMPILE_VALUE_FILES = ("tests/compile/test_fused_requant_ownership.py",)
_TEXT_NAME = re.compile(r"ptx|sass|constant|_text", re.I)


def kill_kind(nodeid: str) -> str:
    """``value`` or ``text`` for the test that killed a mutation, by where it lives:

    * ``tests/emulator``: value (the real artifact runs on the PTX emulator against a reference);
    * ``tests/compile``: text (PTX / SASS / constant / layout checks), except :data:`COMPILE_VALUE_FILES`;
    * ``tests/cpu``: value (torch references, the Triton interpreter), except tests whose name says they
      check PTX, SASS, a constant or a text (``ptx|sass|constant|_text``).
    """
    path, _, name = nodeid.partition("::")
    if path.startswith("tests/emulator/"):
        return "value"
    if path.startswith("tests/compile/"):
        return "value" if path in COMPILE_VALUE_FILES else "text"
    if path == INTERP_TEST.split("::")[0]:
        return "value"
    return "text" if _TEXT_NAME.search(name) else "value"


# ------------------------------------------------------------------------------------------------- running


def check_mutations(tree: Path, muts) -> list[str]:
    """Problems with the list against ``tree`` (an ``old`` text not occurring exactly once, a missing
    file, a duplicate name); empty when every mutation applies."""
    problems = []
    names = [m.name for m in muts]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{n}: duplicate mutation name")
    for m in muts:
        path = tree / m.file
        if not path.is_file():
            problems.append(f"{m.name}: {m.file} does not exist in {tree}")
            continue
        text = path.read_text()
        for i, (old, new) in enumerate(m.hunks()):
            c = text.count(old)
            if c != 1:
                problems.append(f"{m.name}: hunk {i} 'old' occurs {c} times in {m.file} (must be exactly once)")
            if old == new:
                problems.append(f"{m.name}: hunk {i} changes nothing")
    return problems


def apply(tree: Path, m: Mutation) -> None:
    path = tree / m.file
    text = path.read_text()
    for old, new in m.hunks():
        if text.count(old) != 1:
            raise RuntimeError(f"{m.name}: 'old' does not occur exactly once in {path}")
        text = text.replace(old, new)
    path.write_text(text)


_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", "*.egg-info",
                                 "kernels_cache", ".device_artifacts", ".whl", ".gl", "build", "dist")


def scratch_copy(tree: Path, root: Path, name: str) -> Path:
    dst = root / name
    shutil.copytree(tree, dst, ignore=_IGNORE, symlinks=True)
    return dst


_FAILED = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", re.M)
_INNER = re.compile(r"(?:FAILED|ERROR) (tests/cpu/triton_interp/\S+?)(?: - |\s|$)")


_DURATION = re.compile(r"^\s*([0-9.]+)s (?:call|setup|teardown)\s+(\S+)\s*$", re.M)


def file_seconds(log_text: str) -> dict[str, float]:
    """Per test file (per parameter for the interpreter runs) seconds, from ``pytest --durations=0``."""
    out: dict[str, float] = {}
    for sec, nodeid in _DURATION.findall(log_text):
        key = nodeid if nodeid.startswith(INTERP_TEST) else nodeid.split("::")[0]
        out[key] = out.get(key, 0.0) + float(sec)
    return out


def fastest_first(subset: dict[str, list[str]], seconds: dict[str, float]) -> dict[str, list[str]]:
    """Each folder's files ordered by their baseline time, fastest first (a kill then stops sooner); the
    compile folder keeps its value checks first."""
    return {folder: sorted(ids, key=lambda i: (kill_kind(i) != "value" if folder == "tests/compile" else False,
                                               seconds.get(i, 0.0), i))
            for folder, ids in subset.items()}


def run_subset(tree: Path, subset: dict[str, list[str]], python: str, timeout: float, log,
               durations: bool = False) -> dict:
    """Run the subset's folders in order, ``-x``; stop at the first failing folder. Returns status
    (``passed`` | ``failed`` | ``timeout``), the first failing node id and its message; with
    ``durations``, also ``seconds`` per test file (:func:`file_seconds`)."""
    seconds: dict[str, float] = {}
    env = dict(os.environ)
    caches = tree / ".mutation-caches"
    for var in CACHE_VARS:
        d = caches / var.lower()
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    env["PYTHONPATH"] = str(tree / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("CUTE_DSL_DUMP_DIR", None)  # tests/conftest.py makes a private one per process
    env.pop("NVGEMM_TEST_SLOW", None)  # the default subset only
    t0 = time.monotonic()
    for folder, ids in subset.items():
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            return {"status": "timeout", "folder": folder}
        cmd = [python, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider",
               *(["--durations=0", "--durations-min=0"] if durations else []), *ids]
        log(f"    $ {' '.join(shlex.quote(c) for c in cmd[:7])} ... ({len(ids)} ids, {folder})")
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {"status": "timeout", "folder": folder}
        (tree / f".mutation-{folder.replace('/', '_')}.log").write_text(out)
        seconds.update(file_seconds(out))
        if proc.returncode == 0:
            continue
        fails = _FAILED.findall(out)
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        res = {"status": "failed", "folder": folder, "rc": proc.returncode, "summary": summary}
        if fails:
            res["test"] = fails[0][1]
            emsg = [ln[1:].strip() for ln in out.splitlines() if ln.startswith("E ")]
            res["message"] = ((fails[0][2] or "").strip() or " / ".join(emsg[:2]))[:300]
            inner = _INNER.search(out)
            if res["test"].startswith(INTERP_TEST) and inner:
                res["inner_test"] = inner.group(1)
        else:
            res["test"] = None
            res["message"] = "\n".join(out.strip().splitlines()[-5:])[-300:]
        return res
    return {"status": "passed", **({"seconds": seconds} if durations else {})}


def _git(tree: Path, *args) -> str:
    try:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _merge_subsets(subsets) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in subsets:
        for folder, ids in s.items():
            cur = out.setdefault(folder, [])
            cur.extend(i for i in ids if i not in cur)
    return {f: out[f] for f in FOLDERS if f in out}


def write_md(path: Path, data: dict) -> None:
    rows = data["mutations"]
    killed = [r for r in rows if r["status"] == "killed"]
    done = len(rows)
    lines = [
        "# Mutation runner: realistic kernel bugs against the default CI subset",
        "",
        *([f"**Incomplete run**: {done} of {len(data['selected'])} selected mutations finished.", ""]
          if not data.get("complete") else []),
        f"Produced by `{data['command']}` on commit `{data['commit']}`{' (dirty tree)' if data['dirty'] else ''}"
        f" ({data['src_tree_note']}), {data['date']}. Machine: {data['machine']}.",
        "",
        "Each mutation is one edit of one kernel source (`bench/mutations.py` lists the exact old -> new text),"
        " applied to a scratch copy of the tree; the mutation's default-CI subset (the `tests/emulator`,"
        " `tests/cpu` and `tests/compile` files that import a module of a family the edited file belongs to,"
        " derived by `bench/mutations.py`) runs there with `pytest -x` and fresh private caches. *killed by*"
        " is the first failing test; *kind* says whether it is a value test (the kernel's or its model's"
        " output compared with a reference: emulator, Triton interpreter, torch) or a text check (PTX / SASS /"
        " constant / layout text, `tests/compile`), see `kill_kind`. Value tests run first, so a kill of kind"
        " text means every value test of the subset passed.",
        "",
        *([f"**Partial run**: only {', '.join(data['folders'])} of each subset.", ""]
          if list(data["folders"]) != list(FOLDERS) else []),
        f"Baseline (unmutated, union of the subsets): **{data['baseline']['status']}**"
        f" in {data['baseline'].get('seconds', 0):.0f} s.",
        "",
        f"**{len(killed)} of {len(rows)} killed**"
        f" ({sum(r.get('kind') == 'value' for r in killed)} by a value test,"
        f" {sum(r.get('kind') == 'text' for r in killed)} only by a text check);"
        f" survived: {', '.join(r['name'] for r in rows if r['status'] == 'survived') or 'none'};"
        f" timeout: {', '.join(r['name'] for r in rows if r['status'] == 'timeout') or 'none'}."
        f" Total run time {data['total_seconds'] / 60:.1f} min, sequential.",
        "",
        "| mutation | file | bug | families | result | killed by | kind | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        test = r.get("test") or ""
        if r.get("inner_test"):
            test += f" ({r['inner_test']})"
        file = r["file"].replace("src/nvgemm/", "")
        lines.append(f"| `{r['name']}` | `{file}` | {r['bug']} | {', '.join(r['families']) or '- (tests importing the module)'} | {r['status']} | "
                     f"{('`' + test + '`') if test else '-'} | {r.get('kind', '-')} | {r['seconds']:.0f} |")
    lines += ["", "Failure messages of the killing tests:", ""]
    for r in rows:
        if r["status"] == "killed":
            msg = (r.get("message") or "").replace("\n", " ").replace("|", "\\|")[:200]
            lines.append(f"- `{r['name']}`: {msg or '(no message)'}")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="bench/mutations.py",
        description="Apply realistic single-edit kernel mutations to a scratch copy of the tree, one at a time, and "
                    "run each one's derived default-CI test subset (pytest -x, fresh caches): killed or survived, by "
                    "which test, value test or text check.")
    ap.add_argument("--list", action="store_true", help="print the mutations and their derived subsets, run nothing")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutations (unknown names: exit 2)")
    ap.add_argument("--src-tree", type=Path, default=REPO,
                    help="the checkout to copy and mutate (default: the tree this script lives in)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per mutation")
    ap.add_argument("--baseline-timeout", type=float, default=5400.0, help="seconds for the unmutated baseline")
    ap.add_argument("--baseline-only", action="store_true",
                    help="run only the unmutated baseline of the selected mutations' subsets and write the results "
                         "(a separate baseline for a run made with --no-baseline)")
    ap.add_argument("--json", type=Path, default=REPO / "bench/results/mutations.json", help="JSON results file")
    ap.add_argument("--md", type=Path, default=REPO / "bench/results/mutations.md", help="Markdown results file")
    ap.add_argument("--folders", nargs="+", choices=FOLDERS, default=list(FOLDERS),
                    help="run only these folders of each subset (default: all three; a partial run says so in "
                         "its results)")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs pytest (default: this one)")
    ap.add_argument("--scratch", type=Path, default=None, help="parent of the scratch copies (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copies (logs in .mutation-*.log)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the unmutated baseline (debugging only; recorded in the results)")
    args = ap.parse_args(argv)

    by_name = {m.name: m for m in MUTATIONS}
    if args.baseline_only and args.no_baseline:
        ap.error("--baseline-only and --no-baseline exclude each other")
    if args.only:
        unknown = [n for n in args.only if n not in by_name]
        if unknown:
            print(f"bench/mutations.py: unknown mutation name(s): {', '.join(unknown)} "
                  f"(--list shows the {len(MUTATIONS)} names)", file=sys.stderr)
            return 2
        muts = [by_name[n] for n in dict.fromkeys(args.only)]
    else:
        muts = list(MUTATIONS)
    tree = args.src_tree.resolve()
    if not (tree / "src" / "nvgemm").is_dir() or not (tree / "tests").is_dir():
        print(f"bench/mutations.py: {tree} is not an nvgemm checkout (no src/nvgemm or tests)", file=sys.stderr)
        return 2
    problems = check_mutations(tree, muts)
    if problems:
        print("bench/mutations.py: the mutation list does not apply to " + str(tree) + ":\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 2
    subsets = {m.name: {f: ids for f, ids in subset_for(tree, m).items() if f in args.folders} for m in muts}

    if args.list:
        for m in muts:
            s = subsets[m.name]
            fams = ", ".join(affected_families(tree, m.file)) or "none (the tests that import the module itself)"
            print(f"{m.name}\n    {m.file}\n    {m.bug}\n    families: {fams}")
            for folder, ids in s.items():
                print(f"    {folder}: {' '.join(i.rsplit('/', 1)[-1] for i in ids)}")
        return 0

    def log(msg):
        print(msg, flush=True)

    cmd = "python " + " ".join(shlex.quote(a) for a in ([Path(sys.argv[0]).as_posix()] + sys.argv[1:]))
    commit = _git(tree, "rev-parse", "HEAD") or "unknown"
    branch = _git(tree, "rev-parse", "--abbrev-ref", "HEAD")
    data = {
        "command": cmd,
        "commit": commit,
        "dirty": bool(_git(tree, "status", "--porcelain", "--untracked-files=no")),
        "src_tree_note": f"tree {tree.name}" + (f", branch {branch}" if branch else ""),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs, no GPU; sequential"
        + (", under nice" if os.nice(0) > 0 else ""),
        "python": args.python,
        "folders": list(args.folders),
        "selected": [m.name for m in muts],
        "complete": False,
        "baseline": {"status": "not run yet"},
        "total_seconds": 0.0,
        "mutations": [],
    }
    t_all = time.monotonic()

    def save():
        data["total_seconds"] = round(time.monotonic() - t_all, 1)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        args.md.parent.mkdir(parents=True, exist_ok=True)
        write_md(args.md, data)

    if args.scratch:
        Path(args.scratch).mkdir(parents=True, exist_ok=True)  # the parent of the scratch copies may be new
    root = Path(tempfile.mkdtemp(prefix="nvgemm-mutations-", dir=args.scratch))
    try:
        if args.no_baseline:
            data["baseline"] = {"status": "skipped (--no-baseline)"}
        else:
            log(f"baseline (unmutated {tree}) ...")
            t0 = time.monotonic()
            work = scratch_copy(tree, root, "_baseline")
            res = run_subset(work, _merge_subsets(subsets.values()), args.python, args.baseline_timeout, log,
                             durations=True)
            per_file = res.pop("seconds", {})
            data["baseline"] = {**res, "seconds": round(time.monotonic() - t0, 1),
                                "file_seconds": {k: round(v, 1) for k, v in sorted(per_file.items())}}
            subsets = {name: fastest_first(sub, per_file) for name, sub in subsets.items()}
            log(f"  baseline: {res['status']} in {data['baseline']['seconds']:.0f} s")
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            save()
            if res["status"] != "passed":
                log(f"bench/mutations.py: the unmutated baseline did not pass ({res.get('test')}: "
                    f"{res.get('message')}); the run is invalid")
                return 3
        if args.baseline_only:
            muts = []
        for i, m in enumerate(muts, 1):
            log(f"[{i}/{len(muts)}] {m.name} ({m.file})")
            t0 = time.monotonic()
            work = scratch_copy(tree, root, m.name)
            apply(work, m)
            res = run_subset(work, subsets[m.name], args.python, args.timeout, log)
            dt = time.monotonic() - t0
            row = {"name": m.name, "file": m.file, "bug": m.bug, "families": list(affected_families(tree, m.file)),
                   "subset": subsets[m.name], "seconds": round(dt, 1)}
            if res["status"] == "passed":
                row["status"] = "survived"
            elif res["status"] == "timeout":
                row["status"] = "timeout"
                row["folder"] = res.get("folder")
            else:
                row["status"] = "killed"
                row.update({k: res[k] for k in ("test", "message", "inner_test", "summary") if k in res})
                row["kind"] = kill_kind(res["test"]) if res.get("test") else "value"
            data["mutations"].append(row)
            save()
            log(f"  -> {row['status']}" + (f" by {row.get('test')} [{row.get('kind')}]" if row["status"] == "killed"
                                          else "") + f" in {dt:.0f} s")
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        data["complete"] = True
        save()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    rows = data["mutations"]
    total = data["total_seconds"]
    log(f"wrote {args.json} and {args.md}; {sum(r['status'] == 'killed' for r in rows)} of {len(rows)} killed, "
        f"{total / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
