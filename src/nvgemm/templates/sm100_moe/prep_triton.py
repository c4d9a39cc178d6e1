"""The host prep of the sm100 grouped MoE path as ONE Triton launch at decode (CUDA; runs under
``TRITON_INTERPRET=1``): the work list, GEMM1's B operand (per-slot NVFP4 activations) and the
zero padding of GEMM2's B scale atoms, bit for bit the torch construction
(:func:`nvgemm.templates.sm90_moe.launch.build_work_list`, :func:`~.launch.slot_activations`,
:func:`~.launch.slot_rows_of_pairs`).

Program ``(j, kt)`` of the grid ``(work slots, K tiles)``:

* **work list** (``FUSED``, at most :data:`FUSED_MAX_PAIRS` pairs): every program recomputes it from
  the ids -- no inter-program synchronisation, the ids are a few hundred bytes. Pair ``i``'s key is
  its local expert (``E`` for an empty / unmapped slot); its permuted row is its rank in
  ``(key, pair)`` order (the stable sort of the torch construction, as a ``BLOCK x BLOCK``
  comparison), its rank inside its expert and its expert's pair count likewise; an expert's first
  work slot is the sum of the tile counts of the experts before it. Slot ``j`` finds the expert whose
  slots cover ``j``: ``(e, first permuted row, rows <= tile_n)``. Program ``(0, 0)`` stores the
  tables (``rows``, ``pos``, ``valid``, ``counts``, and per pair the row of the slot-major GEMM
  outputs that holds its result, for the finalize, and as int32 with -1 for an empty slot for the
  finalize GEMM2 runs); program ``(j, 0)`` stores slot ``j``'s tile.
  Without ``FUSED`` the tables come from a work list built before (``tiles``, ``rows``) and the
  program stores where each permuted row lands (the finalize gathers it per pair).
* **activations**: the ``tile_n`` rows of slot ``j`` (source token ``rows[p0 + t]``, zeros for
  ``t >= cnt``), ``BLOCK_K`` columns ``kt``, quantized with the expert's input scale
  (``nvgemm.templates.triton._common``: the quantizer of ``nvgemm.core.formats``, true divisions, RNE
  e4m3 / E2M1; compiled without fp contraction): packed codes at rows ``j * tile_n + t``, e4m3 scales
  into slot ``j``'s 128-row swizzled atom, whose rows ``tile_n..127`` it writes as zeros (no zero
  fill before the launch).
* **GEMM2's B scale atoms** (program ``(j, 0)``): GEMM1's fused requant epilogue writes rows
  ``< tile_n`` of the real K blocks of slot ``j``'s atom; this program zeroes the rest (rows
  ``tile_n..127`` and the K blocks past ``I/16`` up to the atom's multiple of 4), so the buffer is
  allocated uninitialised.
* **L2 prefetch of GEMM1's weights** (``PREFETCH``: fused launches given ``w13`` / ``w13_scale``, not
  under the interpreter, which cannot run inline PTX). At decode the layer is launch-bound: GEMM1
  would start streaming its experts' weights from DRAM only after its own launch gap. So the prep,
  which already knows the routing, issues ``prefetch.global.L2::evict_last`` (PTX ISA 7.4, sm_80+)
  for every 128-byte line of each selected expert's block of GEMM1's stacked A operand: rows
  ``[e * rows_p, (e + 1) * rows_p)`` of the packed E2M1 weight ``[E * rows_p, H/2]`` and the same
  expert's scales, one contiguous ``rows_p * ceil(H/16 / 4) * 4``-byte range of the 128x4-swizzled
  stack (its 128-row atoms are row-tile major). The expert's first work slot does it -- its
  ``ceil(H / BLOCK_K)`` programs each take a contiguous ``1 / (K tiles)`` share of the weight lines
  and of the scale lines, so each line is named once -- and its other slots, empty slots and
  ``-1`` / unmapped pairs prefetch nothing. GEMM1's TMA loads then hit L2. A prefetch is a hint with
  no functional effect (the outputs are the same bytes with or without it); the PTX emulator records
  the lines (``Launch.ext["l2_prefetch_lines"]``) and refuses an address outside the kernel's
  tensors, and the tests require exactly the selected experts' lines, each once. It happens only where both
  GEMMs' routed weights fit the L2 bound (the launcher asks :func:`~.perf.prefetch_fits_l2` with the device's
  L2 size), so the lines are still there when GEMM1 reads them.
* **PDL** (sm_90+, ``NVGEMM_PDL``): launched with programmatic stream serialization; every program executes
  ``griddepcontrol.wait`` before its first read (the ids, the map and the activations are its predecessors'
  outputs) and ``griddepcontrol.launch_dependents`` right after it, so GEMM1 launches while the prep runs;
  GEMM1's own wait still waits for this grid to complete and its writes to be visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from nvgemm.templates.sm100_moe.config import FUSED_PREP_MAX_PAIRS as FUSED_MAX_PAIRS
from nvgemm.templates.sm90_moe.config import MoeWorkList, work_tiles_bound
from nvgemm.templates.triton._common import (is_interpreted, launch_options, nvfp4_quantize_tile, pdl_launch_dependents,
                                             pdl_wait, use_gdc)

_BLOCK_K = 128


@triton.jit
def _sf_atom_offset(slot, kb, r, kb_tiles):
    """Byte of (row ``r`` < 128, K block ``kb``) in slot ``slot``'s 128x4-swizzled scale atom."""
    return (slot * kb_tiles + kb // 4).to(tl.int64) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % 4


#: bytes of the L2 line one ``prefetch`` names (the emulator records prefetches in these lines)
L2_LINE: tl.constexpr = tl.constexpr(128)
#: lines one program prefetches per loop step (one per thread at 4 warps)
PF_BLOCK: tl.constexpr = tl.constexpr(128)


@triton.jit
def _prefetch_l2(base, n_lines, part, parts, BLOCK: tl.constexpr):
    """Program ``part`` of ``parts``: one ``prefetch.global.L2::evict_last`` per 128-byte line of its
    contiguous share (``ceil(n_lines / parts)`` lines, the last share shorter) of the ``n_lines`` lines
    from ``base``."""
    per = (n_lines + parts - 1) // parts
    lo = part * per
    hi = tl.minimum(lo + per, n_lines)
    for l0 in range(lo, hi, BLOCK):
        line = l0 + tl.arange(0, BLOCK)
        # a hint without a result: the dummy output keeps the elementwise form, is_pure=False keeps it alive
        tl.inline_asm_elementwise(
            "{ .reg .pred %pf; setp.ne.s32 %pf, $2, 0; @%pf prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [base + line.to(tl.int64) * L2_LINE, (line < hi).to(tl.int32)], dtype=tl.int32,
            is_pure=False, pack=1)


@triton.jit
def _moe_prep_kernel(x_ptr, ids_ptr, map_ptr, ins_ptr, rows_ptr, tiles_ptr, pos_ptr, valid_ptr, counts_ptr,
                     yrow_ptr, yfin_ptr, q_ptr, sf_ptr, sf2_ptr, w13_ptr, w13_sf_ptr, K, stride_xm, P, E, KB2,
                     KB2_TILES, W13_LINES, W13_SF_LINES,
                     TOPK: tl.constexpr, TN: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                     FUSED: tl.constexpr, HAS_MAP: tl.constexpr, ZERO_SF2: tl.constexpr, PREFETCH: tl.constexpr,
                     USE_GDC: tl.constexpr = False):
    pdl_wait(USE_GDC)  # the ids, the map and x are the predecessors' outputs
    # GEMM1 may launch now: its own griddepcontrol.wait still waits for this grid to complete
    pdl_launch_dependents(USE_GDC)
    j = tl.program_id(0)
    kt = tl.program_id(1)
    t = tl.arange(0, TN)
    if FUSED:
        a = tl.arange(0, BLOCK)
        inb = a < P
        lid = tl.load(ids_ptr + a, mask=inb, other=-1)
        if HAS_MAP:  # expert parallelism: global id -> local expert or -1
            lid = tl.where(lid >= 0, tl.load(map_ptr + tl.maximum(lid, 0), mask=inb & (lid >= 0), other=-1), -1)
        key = tl.where(lid >= 0, lid, E)
        key = tl.where(inb, key, E + 1)  # padding after the empty slots
        c = key * BLOCK + a  # (key, pair): distinct, so ranks are a permutation (the stable sort)
        ci, cj = c[:, None], c[None, :]
        ki, kj = key[:, None], key[None, :]
        rank = tl.sum((cj < ci).to(tl.int32), axis=1)  # permuted row of pair i
        inner = tl.sum(((kj == ki) & (cj < ci)).to(tl.int32), axis=1)  # its rank inside its expert
        cnt = tl.sum((kj == ki).to(tl.int32), axis=1)  # pairs of its expert
        real = key < E
        nt = (cnt + TN - 1) // TN
        first = real & (inner == 0)
        tstart = tl.sum(tl.where(first[None, :] & (kj < ki), nt[None, :], 0), axis=1)  # expert's first slot
        offs = rank - inner  # expert's first permuted row
        sel = first & (tstart <= j) & (j < tstart + nt)
        i_in = j - tstart
        e = tl.sum(tl.where(sel, key, 0), axis=0)
        p0 = tl.sum(tl.where(sel, offs + i_in * TN, 0), axis=0)
        n_rows = tl.sum(tl.where(sel, tl.minimum(cnt - i_in * TN, TN), 0), axis=0)
        ok = t < n_rows
        hit = (rank[None, :] == (p0 + t)[:, None]) & ok[:, None] & inb[None, :]
        tok = tl.sum(tl.where(hit, a[None, :] // TOPK, 0), axis=1)
        if PREFETCH:  # GEMM1's weights of slot j's expert, once per expert: by its first slot's programs
            if tl.sum((sel & (tstart == j)).to(tl.int32), axis=0) > 0:
                nkt = tl.num_programs(1)
                _prefetch_l2(w13_ptr + e.to(tl.int64) * W13_LINES * L2_LINE, W13_LINES, kt, nkt, PF_BLOCK)
                _prefetch_l2(w13_sf_ptr + e.to(tl.int64) * W13_SF_LINES * L2_LINE, W13_SF_LINES, kt, nkt, PF_BLOCK)
        if kt == 0:
            tl.store(tiles_ptr + j * 4, e)
            tl.store(tiles_ptr + j * 4 + 1, p0)
            tl.store(tiles_ptr + j * 4 + 2, n_rows)
            tl.store(tiles_ptr + j * 4 + 3, 0)
            if j == 0:
                tl.store(valid_ptr + a, real.to(tl.int8), mask=inb)
                tl.store(pos_ptr + a, rank.to(tl.int64), mask=inb)
                tl.store(rows_ptr + rank, (a // TOPK).to(tl.int32), mask=inb)
                srow = (tstart + inner // TN) * TN + inner % TN
                tl.store(yrow_ptr + a, srow.to(tl.int64), mask=inb)
                tl.store(yfin_ptr + a, tl.where(real, srow, -1).to(tl.int32), mask=inb)  # -1: empty slot
                for e0 in range(0, E, BLOCK):
                    tl.store(counts_ptr + e0 + a, tl.zeros([BLOCK], dtype=tl.int64), mask=e0 + a < E)
                tl.debug_barrier()
                tl.store(counts_ptr + key, cnt.to(tl.int64), mask=first & inb)
    else:
        e = tl.load(tiles_ptr + j * 4)
        p0 = tl.load(tiles_ptr + j * 4 + 1)
        n_rows = tl.load(tiles_ptr + j * 4 + 2)
        ok = t < n_rows
        tok = tl.load(rows_ptr + tl.minimum(p0 + t, P - 1), mask=ok, other=0)
        if kt == 0:  # permuted row p0 + t -> its row of the slot-major GEMM outputs
            tl.store(yrow_ptr + p0 + t, (j * TN + t).to(tl.int64), mask=ok)
    gs = tl.load(ins_ptr + e)
    cols = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + tok.to(tl.int64)[:, None] * stride_xm + cols[None, :],
                mask=ok[:, None] & (cols[None, :] < K), other=0.0).to(tl.float32)
    packed, sf = nvfp4_quantize_tile(x, gs, TN, BLOCK_K)
    r = j * TN + t
    pcols = kt * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    tl.store(q_ptr + r.to(tl.int64)[:, None] * (K // 2) + pcols[None, :], packed, mask=pcols[None, :] < K // 2)
    kb = (kt * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16))[None, :]
    kb_tiles = (K // 16 + 3) // 4
    tl.store(sf_ptr + _sf_atom_offset(j, kb, t[:, None], kb_tiles), sf.to(tl.uint8), mask=kb < kb_tiles * 4)
    if TN < 128:  # the atom's rows past the slot's tokens
        r128 = tl.arange(0, 128)[:, None]
        tl.store(sf_ptr + _sf_atom_offset(j, kb, r128, kb_tiles), tl.zeros([128, BLOCK_K // 16], dtype=tl.uint8),
                 mask=(r128 >= TN) & (kb < kb_tiles * 4))
    if ZERO_SF2:
        if kt == 0:  # GEMM2's B scale atom of slot j: what GEMM1's epilogue leaves unwritten
            r2 = tl.arange(0, 128)[:, None]
            for q in range(KB2_TILES):
                kb2 = q * 4 + tl.arange(0, 4)[None, :]
                tl.store(sf2_ptr + _sf_atom_offset(j, kb2, r2, KB2_TILES), tl.zeros([128, 4], dtype=tl.uint8),
                         mask=(r2 >= TN) | (kb2 >= KB2))


@dataclass
class SlotPrep:
    """What the prep hands the GEMMs and the finalize."""

    work_list: MoeWorkList
    codes: torch.Tensor  # uint8 [slots * tile_n, H/2]: GEMM1's B
    scales: torch.Tensor  # e4m3 1-D: GEMM1's SFB, one 128-row atom per slot
    y_rows: torch.Tensor  # int64 [M, K]: row of GEMM2's output holding pair (t, s) (valid pairs)
    #: int32 [M * K]: the same rows, -1 for an empty slot -- the fused finalize's table (one launch: else None)
    finalize_rows: Optional[torch.Tensor]
    b2_scales: torch.Tensor  # uint8 1-D: GEMM2's SFB atoms, padding zeroed, the rest for GEMM1 to write
    launches: int  # device launches of the prep (1 fused; 2 + a gather otherwise)


def b2_scale_numel(slots: int, inter: int) -> int:
    """Bytes of GEMM2's B scale atoms: one 128-row atom of ``ceil(I/16 / 4)`` 512-byte tiles per slot."""
    return slots * 512 * (-(-(inter // 16) // 4))


def _prefetch_lines(t: torch.Tensor, num_experts: int, what: str) -> int:
    """128-byte lines per expert of a stacked GEMM1 operand (``num_experts`` equal contiguous blocks)."""
    nbytes = t.numel() * t.element_size()
    if not t.is_contiguous() or nbytes % (num_experts * L2_LINE.value):
        raise ValueError(f"nvgemm sm100 moe prep: the stacked {what} to prefetch must be contiguous, "
                         f"{num_experts} blocks of whole {L2_LINE.value}-byte lines; got {tuple(t.shape)} "
                         f"{t.dtype} ({nbytes} bytes)")
    return nbytes // (num_experts * L2_LINE.value)


def moe_prep_triton(x: torch.Tensor, topk_ids: torch.Tensor, expert_map, num_experts: int,
                    input_scale: torch.Tensor, tile_n: int, inter: int, *, kernel=None,
                    w13: Optional[torch.Tensor] = None, w13_scale: Optional[torch.Tensor] = None) -> SlotPrep:
    """The work list, GEMM1's B operand and GEMM2's B scale buffer of one call: one launch up to
    :data:`FUSED_MAX_PAIRS` pairs, else the work-list kernel, this kernel and a gather. ``kernel``: the
    jitted kernel to launch instead of ``_moe_prep_kernel`` (the PTX emulator's stand-in).

    ``w13`` / ``w13_scale``: GEMM1's stacked A operand (:class:`~.launch.Sm100MoeStack` ``weight``, uint8
    ``[E * rows_padded, H/2]``, and ``scale``, the 1-D swizzled e4m3 scales: each ``E`` equal contiguous
    blocks, one per expert) to L2-prefetch for the experts the routing selects (fused launch only, not under
    the interpreter, which cannot run inline PTX); hints with no functional effect."""
    kernel = kernel or _moe_prep_kernel
    if (w13 is None) != (w13_scale is None):
        raise ValueError("nvgemm sm100 moe prep: prefetching GEMM1's weights needs both w13 and w13_scale")
    m, k = topk_ids.shape
    h = x.shape[1]
    p = m * k
    dev = x.device
    slots = work_tiles_bound(p, num_experts, tile_n)
    fused = 0 < p <= FUSED_MAX_PAIRS
    ids = topk_ids if topk_ids.dtype == torch.int32 and topk_ids.is_contiguous() else \
        topk_ids.to(torch.int32).contiguous()
    codes = torch.empty((slots * tile_n, h // 2), dtype=torch.uint8, device=dev)
    atoms = torch.empty(slots * 512 * ((h // 16 + 3) // 4), dtype=torch.uint8, device=dev)
    sf2 = torch.empty(b2_scale_numel(slots, inter), dtype=torch.uint8, device=dev)
    xs = x if x.stride(1) == 1 else x.contiguous()
    ins = input_scale if input_scale.dtype == torch.float32 and input_scale.is_contiguous() else \
        input_scale.float().contiguous()
    if fused:
        wl = MoeWorkList(torch.empty(p, dtype=torch.int32, device=dev),
                         torch.empty(4 * slots, dtype=torch.int32, device=dev),
                         torch.empty((m, k), dtype=torch.int64, device=dev),
                         torch.empty((m, k), dtype=torch.int8, device=dev),
                         torch.empty(num_experts, dtype=torch.int64, device=dev), tile_n)
        yrow = torch.empty((m, k), dtype=torch.int64, device=dev)
        yfin = torch.empty(p, dtype=torch.int32, device=dev)
        launches = 1
    else:
        # lazy: the work list's own kernel (sm90 family)
        from nvgemm.templates.sm90_moe.launch import work_list

        wl = work_list(topk_ids, expert_map, num_experts, tile_n)
        yrow = torch.empty(max(p, 1), dtype=torch.int64, device=dev)  # permuted row -> slot row
        yfin = None
        launches = 3
    kb2 = inter // 16
    prefetch = fused and w13 is not None and not is_interpreted(kernel)
    gdc = use_gdc(kernel, dev, None)  # PDL on sm_90+ (NVGEMM_PDL): GEMM1 launches while this runs
    w_lines = _prefetch_lines(w13, num_experts, "weight") if prefetch else 0
    sf_lines = _prefetch_lines(w13_scale, num_experts, "scales") if prefetch else 0
    kernel[(slots, triton.cdiv(h, _BLOCK_K))](
        xs, ids, expert_map if expert_map is not None else ids, ins, wl.rows, wl.tiles, wl.pos,
        wl.valid, wl.counts, yrow, yfin if yfin is not None else yrow, codes, atoms, sf2,
        w13 if prefetch else ids, w13_scale.view(torch.uint8) if prefetch else ids, h, xs.stride(0), max(p, 1),
        num_experts, kb2, -(-kb2 // 4), w_lines, sf_lines,
        TOPK=k, TN=tile_n, BLOCK=max(16, triton.next_power_of_2(p)) if fused else 16, BLOCK_K=_BLOCK_K, FUSED=fused,
        HAS_MAP=expert_map is not None, ZERO_SF2=tile_n < 128 or kb2 % 4 != 0, PREFETCH=prefetch,
        USE_GDC=gdc, **launch_options(gdc))
    if fused:
        wl.valid = wl.valid.view(torch.bool)
    else:
        yrow = yrow[wl.pos]
    return SlotPrep(wl, codes, atoms.view(torch.float8_e4m3fn), yrow, yfin, sf2, launches)


#: Positions of the prefetch-only operands (GEMM1's stacked weight and scales) in ``_moe_prep_kernel``'s arguments.
_PREFETCH_ARGS = (14, 15)


def launch_bytes(kernel_name: str, args) -> int | None:
    """Bytes one ``_moe_prep_kernel`` launch moves (the performance model's input): every tensor argument but the
    prefetch-only GEMM1 weight stack and its scales, whose lines the prep only names (their DRAM stream is GEMM1's
    routed weight bytes, priced with GEMM1). ``args``: the kernel's positional launch arguments. None for another
    kernel."""
    if kernel_name != "_moe_prep_kernel":
        return None
    return sum(a.numel() * a.element_size() for i, a in enumerate(args)
               if isinstance(a, torch.Tensor) and i not in _PREFETCH_ARGS)


__all__ = ["FUSED_MAX_PAIRS", "SlotPrep", "b2_scale_numel", "launch_bytes", "moe_prep_triton"]
