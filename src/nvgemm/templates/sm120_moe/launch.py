"""Host side of the sm_120a / sm_121a grouped W4A4 MoE path: kernel arguments and the whole layer
(:func:`moe_forward`). Pure torch (no cutlass); the kernels are launched through a caller-given
function (the AOT kernel on a GPU, the PTX emulator on CPU), so the CPU tests run exactly this host
path.

The operands are the sm100 grouped family's (:mod:`nvgemm.templates.sm100_moe.launch`), reused as is:
the stacked weights (:func:`~nvgemm.templates.sm100_moe.launch.cached_moe_stack`, here **without**
the gate/up interleave: the sm120 kernel pairs gate row tile ``t`` with up row tile ``t + I/16``),
the per-expert alpha tables, the per-slot NVFP4 activations with one 128-row scale atom per slot
and GEMM2's scale atoms. One layer = prep + GEMM1 + GEMM2 + finalize:

1. **Prep** (work list, GEMM1's B operand, the pair -> output row map, GEMM2's scale-atom padding):
   one Triton launch on CUDA (:func:`nvgemm.templates.sm100_moe.prep_triton.moe_prep_triton`), torch
   ops elsewhere (:func:`~nvgemm.templates.sm90_moe.launch.work_list`,
   :func:`~nvgemm.templates.sm100_moe.launch.slot_activations`).
2. **GEMM1** (gated, ``2I`` rows per expert): ``acc * alpha13[e]`` -> SiLU-mul -> round to the
   activation dtype -> NVFP4 with ``w2_input_scale[e]``, written as GEMM2's B operand directly.
3. **GEMM2**: ``y = acc2 * alpha2[e]`` in fp32 ``[slots * tile_n, H]``.
4. **Finalize**: :func:`nvgemm.templates.sm90_moe.launch.finalize` (fp32, top-k slots in order, no
   atomics, shared_out + residual in the same pass).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.core.formats import NVFP4, blocked_numel
from nvgemm.templates.common.triton_stand_in import stand_in
from nvgemm.templates.common.grouped_moe import w4a4_moe_prelude
from nvgemm.templates.common.workspace import WORKSPACES
from nvgemm.templates.sm100_moe.launch import (
    Sm100MoeStack,
    alpha_table,
    b2_scale_atoms_ref,
    cached_moe_stack,
    gemm1_epilogue,
    slot_activations,
    slot_rows_of_pairs,
)
from nvgemm.templates.sm120_moe.config import Sm120MoeConfig, moe_shape_problem
from nvgemm.templates.sm120_w4a4.config import ROW_TILE
from nvgemm.templates.sm90_moe.launch import MoeWorkList, finalize, work_list
from nvgemm.templates.sm90_w4a16.launch import _memo

_E4M3 = torch.float8_e4m3fn


@dataclass
class Sm120MoeGemmArgs:
    """One grouped GEMM's arguments in ABI order (:func:`~.kernel.abi_args`)."""

    x: torch.Tensor  # uint8 [slots * tile_n, K/2]
    x_scale: torch.Tensor  # uint8 1-D, one 128-row atom per slot
    weight: torch.Tensor  # uint8 [E * rows_padded, K/2]
    weight_scale: torch.Tensor  # uint8 1-D
    alpha: torch.Tensor  # fp32 [E * stride]
    tiles: torch.Tensor  # int32 [4 * slots]
    out: torch.Tensor  # GEMM1: uint8 codes [slots * tile_n, I/2]; GEMM2: fp32 [slots * tile_n, H]
    out_scale: torch.Tensor  # GEMM1: uint8 1-D per-slot atoms; GEMM2: a tensor never read
    work: torch.Tensor
    count: torch.Tensor
    rows: int
    rows_padded: int
    spec: EpilogueSpec
    config: Sm120MoeConfig

    def abi_values(self) -> tuple:
        return (self.x, self.x_scale, self.weight, self.weight_scale, self.alpha, self.tiles, self.out,
                self.out_scale, self.work, self.count, self.rows, self.rows_padded)


