"""Hopper holds every NVFP4 weight once (issue 22 item 14): the vLLM layer's weight is replaced by the
sm90 kernels' layout when those kernels serve it (fused layers split into several GEMMs, tensor-
parallel ranks), and nothing else keeps a copy.

CPU: :func:`nvgemm.testing.sm90_stand_in` makes the registry select ``cutedsl_sm90`` for CPU
problems by its real rules and runs the real host path with the launch replaced by the emulated op on
the checkpoint layout re-encoded from the prepared tensors it is handed (value-exact), so outputs are
compared bit for bit with the emulated op on the checkpoint tensors. Bytes held are the sizes of the
tensors' storages plus what the launchers derived (:func:`nvgemm.templates.common.derived.derived_nbytes`),
against the prepared layout's size computed from the shapes: 16-row tiles, K padded to 256,
K/2 code bytes + K/16 scale bytes per row.
"""

from __future__ import annotations

import gc

import pytest
import torch

from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.ops.prepared import one_copy_wanted
from nvgemm.templates.common.derived import derived_nbytes
from nvgemm.testing import sm90_stand_in
from nvgemm.integrations.serving import hold_sm90, plan_gemms, run_gemms, sm90_serve_reason

CPU = torch.device("cpu")


def storage_bytes(*tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None skipped)."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(seen.values())


