"""Host side of the sm_100a grouped W4A4 MoE path: stacked weights, per-slot NVFP4 activations,
kernel arguments and the whole layer (:func:`moe_forward`). Pure torch (no cutlass); the kernels
are launched through a caller-given function (the AOT kernel on a GPU, the PTX emulator on CPU),
so the CPU tests run exactly this host path.

One layer = prep + GEMM1 (fused SwiGLU + NVFP4 requant) + GEMM2 + finalize: **4 launches** on CUDA at
decode (up to :data:`~.prep_triton.FUSED_MAX_PAIRS` pairs; 6 above: work-list kernel, prep, a gather):

1. **Work list**: :func:`nvgemm.templates.sm90_moe.launch.work_list` with tiles of ``tile_n``
   pairs: slot ``j = (e, p0, cnt)``; a fixed number of slots per (M, top_k, E), so the grid of a
   CUDA graph does not depend on the routing.
2. **Activation prep** (:func:`slot_activations`): slot ``j``'s row ``t < cnt`` is the token of
   permuted pair ``p0 + t``, quantized to NVFP4 with **its expert's** ``w13_input_scale[e]``
   (``nvgemm.core.formats.quantize_activation`` row by row: the contract's step 2 per pair); packed codes
   ``[slots * tile_n, H/2]``, scales as one 128-row swizzled atom per slot (rows >= cnt are zero).
   On CUDA steps 1 and 2, the pair -> output row map and the zero padding of GEMM2's scale atoms
   are one Triton launch (:mod:`.prep_triton`; nothing is zero-filled before it), which at decode also
   L2-prefetches GEMM1's stacked weights and scales of the selected experts; torch ops elsewhere (no
   host synchronisation).
3. **GEMM1** (``m`` = 2I interleaved gate/up rows per expert): ``acc * alpha13[e]`` -> SiLU-mul
   -> round to the activation dtype -> NVFP4 with ``w2_input_scale[e]``, written as GEMM2's B
   operand directly (codes ``[slots * tile_n, I/2]`` + per-slot scale atoms): the fused requant
   epilogue of :mod:`nvgemm.templates.sm100_w4a4.epilogue`, bit-exact with ``quantize_nvfp4`` of the
   rounded SwiGLU output.
4. **GEMM2**: ``y = acc2 * alpha2[e]`` in fp32, ``[slots * tile_n, H]``.
5. **Finalize**: :func:`nvgemm.templates.sm90_moe.launch.finalize` (fp32, slots in order, no
   atomics, shared_out + residual in the same pass) through the map pair -> slot row.

Batch invariance: a token's output depends only on its own B rows (each MMA N column is
independent), the expert's weights and the config's K split; the finalize sums its slots in order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.core.formats import NVFP4, blocked_numel, from_blocked, quantize_activation, to_blocked
from nvgemm.core.validation import alpha_of
from nvgemm.templates.sm100_w4a4.launch import gate_up_permutation
from nvgemm.templates.sm90_w4a16.launch import _memo, capturing
from nvgemm.templates.sm100_w4a4.launch import splitk_workspace_shape
from nvgemm.templates.common.grouped_moe import w4a4_moe_prelude
from nvgemm.templates.common.workspace import WORKSPACES
from nvgemm.templates.sm90_moe.config import fused_finalize_ok
from nvgemm.templates.sm90_moe.launch import FinalizeArgs, MoeWorkList, finalize, finalize_args, work_list
from nvgemm.templates.sm100_moe.config import (FUSED_PREP_MAX_PAIRS, Sm100MoeConfig, moe_shape_problem, padded_rows,
                                               validate_moe_config)
from nvgemm.templates.common.triton_stand_in import stand_in
from nvgemm.heuristics.perfmodel.hardware import get_hardware
from nvgemm.templates.sm100_moe.perf import prefetch_fits_l2

_E4M3 = torch.float8_e4m3fn


# --------------------------------------------------------------------------- stacked weights


@dataclass
class Sm100MoeStack:
    """One stacked expert weight as the kernel's A operand (see :func:`prepare_moe_stack`)."""

    weight: torch.Tensor  # uint8 [E * rows_padded, K/2]
    scale: torch.Tensor  # e4m3 1-D: the 128x4 swizzle of [E * rows_padded, K/16]
    perm: Optional[torch.Tensor]  # GEMM row -> checkpoint row (gated: gate/up interleave), None = identity
    rows: int  # GEMM rows per expert (2I gated)
    rows_padded: int
    k: int
    num_experts: int


