"""The MoE work list (:func:`~.launch.build_work_list`) as ONE Triton launch (CUDA; runs under
``TRITON_INTERPRET=1``): at decode the prep step's launch count, not its work, is the cost (the
torch version is ~24 tiny kernels, tens of microseconds in a CUDA graph against a few microseconds
of expert weights at TP8 -- :mod:`nvgemm.templates.sm90_moe.perf`).

One program holds every pair (``P = M x top_k <= MAX_PAIRS``): the pairs' keys (local expert, or E
for an empty slot) are sorted **stably** as ``key x BLOCK + pair`` (bitonic ``tl.sort``), which
gives the permuted rows, the row table, ``pos`` and ``y_rows`` (``pos``, -1 for an empty slot: the
fused finalize's table); per-expert counts are a histogram of the keys,
offsets and tile starts exclusive cumsums; the work slots are zeroed, then (after a CTA barrier)
each expert writes its ``ceil(count / tile_m)`` tiles at its tile start. Same tables, bit for bit,
as the torch construction (``tests/cpu/triton_interp/interp_moe_finalize.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvgemm.templates.sm90_moe.config import MoeWorkList, work_tiles_bound

#: Pairs one program handles (decode: M <= 256 tokens x top_k <= 8); more -> the torch path.
MAX_PAIRS = 4096
#: Experts one program handles (the histogram's bins).
MAX_EXPERTS = 1024


@triton.jit
def _prep_kernel(ids_ptr, map_ptr, rows_ptr, tiles_ptr, pos_ptr, counts_ptr, valid_ptr, yrow_ptr, P, E, SLOTS,
                 K: tl.constexpr, TM: tl.constexpr, BLOCK: tl.constexpr, EB: tl.constexpr, SB: tl.constexpr,
                 MAXT: tl.constexpr, HAS_MAP: tl.constexpr):
    j = tl.arange(0, BLOCK)
    lid = tl.load(ids_ptr + j, mask=j < P, other=-1).to(tl.int64)
    if HAS_MAP:  # expert parallelism: global id -> local expert or -1
        mapped = tl.load(map_ptr + tl.maximum(lid, 0), mask=(j < P) & (lid >= 0), other=-1).to(tl.int64)
        lid = tl.where(lid >= 0, mapped, -1)
    tl.store(valid_ptr + j, (lid >= 0).to(tl.int8), mask=j < P)
    key = tl.where(lid >= 0, lid, E)
    key = tl.where(j < P, key, E + 1)  # padding sorts after the empty slots
    comp = tl.sort(key * BLOCK + j)  # stable: ties in pair order
    pair = comp % BLOCK
    p = tl.arange(0, BLOCK)
    ok = p < P
    tl.store(pos_ptr + pair, p, mask=ok)
    tl.store(yrow_ptr + pair, tl.where(comp // BLOCK < E, p, -1).to(tl.int32), mask=ok)  # the fused finalize's
    tl.store(rows_ptr + p, (pair // K).to(tl.int32), mask=ok)
    # counts, offsets, tile starts per expert (bins 0..E-1; E = empty, E+1 = padding)
    cnt = tl.histogram(key.to(tl.int32), EB)
    e = tl.arange(0, EB)
    real = e < E
    cnt = tl.where(real, cnt, 0).to(tl.int64)
    tl.store(counts_ptr + e, cnt, mask=real)
    offs = tl.cumsum(cnt, 0) - cnt
    nt = (cnt + TM - 1) // TM
    tstart = tl.cumsum(nt, 0) - nt
    s = tl.arange(0, SB)
    zero = tl.zeros([SB], dtype=tl.int32)
    for f in tl.static_range(4):
        tl.store(tiles_ptr + s * 4 + f, zero, mask=s < SLOTS)
    tl.debug_barrier()
    for i in range(MAXT):
        has = real & (i < nt)
        slot = tstart + i
        first = offs + i * TM
        rows = tl.minimum(cnt - i * TM, TM)
        tl.store(tiles_ptr + slot * 4, e.to(tl.int32), mask=has)
        tl.store(tiles_ptr + slot * 4 + 1, first.to(tl.int32), mask=has)
        tl.store(tiles_ptr + slot * 4 + 2, rows.to(tl.int32), mask=has)


def prep_supported(pairs: int, num_experts: int) -> bool:
    return 0 < pairs <= MAX_PAIRS and num_experts + 2 <= MAX_EXPERTS


def build_work_list_triton(topk_ids: torch.Tensor, expert_map, num_experts: int, tile_m: int, *, kernel=None):
    """:func:`~.launch.build_work_list` of ``topk_ids`` (int32 [M, K]) mapped through ``expert_map``
    (int32 [E_global] or None) in one launch (``prep_supported`` must hold). ``kernel``: the jitted kernel
    to launch instead of ``_prep_kernel`` (the PTX emulator's stand-in)."""
    kernel = kernel or _prep_kernel
    m, k = topk_ids.shape
    p = m * k
    dev = topk_ids.device
    slots = work_tiles_bound(p, num_experts, tile_m)
    rows = torch.empty(p, dtype=torch.int32, device=dev)
    tiles = torch.empty(4 * slots, dtype=torch.int32, device=dev)
    pos = torch.empty(p, dtype=torch.int64, device=dev)
    counts = torch.empty(num_experts, dtype=torch.int64, device=dev)
    valid = torch.empty((m, k), dtype=torch.int8, device=dev)
    yrow = torch.empty(p, dtype=torch.int32, device=dev)
    ids = topk_ids if topk_ids.dtype == torch.int32 and topk_ids.is_contiguous() else \
        topk_ids.to(torch.int32).contiguous()
    block = max(16, triton.next_power_of_2(p))
    eb = max(16, triton.next_power_of_2(num_experts + 2))
    sb = max(16, triton.next_power_of_2(slots))
    kernel[(1,)](ids, expert_map if expert_map is not None else ids, rows, tiles, pos, counts, valid, yrow, p,
                 num_experts, slots, K=k, TM=tile_m, BLOCK=block, EB=eb, SB=sb, MAXT=-(-p // tile_m),
                 HAS_MAP=expert_map is not None)
    return MoeWorkList(rows, tiles, pos.reshape(m, k), valid.view(torch.bool), counts, tile_m, yrow)