def split_k_needs(config: Sm120MoeConfig, tokens: int, rows: int, gated: bool) -> tuple[int, int]:
    """(fp32 workspace elements ``[split][tokens][rows padded to 16]``, tile counters) of one grouped
    GEMM over ``tokens`` = slots x tile_n rows (0, 0 without split-K)."""
    if config.split_k <= 1:
        return 0, 0
    n_pad = -(-rows // ROW_TILE) * ROW_TILE
    feat = config.tile_rows // 2 if gated else config.tile_rows
    n_out = rows // 2 if gated else rows
    return config.split_k * tokens * n_pad, -(-n_out // feat) * (tokens // config.tile_n)


def _workspace(config, tokens, rows, gated, dev, stream_id, stand_in_t):
    if config.split_k <= 1:
        return stand_in_t, torch.zeros(1, dtype=torch.int32, device=dev) if dev.type != "cuda" else \
            _count_stand_in(dev)
    wn, cn = split_k_needs(config, tokens, rows, gated)
    return WORKSPACES.get(dev, wn, cn, stream_id)


_COUNT: dict = {}


def _count_stand_in(dev):
    t = _COUNT.get(str(dev))
    if t is None:
        t = _COUNT.setdefault(str(dev), torch.zeros(1, dtype=torch.int32, device=dev))
    return t


def cached_alpha_tables(w13_scale_2, w13_input_scale, w2_scale_2, w2_input_scale, s13: Sm100MoeStack,
                        s2: Sm100MoeStack):
    """(GEMM1 alpha kind, GEMM1 table with the requant's input scales, GEMM2 alpha kind, GEMM2 table),
    memoized per scale tensors (the stacks keep the checkpoint's row order)."""

    def make():
        kind13, a13 = alpha_table(w13_scale_2, w13_input_scale, s13, w2_input_scale)
        kind2, a2 = alpha_table(w2_scale_2, w2_input_scale, s2)
        return kind13, a13, kind2, a2

    return _memo("sm120_moe_alpha", w13_scale_2, (w13_scale_2, w13_input_scale, w2_scale_2, w2_input_scale), make)


def gemm2_epilogue(alpha_kind: str = "scalar") -> EpilogueSpec:
    """GEMM2's epilogue (part of its kernel's key): fp32 rows, alpha per expert or per row."""
    return EpilogueSpec(alpha=alpha_kind, activation="none", out_dtype=torch.float32)


def call_kernels(config13: Sm120MoeConfig, config2: Sm120MoeConfig, x_dtype: torch.dtype, alpha13: str = "scalar",
                 alpha2: str = "scalar") -> tuple:
    """``((config, epilogue) of GEMM1, (config, epilogue) of GEMM2)``: the two kernels :func:`moe_forward`
    launches (the same for every token count: the finalize is a separate kernel)."""
    return (config13, gemm1_epilogue(alpha13, x_dtype)), (config2, gemm2_epilogue(alpha2))


def gemm1_args(config: Sm120MoeConfig, b: torch.Tensor, sfb: torch.Tensor, wl: MoeWorkList, stack: Sm100MoeStack,
               alpha_kind: str, alpha: torch.Tensor, x_dtype: torch.dtype, stream_id: int = 0,
               out_scales: Optional[torch.Tensor] = None) -> Sm120MoeGemmArgs:
    """GEMM1 (gated, fused requant): output = GEMM2's B operand (codes + per-slot scale atoms).
    ``out_scales``: the atoms with their padding already zeroed (the prep kernel's); default
    :func:`~nvgemm.templates.sm100_moe.launch.b2_scale_atoms_ref` (0xFF where the kernel must write)."""
    if stack.perm is not None:
        raise ValueError("nvgemm sm120 moe: GEMM1's stack must keep the [gate | up] row order (gated=False stack)")
    if why := moe_shape_problem(config, stack.rows, stack.k, True):
        raise ValueError(f"nvgemm sm120 moe: GEMM1 {config.name()}: {why}")
    i = stack.rows // 2
    tokens = wl.slots * config.tile_n
    dev = b.device
    codes = torch.empty((tokens, i // 2), dtype=torch.uint8, device=dev)  # empty slots: never written, never read
    scales = b2_scale_atoms_ref(wl.slots, config.tile_n, i, dev) if out_scales is None else out_scales
    if scales.numel() != wl.slots * blocked_numel(128, i // NVFP4.block_size):
        raise ValueError(f"nvgemm sm120 moe: GEMM2's scale atoms hold {scales.numel()} bytes, expected "
                         f"{wl.slots * blocked_numel(128, i // NVFP4.block_size)}")
    spec = gemm1_epilogue(alpha_kind, x_dtype)
    work, count = _workspace(config, tokens, stack.rows, True, dev, stream_id, alpha)
    return Sm120MoeGemmArgs(b, sfb.reshape(-1).view(torch.uint8), stack.weight, stack.scale.view(torch.uint8), alpha,
                            wl.tiles, codes, scales.view(torch.uint8), work, count, stack.rows, stack.rows_padded,
                            spec, config)


def gemm2_args(config: Sm120MoeConfig, a1: Sm120MoeGemmArgs, wl: MoeWorkList, stack: Sm100MoeStack,
               alpha_kind: str, alpha: torch.Tensor, stream_id: int = 0) -> Sm120MoeGemmArgs:
    """GEMM2: B = GEMM1's requantized output, y = acc * alpha2[e] in fp32 ``[slots * tile_n, H]``."""
    if why := moe_shape_problem(config, stack.rows, stack.k, False):
        raise ValueError(f"nvgemm sm120 moe: GEMM2 {config.name()}: {why}")
    if config.tile_n != a1.config.tile_n:
        raise ValueError(f"nvgemm sm120 moe: GEMM1 and GEMM2 share one work list: tile_n {a1.config.tile_n} != "
                         f"{config.tile_n}")
    if stack.k != a1.rows // 2:
        raise ValueError(f"nvgemm sm120 moe: GEMM2 has K={stack.k}, GEMM1 produces I={a1.rows // 2}")
    tokens = a1.out.shape[0]
    dev = a1.out.device
    y = torch.empty((tokens, stack.rows), dtype=torch.float32, device=dev)
    spec = gemm2_epilogue(alpha_kind)
    work, count = _workspace(config, tokens, stack.rows, False, dev, stream_id, alpha)
    return Sm120MoeGemmArgs(a1.out, a1.out_scale, stack.weight, stack.scale.view(torch.uint8), alpha, wl.tiles, y,
                            a1.out_scale, work, count, stack.rows, stack.rows_padded, spec, config)


Launch = Callable[[Sm120MoeGemmArgs], None]


def moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                w2_scale_2, w2_input_scale, activation, router_weight_on_input, shared_out, residual, out_dtype,
                config13: Sm120MoeConfig, config2: Sm120MoeConfig, launch: Launch, keep: Optional[dict] = None,
                stream_id: int = 0) -> torch.Tensor:
    """One W4A4 ``nvfp4_moe`` call (``silu_mul``) through the grouped sm120 kernels (``launch`` runs a
    GEMM's arguments on the right kernel). ``keep`` receives the work list and intermediates (tests)."""
    xin, wts, out_dtype = w4a4_moe_prelude("sm120", x, topk_weights, activation, w13_input_scale, w2_input_scale,
                                          config13, config2, router_weight_on_input, out_dtype)
    tn = config13.tile_n
    s13 = cached_moe_stack(w13, w13_scale, False)  # [gate | up]: the kernel pairs row tiles t and t + I/16
    s2 = cached_moe_stack(w2, w2_scale, False)
    kind13, alpha13, kind2, alpha2 = cached_alpha_tables(w13_scale_2, w13_input_scale, w2_scale_2, w2_input_scale,
                                                         s13, s2)
    kernel = stand_in("nvgemm.templates.sm100_moe.prep_triton", "_moe_prep_kernel", xin.device)
    if xin.device.type == "cuda" or kernel is not None:  # one Triton launch at decode (CPU: the emulator's)
        # lazy: triton import cost
        from nvgemm.templates.sm100_moe.prep_triton import moe_prep_triton

        prep = moe_prep_triton(xin, topk_ids, expert_map, w13.shape[0], w13_input_scale, tn, s13.rows // 2,
                               kernel=kernel)
        wl, b1, sfb1, yrow, sf2 = prep.work_list, prep.codes, prep.scales, prep.y_rows, prep.b2_scales
    else:
        wl = work_list(topk_ids, expert_map, w13.shape[0], tn)
        b1, sfb1 = slot_activations(xin, wl, w13_input_scale, tn)
        yrow = slot_rows_of_pairs(wl, tn)
        sf2 = None
    a1 = gemm1_args(config13, b1, sfb1, wl, s13, kind13, alpha13, x.dtype, stream_id, out_scales=sf2)
    launch(a1)
    a2 = gemm2_args(config2, a1, wl, s2, kind2, alpha2, stream_id)
    launch(a2)
    out = finalize(a2.out, dataclasses.replace(wl, pos=yrow), wts, shared_out, residual, out_dtype)
    if keep is not None:
        keep.update(work_list=wl, args13=a1, args2=a2, y_rows=yrow)
    return out


__all__ = ["Sm120MoeGemmArgs", "cached_alpha_tables", "call_kernels", "gemm1_args", "gemm2_args", "gemm2_epilogue",
           "moe_forward", "split_k_needs"]