def prepare_moe_stack(w: torch.Tensor, w_scale: torch.Tensor, gated: bool) -> Sm100MoeStack:
    """``[E, rows, K/2]`` packed weights + per-expert swizzled scales -> the stacked A operand:
    gated rows interleaved per expert (row 2j = gate j, 2j+1 = up j), rows padded with zero rows
    (zero scales) to a multiple of 128 per expert. The per-expert swizzled scales of
    ``rows_padded`` rows laid end to end *are* the 2-D swizzle of the stack (128-row atoms)."""
    e, rows, k2 = w.shape
    k = k2 * 2
    kb = k // NVFP4.block_size
    rp = padded_rows(rows)
    sc = w_scale.view(_E4M3) if w_scale.dtype == torch.uint8 else w_scale
    perm = gate_up_permutation(rows, w.device) if gated else None
    wp = torch.zeros((e, rp, k2), dtype=torch.uint8, device=w.device)
    wp[:, :rows] = w if perm is None else w[:, perm]
    if perm is None:
        sp = sc.reshape(e, -1)
    else:
        sp = torch.stack([to_blocked(from_blocked(sc[i], rows, kb)[perm].contiguous()).reshape(-1) for i in range(e)])
    if sp.shape[1] != blocked_numel(rp, kb):
        raise ValueError(f"nvgemm sm100 moe: per-expert scales hold {sp.shape[1]} bytes, expected "
                         f"{blocked_numel(rp, kb)} ({rows} rows, {kb} K blocks, swizzled)")
    return Sm100MoeStack(wp.reshape(e * rp, k2), sp.reshape(-1).contiguous(), perm, rows, rp, k, e)


def cached_moe_stack(w: torch.Tensor, w_scale: torch.Tensor, gated: bool) -> Sm100MoeStack:
    """:func:`prepare_moe_stack` memoized per weight tensor (re-derived when the weight or its scales
    change in place, dropped when the weight is freed); a fresh preparation on CUDA ends with a stream
    synchronisation outside capture."""

    def make() -> Sm100MoeStack:
        st = prepare_moe_stack(w, w_scale, gated)
        if w.device.type == "cuda" and not capturing(w.device):
            torch.cuda.current_stream(w.device).synchronize()
        return st

    return _memo(f"sm100_moe_stack:{gated}", w, (w, w_scale, gated), make)


# --------------------------------------------------------------------------- per-slot activations


def slot_geometry(wl: MoeWorkList, tile_n: int):
    """(expert [slots], permuted pair [slots, tile_n], row used [slots, tile_n]) of the work list."""
    t4 = wl.tiles.view(-1, 4).long()
    e, p0, cnt = t4[:, 0], t4[:, 1], t4[:, 2]
    t = torch.arange(tile_n, device=wl.tiles.device)
    return e, p0[:, None] + t[None, :], t[None, :] < cnt[:, None]


def slot_rows_of_pairs(wl: MoeWorkList, tile_n: int) -> torch.Tensor:
    """int64 [M, K]: the row of GEMM2's output (``slot * tile_n + t``) holding pair (token, slot)'s
    result (unused for empty / unmapped slots). Scatter through a spare entry: no host sync."""
    _e, p, ok = slot_geometry(wl, tile_n)
    npairs = wl.pos.numel()
    row_of_perm = torch.zeros(npairs + 1, dtype=torch.int64, device=p.device)
    idx = torch.where(ok, p, torch.full_like(p, npairs)).reshape(-1)
    row_of_perm.scatter_(0, idx, torch.arange(idx.numel(), device=p.device))
    return row_of_perm[wl.pos]