def one_copy_bytes(rows: list[int], k: int) -> int:
    """The sm90 layout of GEMMs with ``rows`` output rows each: whole 16-row tiles, K padded to 256."""
    k_pad = -(-k // 256) * 256
    return sum(-(-n // 16) * 16 * (k_pad // 2 + k_pad // 16) for n in rows)


def fused_layer(gen, k, widths, ins):
    qs = [quantize_weight(torch.randn(n, k, generator=gen) * s) for n, s in zip(widths, (1.0, 3.0, 0.2))]
    w, s = torch.cat([q.packed for q in qs]), torch.cat([q.scale for q in qs])
    return w, s, torch.stack([q.global_scale.reshape(()) for q in qs]), ins


def emulated(x, w, gemms, bias):
    """The emulated op GEMM by GEMM on the checkpoint tensors (nothing sm90 involved)."""
    return torch.cat([nvfp4_linear_emulated(x, w[g.start:g.stop].contiguous(), g.weight_scale, g.weight_scale_2,
                                            g.input_scale, None if bias is None else bias[g.start:g.stop], None,
                                            "none", None)
                      for g in gemms], -1)


@pytest.mark.parametrize("case", ["w4a4-one-gemm", "w4a4-two-gemms", "w4a16"])
def test_fused_layer_is_held_once_and_computes_the_same(seed, case):
    gen = torch.Generator().manual_seed(seed)
    k, widths = 256, [48, 16, 24]  # q, k, v; v's 24 rows are not a whole tile
    x = torch.randn(5, k, generator=gen).bfloat16()
    a = float(x.float().abs().amax()) / 2688
    ins = {"w4a4-one-gemm": torch.full((3,), a), "w4a4-two-gemms": torch.tensor([a, a, 2 * a]), "w4a16": None}[case]
    w, s, ws2, ins = fused_layer(gen, k, widths, ins)
    bias = torch.randn(sum(widths), generator=gen).bfloat16()
    gemms = plan_gemms(w, s, ws2, ins, widths)
    assert len(gemms) == (2 if case == "w4a4-two-gemms" else 1)
    want = emulated(x, w, gemms, bias)
    ckpt = storage_bytes(w, *[g.weight_scale for g in gemms])
    with sm90_stand_in() as launched:
        before = run_gemms(x, w, gemms, bias)  # checkpoint layout: the backend derives its own copy
        assert torch.equal(before, want)
        assert derived_nbytes(w) >= one_copy_bytes([g.stop - g.start for g in gemms], k)  # two copies
        assert sm90_serve_reason(gemms, k, CPU, torch.bfloat16, True, [1, 8, 64]) is None
        pw, held = hold_sm90(w, gemms, "bf16")
        del w
        gc.collect()
        assert all(g.weight_scale is None and g.tiles is not None for g in gemms)
        n_launched = len(launched)
        after = run_gemms(x, pw, gemms, bias, held)
        for m in (1, 8):  # what warm-up and decode run
            assert torch.equal(run_gemms(x[:m], pw, gemms, bias, held), want[:m])
    assert torch.equal(after, want)
    # every GEMM launched on its own tiles of the held tensors, nothing re-derived or kept beside them
    assert len(launched) == n_launched + 3 * len(gemms)
    for p in launched[n_launched:]:
        assert p.weight.untyped_storage().data_ptr() == pw.untyped_storage().data_ptr()
        assert p.scale.untyped_storage().data_ptr() == held.scale.untyped_storage().data_ptr()
    assert derived_nbytes(pw) == 0
    got = storage_bytes(pw, held.scale, *[g.weight_scale for g in gemms])
    assert got == one_copy_bytes([g.stop - g.start for g in gemms], k)
    assert got <= ckpt * 1.1  # the tile padding of v's 24 rows (and a second GEMM's) is all it adds


def test_tensor_parallel_ranks_are_held_per_rank(seed):
    """Column-parallel ranks (fused q/k/v rows per rank) and row-parallel ranks (K per rank) are held
    per rank; a rank whose K is not a multiple of 32 is not held (the sm90 kernels cannot serve it)."""
    gen = torch.Generator().manual_seed(seed)
    tp, k, widths = 2, 256, [48, 16, 16]
    qs = [quantize_weight(torch.randn(n, k, generator=gen)) for n in widths]
    x = torch.randn(3, k, generator=gen).bfloat16()
    ins = torch.tensor(float(x.float().abs().amax()) / 2688)
    with sm90_stand_in():
        for r in range(tp):  # column-parallel: rows [r*n/tp, (r+1)*n/tp) of each shard
            w = torch.cat([q.packed.chunk(tp)[r] for q in qs])
            s = torch.cat([q.scale.chunk(tp)[r] for q in qs])
            gemms = plan_gemms(w, s, torch.stack([q.global_scale.reshape(()) for q in qs]), ins.expand(3),
                               [n // tp for n in widths])
            want = emulated(x, w, gemms, None)
            assert sm90_serve_reason(gemms, k, CPU, torch.bfloat16, False, [1, 4]) is None
            pw, held = hold_sm90(w, gemms, "bf16")
            assert torch.equal(run_gemms(x, pw, gemms, None, held), want)
            assert storage_bytes(pw, held.scale) == one_copy_bytes([sum(widths) // tp], k)
        for kr in (k // tp, 112):  # row-parallel: K columns [r*kr, (r+1)*kr) of q
            q = qs[0]
            w, s = q.packed[:, : kr // 2].contiguous(), q.scale[:, : kr // 16].contiguous()
            gemms = plan_gemms(w, s, q.global_scale.reshape(1), ins.reshape(1), [q.packed.shape[0]])
            why = sm90_serve_reason(gemms, kr, CPU, torch.bfloat16, False, [1, 4])
            if kr % 32:
                assert why is not None and "K=112 is not a multiple of 32" in why
                continue
            want = emulated(x[:, :kr].contiguous(), w, gemms, None)
            pw, held = hold_sm90(w, gemms, "bf16")
            assert torch.equal(run_gemms(x[:, :kr].contiguous(), pw, gemms, None, held), want)


def test_not_held_unless_the_sm90_kernels_serve_every_m(seed, monkeypatch):
    gen = torch.Generator().manual_seed(seed)
    w, s, ws2, _ = fused_layer(gen, 64, [32], None)
    gemms = plan_gemms(w, s, ws2, None, [32])
    # a CPU device without the stand-in: no sm90 GPU
    assert "needs a CUDA device" in sm90_serve_reason(gemms, 64, CPU, torch.bfloat16, False, [1])
    with sm90_stand_in():
        assert sm90_serve_reason(gemms, 64, CPU, torch.bfloat16, False, [1, 512]) is None
        assert "bfloat16 or float16" in sm90_serve_reason(gemms, 64, CPU, torch.float32, False, [1])
        monkeypatch.setenv("NVGEMM_BACKEND", "emulated")  # a forced backend serves every M
        assert sm90_serve_reason(gemms, 64, CPU, torch.bfloat16, False, [1]) == "M=1 runs on emulated"


def test_one_copy_switch(monkeypatch):
    monkeypatch.delenv("NVGEMM_SM90_ONE_COPY", raising=False)
    assert one_copy_wanted() is True
    monkeypatch.setenv("NVGEMM_SM90_ONE_COPY", "0")
    assert one_copy_wanted() is False and one_copy_wanted(True) is True
    monkeypatch.setenv("NVGEMM_SM90_ONE_COPY", "maybe")
    with pytest.raises(ValueError, match="NVGEMM_SM90_ONE_COPY='maybe': expected 1 or 0"):
        one_copy_wanted()
