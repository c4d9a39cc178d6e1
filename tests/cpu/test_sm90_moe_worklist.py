"""Host logic of the sm90 grouped MoE path on CPU (no kernels): the work list built from
``topk_ids`` against a plain-Python construction of the same contract, the work-list bound, the
config validity rule, and the finalize step against the op's own composition."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from nvgemm.templates.sm90_moe.config import (
    Sm90MoeConfig,
    moe_config_from_name,
    moe_shape_problem,
    validate_moe_config,
    work_tiles_bound,
)
from nvgemm.ops.moe import local_ids
from nvgemm.templates.sm90_moe.launch import build_work_list, finalize_ref, local_expert_ids


def _python_work_list(local, e, tm):
    """The contract, written the slow obvious way: pairs in (expert, pair index) order."""
    m, k = local.shape
    pairs = [(int(local[t, s]), t * k + s) for t in range(m) for s in range(k)]
    ordered = sorted((p for p in pairs if p[0] >= 0)) + [p for p in pairs if p[0] < 0]
    pos = {j: r for r, (_, j) in enumerate(ordered)}
    tiles, row = [], 0
    for ex in range(e):
        c = sum(1 for p in pairs if p[0] == ex)
        for i in range(0, c, tm):
            tiles.append((ex, row + i, min(tm, c - i)))
        row += c
    return [j // k for _, j in ordered], tiles, pos


@pytest.mark.parametrize("m,k,e,tm,seed", [(1, 8, 16, 8, 0), (5, 2, 4, 8, 1), (33, 4, 8, 8, 2), (64, 2, 4, 16, 3),
                                           (7, 1, 3, 32, 4), (40, 6, 128, 8, 5)])
def test_work_list_matches_contract(m, k, e, tm, seed):
    g = torch.Generator().manual_seed(seed)
    local = torch.randint(-1, e, (m, k), generator=g)
    local[0, 0] = -1  # at least one empty slot
    wl = build_work_list(local, e, tm)
    rows, tiles, pos = _python_work_list(local, e, tm)
    assert wl.rows.tolist() == rows
    t4 = wl.tiles.view(-1, 4).tolist()
    used = [tuple(t[:3]) for t in t4 if t[2] > 0]
    assert used == tiles
    assert all(t[2] == 0 for t in t4[len(used):])  # unused slots after the used ones, all empty
    assert wl.slots == work_tiles_bound(m * k, e, tm) >= len(tiles)
    assert wl.pos.reshape(-1).tolist() == [pos[j] for j in range(m * k)]
    assert torch.equal(wl.valid, local >= 0)


def test_work_list_bound_is_tight_for_worst_case():
    # every expert gets one pair more than a multiple of the tile: the bound is reached
    e, tm = 4, 8
    counts = [9, 9, 9, 9]
    local = torch.tensor([ex for ex, c in enumerate(counts) for _ in range(c)]).reshape(-1, 1)
    wl = build_work_list(local, e, tm)
    assert int((wl.tiles.view(-1, 4)[:, 2] > 0).sum()) == 8 <= work_tiles_bound(36, e, tm) == 8


def test_config_rules():
    assert validate_moe_config(Sm90MoeConfig())
    assert not validate_moe_config(Sm90MoeConfig(tile_m=24))
    assert not validate_moe_config(Sm90MoeConfig(tile_n=96, num_warps=4))
    c = Sm90MoeConfig(tile_m=16, tile_n=64, tile_k=256, split_k=3, num_warps=2, stages=5, pdl=True)
    assert moe_config_from_name(c.name()) == c
    for c in (replace(c, early_weights=True), replace(c, finalize=True, direct=True, early_weights=True)):
        assert validate_moe_config(c) and moe_config_from_name(c.name()) == c
    assert "needs pdl" in validate_moe_config(Sm90MoeConfig(early_weights=True)).reason
    assert "multiple of 32" in moe_shape_problem(c, 64, 48, False)
    assert "I = 24" in moe_shape_problem(Sm90MoeConfig(tile_n=128), 48, 64, True)
    assert "even number of row tiles" in moe_shape_problem(Sm90MoeConfig(tile_n=64, num_warps=4), 64, 64, True)
    assert "exceeds" in moe_shape_problem(Sm90MoeConfig(tile_k=256, split_k=2), 64, 64, False)


def test_finalize_is_the_contract():
    """finalize_ref over the permuted y equals moe_compose's step 5 (same fp32 ops, same order)."""
    g = torch.Generator().manual_seed(7)
    m, k, e, h = 6, 3, 5, 40
    local = torch.randint(-1, e, (m, k), generator=g)
    wl = build_work_list(local, e, 8)
    y_pair = torch.randn(m, k, h, generator=g)
    y_perm = torch.empty(m * k, h)
    y_perm[wl.pos.reshape(-1)] = y_pair.reshape(m * k, h)
    w = torch.rand(m, k, generator=g)
    sh = torch.randn(m, h, generator=g).bfloat16()
    want = torch.zeros(m, h)
    for s in range(k):
        want = torch.where((local[:, s] >= 0)[:, None], want + w[:, s:s + 1] * y_pair[:, s], want)
    want = (want + sh.float()).bfloat16()
    assert torch.equal(finalize_ref(y_perm, wl, w, sh, None, torch.bfloat16), want)


def test_local_expert_ids_is_the_ops_rule():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(-1, 12, (9, 4), generator=g, dtype=torch.int32)
    emap = torch.full((12,), -1, dtype=torch.int32)
    emap[torch.tensor([0, 5, 7, 11])] = torch.arange(4, dtype=torch.int32)
    for m in (None, emap):
        assert torch.equal(local_expert_ids(ids, m), local_ids(ids, m))