def slot_sf_atoms(scale: torch.Tensor, slots: int, tile_n: int) -> torch.Tensor:
    """Linear e4m3 scales ``[slots * tile_n, K/16]`` -> one 128x4-swizzled 128-row atom per slot (1-D)."""
    kb = scale.shape[1]
    atoms = torch.zeros((slots, 128, kb), dtype=_E4M3, device=scale.device)
    atoms[:, :tile_n] = scale.reshape(slots, tile_n, kb)
    return to_blocked(atoms.reshape(slots * 128, kb)).reshape(-1)


def slot_activations(x: torch.Tensor, wl: MoeWorkList, input_scale: torch.Tensor, tile_n: int):
    """GEMM1's B operand: (codes uint8 [slots * tile_n, H/2], scales e4m3 1-D, one atom per slot).
    Row ``t`` of slot ``j = (e, p0, cnt)`` is ``x[rows[p0 + t]]`` quantized with ``input_scale[e]``
    (``t < cnt``), else zero."""
    e, p, ok = slot_geometry(wl, tile_n)
    npairs = wl.rows.numel()
    tok = wl.rows.long()[p.clamp(max=npairs - 1)]
    xs = torch.where(ok.reshape(-1, 1), x[tok.reshape(-1)], torch.zeros((), dtype=x.dtype, device=x.device))
    gs = torch.where(ok, input_scale.float()[e][:, None], torch.ones((), device=x.device)).reshape(-1)
    codes, scale = quantize_activation(xs, gs)
    return codes, slot_sf_atoms(scale, wl.slots, tile_n)


# --------------------------------------------------------------------------- GEMM arguments


@dataclass
class Sm100MoeGemmArgs:
    """One grouped GEMM's arguments in ABI order (:class:`~.kernel.Sm100MoeTemplate`)."""

    a: torch.Tensor
    b: torch.Tensor
    sfa: torch.Tensor
    sfb: torch.Tensor
    c: torch.Tensor
    alpha: torch.Tensor
    tiles: torch.Tensor
    residual: Optional[torch.Tensor]
    workspace: Optional[torch.Tensor]
    counters: Optional[torch.Tensor]
    m: int
    n: int
    k: int
    a_rows: int
    spec: EpilogueSpec
    config: Sm100MoeConfig
    fin: Optional[FinalizeArgs] = None  # the finalize GEMM2 runs (``config.finalize``)
    next_stack: Optional[Sm100MoeStack] = None  # GEMM2's weights GEMM1 L2-prefetches (``config.prefetch_next``)

    def abi_values(self) -> tuple:
        z = (lambda t: t if t is not None else 0)  # noqa: E731
        f = self.fin
        fin = (0, 0, 0, 0, 0, 0, 0, 0) if f is None else (
            f.out, f.shared, f.residual, f.y_rows, f.weights, f.flags, f.out.shape[0], f.y_rows.numel() // f.out.shape[0])
        s2 = self.next_stack
        nxt = (0, 0, 0, 0) if s2 is None else (s2.weight, s2.scale, s2.rows, s2.num_experts * s2.rows_padded)
        return (self.a, self.b, self.sfa, self.sfb, self.c, self.alpha, self.tiles, z(self.residual),
                z(self.workspace), z(self.counters)) + fin[:6] + (self.m, self.n, self.k, self.a_rows) + fin[6:] + nxt


def alpha_table(weight_scale_2: torch.Tensor, input_scale: torch.Tensor, stack: Sm100MoeStack,
                next_input_scale: Optional[torch.Tensor] = None) -> tuple[str, torch.Tensor]:
    """(alpha kind, fp32 [E * stride]): per expert ``input_scale[e] * weight_scale_2[e]`` (one value)
    or per GEMM row (``[E, rows]`` scale_2, permuted like the stack's rows), then the next layer's
    input scale when the epilogue requantizes (the kernel's per-expert stride)."""
    in_ = input_scale.reshape(-1, 1)
    g = weight_scale_2
    if g.dim() == 2:
        kind = "vector"
        a = alpha_of(g if stack.perm is None else g[:, stack.perm], in_)
    else:
        kind = "scalar"
        a = alpha_of(g.reshape(-1, 1), in_)
    if next_input_scale is not None:
        a = torch.cat([a, next_input_scale.float().reshape(-1, 1)], dim=1)
    return kind, a.reshape(-1).contiguous()


def cached_alpha_tables(w13_scale_2, w13_input_scale, w2_scale_2, w2_input_scale, s13: Sm100MoeStack,
                        s2: Sm100MoeStack):
    """(GEMM1 alpha kind, GEMM1 table with the requant's input scales, GEMM2 table), memoized per
    scale tensors like the stacks (no launches per call once made)."""

    def make():
        kind13, a13 = alpha_table(w13_scale_2, w13_input_scale, s13, w2_input_scale)
        return kind13, a13, alpha_table(w2_scale_2, w2_input_scale, s2)[1]

    return _memo("sm100_moe_alpha", w13_scale_2, (w13_scale_2, w13_input_scale, w2_scale_2, w2_input_scale), make)


def _split_k(config, m, n, dev, stream_id):
    if config.split_k == 1 and not config.finalize:
        return None, None
    ws_numel, n_cnt = splitk_workspace_shape(m, n, config.dense()) if config.split_k > 1 else (1, 0)
    if config.finalize:  # the row tiles' finalize counters follow the split-K ones
        n_cnt += -(-m // 128)
    return WORKSPACES.get(dev, ws_numel, n_cnt, stream_id)


def b2_scale_atoms_ref(slots: int, tile_n: int, inter: int, device) -> torch.Tensor:
    """GEMM2's B scale atoms as the prep leaves them (torch; the CPU / emulator path): rows ``tile_n..127``
    and the K blocks past ``I/16`` zero (GEMM2 reads them, GEMM1 never writes them), every byte GEMM1's
    requant epilogue writes set to 0xFF first -- a NaN e4m3 scale, so a byte the kernel failed to write
    shows in the emulator's result instead of reading as a lucky zero. On CUDA the prep kernel
    (:mod:`.prep_triton`) zeroes the same bytes of an uninitialised buffer."""
    kb = inter // NVFP4.block_size
    kb_tiles = -(-kb // 4)
    atoms = torch.full((slots, kb_tiles, 32, 4, 4), 0xFF, dtype=torch.uint8, device=device)
    r = torch.arange(128, device=device)
    c = torch.arange(kb_tiles * 4, device=device)
    pad = (r[:, None] >= tile_n) | (c[None, :] >= kb)  # [128, kb_tiles * 4] in the linear (row, block) frame
    lin = pad.reshape(4, 32, kb_tiles, 4).permute(2, 1, 0, 3)  # the 128x4 swizzle: (tile, r % 32, r // 32, kb % 4)
    atoms[:, lin] = 0
    return atoms.reshape(-1)


def gemm1_epilogue(alpha_kind: str, x_dtype: torch.dtype) -> EpilogueSpec:
    """GEMM1's epilogue (part of its kernel's key): alpha per expert ("scalar") or per row ("vector"), SwiGLU,
    the NVFP4 requant of GEMM2's input."""
    return EpilogueSpec(alpha=alpha_kind, activation="silu_mul", out_dtype=x_dtype, out_quant=True)


def gemm2_epilogue(finalize_dtype: Optional[torch.dtype] = None) -> EpilogueSpec:
    """GEMM2's epilogue: fp32 rows, or with the fused finalize its rounding to ``finalize_dtype``."""
    return EpilogueSpec(alpha="scalar", activation="none",
                        out_dtype=torch.float32 if finalize_dtype is None else finalize_dtype)


def gemm2_config(config: Sm100MoeConfig, fuse: bool) -> Sm100MoeConfig:
    """GEMM2's config as a call runs it: the finalize fused or not, early weight loads with PDL."""
    return dataclasses.replace(config, finalize=fuse, early_weights=config.pdl)


def fuses_finalize(m: int, top_k: int, x_dtype, out_dtype, shared_out=None, residual=None) -> bool:
    """Whether GEMM2 of a CUDA call runs the finalize: the one-launch prep made its row table (at most
    :data:`~.config.FUSED_PREP_MAX_PAIRS` pairs) and :func:`~nvgemm.templates.sm90_moe.config.fused_finalize_ok`."""
    return 0 < m * top_k <= FUSED_PREP_MAX_PAIRS and fused_finalize_ok(m, x_dtype, out_dtype, shared_out, residual)


def call_kernels(m: int, top_k: int, config13: Sm100MoeConfig, config2: Sm100MoeConfig, x_dtype: torch.dtype,
                 out_dtype: Optional[torch.dtype] = None, alpha13: str = "scalar", shared_out=None,
                 residual=None) -> tuple:
    """``((config, epilogue) of GEMM1, (config, epilogue) of GEMM2)``: the two kernels a CUDA
    :func:`moe_forward` of ``m`` tokens launches (what it asks the kernel cache for)."""
    out_dtype = out_dtype or x_dtype
    fuse = fuses_finalize(m, top_k, x_dtype, out_dtype, shared_out, residual)
    return ((config13, gemm1_epilogue(alpha13, x_dtype)),
            (gemm2_config(config2, fuse), gemm2_epilogue(out_dtype if fuse else None)))


def gemm1_args(config: Sm100MoeConfig, b: torch.Tensor, sfb: torch.Tensor, wl: MoeWorkList, stack: Sm100MoeStack,
               alpha_kind: str, alpha: torch.Tensor, x_dtype: torch.dtype, stream_id: int = 0,
               out_scales: Optional[torch.Tensor] = None,
               next_stack: Optional[Sm100MoeStack] = None) -> Sm100MoeGemmArgs:
    """GEMM1 (gated, fused requant): output = GEMM2's B operand (codes + per-slot scale atoms).
    ``out_scales``: the scale atoms with their padding already zeroed (the prep kernel's); default
    :func:`b2_scale_atoms_ref`. ``next_stack``: GEMM2's stacked weights, which GEMM1 L2-prefetches
    (needed exactly when ``config.prefetch_next``)."""
    validate_moe_config(config).raise_if_failed("sm100 moe config")
    if why := moe_shape_problem(config, stack.rows, stack.k, True):
        raise ValueError(f"nvgemm sm100 moe: GEMM1 {config.name()}: {why}")
    i = stack.rows // 2
    if config.prefetch_next != (next_stack is not None):
        raise ValueError(f"nvgemm sm100 moe: GEMM1 {config.name()}: GEMM2's weights (next_stack) "
                         f"{'missing' if config.prefetch_next else 'given to a GEMM1 without prefetch_next'}")
    if next_stack is not None and (next_stack.k != i or next_stack.num_experts != stack.num_experts):
        raise ValueError(f"nvgemm sm100 moe: GEMM1 {config.name()} prefetches GEMM2 weights of K={next_stack.k} over "
                         f"{next_stack.num_experts} experts, expected K = I = {i} over {stack.num_experts}")
    n = wl.slots * config.tile_n
    dev = b.device
    codes = torch.empty((n, i // 2), dtype=torch.uint8, device=dev)  # empty slots: never written, never read
    # the kernel writes rows < tile_n of the real K blocks; GEMM2 also reads the (zeroed) rest
    scales = b2_scale_atoms_ref(wl.slots, config.tile_n, i, dev) if out_scales is None else out_scales
    if scales.numel() != wl.slots * blocked_numel(128, i // NVFP4.block_size):
        raise ValueError(f"nvgemm sm100 moe: GEMM2's scale atoms hold {scales.numel()} bytes, expected "
                         f"{wl.slots * blocked_numel(128, i // NVFP4.block_size)}")
    spec = gemm1_epilogue(alpha_kind, x_dtype)
    ws, cnt = _split_k(config, stack.rows, n, dev, stream_id)
    return Sm100MoeGemmArgs(stack.weight, b, stack.scale, sfb, codes, alpha, wl.tiles, scales, ws, cnt,
                            stack.rows, n, stack.k, stack.num_experts * stack.rows_padded, spec, config,
                            next_stack=next_stack)


def gemm2_args(config: Sm100MoeConfig, a1: Sm100MoeGemmArgs, wl: MoeWorkList, stack: Sm100MoeStack,
               alpha: torch.Tensor, stream_id: int = 0, fin: Optional[FinalizeArgs] = None) -> Sm100MoeGemmArgs:
    """GEMM2: B = GEMM1's requantized output, y = acc * alpha2[e] in fp32 ``[slots * tile_n, H]``;
    with ``fin`` (``config.finalize``) the kernel also runs the top-k finalize into ``fin.out``."""
    if config.finalize != (fin is not None):
        raise ValueError(f"nvgemm sm100 moe: {config.name()}: finalize arguments "
                         f"{'missing' if config.finalize else 'given to a GEMM without finalize'}")
    if fin is not None and (fin.out.shape[1] != stack.rows or fin.y_rows.numel() % max(1, fin.out.shape[0])):
        raise ValueError(f"nvgemm sm100 moe: the finalize's output is {tuple(fin.out.shape)}, expected [M, "
                         f"{stack.rows}] with M dividing the {fin.y_rows.numel()} pairs")
    validate_moe_config(config).raise_if_failed("sm100 moe config")
    if why := moe_shape_problem(config, stack.rows, stack.k, False):
        raise ValueError(f"nvgemm sm100 moe: GEMM2 {config.name()}: {why}")
    if config.tile_n != a1.config.tile_n:
        raise ValueError(f"nvgemm sm100 moe: GEMM1 and GEMM2 share one work list: tile_n {a1.config.tile_n} != "
                         f"{config.tile_n}")
    if stack.k != a1.m // 2:
        raise ValueError(f"nvgemm sm100 moe: GEMM2 has K={stack.k}, GEMM1 produces I={a1.m // 2}")
    n = a1.n
    dev = a1.c.device
    y = torch.empty((n, stack.rows), dtype=torch.float32, device=dev)
    # with the finalize, out_dtype is the finalize's rounding (y stays fp32: the kernel's c)
    spec = gemm2_epilogue(None if fin is None else fin.out.dtype)
    ws, cnt = _split_k(config, stack.rows, n, dev, stream_id)
    return Sm100MoeGemmArgs(stack.weight, a1.c, stack.scale, a1.residual.view(_E4M3), y, alpha, wl.tiles, None, ws,
                            cnt, stack.rows, n, stack.k, stack.num_experts * stack.rows_padded, spec, config, fin)


# --------------------------------------------------------------------------- the layer

_L2: dict = {}


def l2_bytes(device: torch.device) -> float:
    """The L2 size the decode prefetches are bounded by: the CUDA device's own (asked once per device); elsewhere
    (the PTX emulator's stand-in) the B200 model's."""
    key = (device.type, device.index)
    if key not in _L2:
        if device.type == "cuda":
            _L2[key] = float(torch.cuda.get_device_properties(device).L2_cache_size)
        else:
            _L2[key] = get_hardware("B200").l2_mb * 1e6
    return _L2[key]


Launch = Callable[[Sm100MoeGemmArgs], None]


def moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w13_input_scale, w2, w2_scale,
                w2_scale_2, w2_input_scale, activation, router_weight_on_input, shared_out, residual, out_dtype,
                config13: Sm100MoeConfig, config2: Sm100MoeConfig, launch: Launch, keep: Optional[dict] = None,
                stream_id: int = 0) -> torch.Tensor:
    """One W4A4 ``nvfp4_moe`` call (``silu_mul``) through the grouped kernels (``launch`` runs a
    GEMM's arguments on the right kernel). ``keep`` receives the tables and intermediates (tests)."""
    xin, wts, out_dtype = w4a4_moe_prelude("sm100", x, topk_weights, activation, w13_input_scale, w2_input_scale,
                                          config13, config2, router_weight_on_input, out_dtype)
    tn = config13.tile_n
    s13 = cached_moe_stack(w13, w13_scale, True)
    s2 = cached_moe_stack(w2, w2_scale, False)
    kind13, alpha13, alpha2 = cached_alpha_tables(w13_scale_2, w13_input_scale, w2_scale_2, w2_input_scale, s13, s2)
    kernel = stand_in("nvgemm.templates.sm100_moe.prep_triton", "_moe_prep_kernel", xin.device)
    if xin.device.type == "cuda" or kernel is not None:  # one Triton launch at decode (CPU: the emulator's)
        # lazy: triton import cost
        from nvgemm.templates.sm100_moe.prep_triton import moe_prep_triton

        # the prep also L2-prefetches GEMM1's weights of the experts the routing selects (fused launch), where
        # both GEMMs' routed weights fit the L2 bound (perf.prefetch_fits_l2; the policy asks the same question)
        pf = prefetch_fits_l2(topk_ids.numel(), w13.shape[0], s13.rows, s13.k, s2.rows, s2.k, l2_bytes(xin.device))
        prep = moe_prep_triton(xin, topk_ids, expert_map, w13.shape[0], w13_input_scale, tn, s13.rows // 2,
                               kernel=kernel, w13=s13.weight if pf else None, w13_scale=s13.scale if pf else None)
        wl, b1, sfb1, yrow, sf2 = prep.work_list, prep.codes, prep.scales, prep.y_rows, prep.b2_scales
        yfin = prep.finalize_rows
    else:
        wl = work_list(topk_ids, expert_map, w13.shape[0], tn)
        b1, sfb1 = slot_activations(xin, wl, w13_input_scale, tn)
        yrow = slot_rows_of_pairs(wl, tn)
        yfin = torch.where(wl.valid, yrow, torch.full_like(yrow, -1)).to(torch.int32).reshape(-1)
        sf2 = None
    a1 = gemm1_args(config13, b1, sfb1, wl, s13, kind13, alpha13, x.dtype, stream_id, out_scales=sf2,
                    next_stack=s2 if config13.prefetch_next else None)
    launch(a1)
    fuse = yfin is not None and fused_finalize_ok(x.shape[0], x.dtype, out_dtype, shared_out, residual)
    fin = None
    if fuse:  # GEMM2 runs the finalize: 3 launches
        fin = finalize_args(dataclasses.replace(wl, y_rows=yfin), wts, shared_out, residual, out_dtype, s2.rows)
    a2 = gemm2_args(gemm2_config(config2, fuse), a1, wl, s2, alpha2,
                    stream_id, fin=fin)
    launch(a2)
    if fuse:
        out = fin.out
    else:
        out = finalize(a2.c, dataclasses.replace(wl, pos=yrow), wts, shared_out, residual, out_dtype)
    if keep is not None:
        keep.update(work_list=wl, args13=a1, args2=a2, y_rows=yrow)
    return out


__all__ = ["Sm100MoeGemmArgs", "Sm100MoeStack", "alpha_table", "b2_scale_atoms_ref", "cached_moe_stack", "call_kernels",
           "fuses_finalize", "gemm1_args", "gemm1_epilogue", "gemm2_args", "gemm2_config", "gemm2_epilogue",
           "moe_forward", "prepare_moe_stack", "slot_activations", "slot_rows_of_pairs", "slot_sf_atoms"]
