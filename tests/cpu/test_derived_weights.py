"""Weights the launchers derive (sm90 prepared layout, sm100 interleaved gate_up): keyed by what the
tensor is, not by which Python object holds it; in-place updates re-derive into the same buffers;
inference tensors work; capture never leaves an unfilled entry (issue 22 items 12, 13, 15, 16).

CPU only: the bookkeeping is torch on CPU tensors, capture is simulated by patching the
launchers' ``capturing`` predicates (a real CUDA-graph replay needs a GPU; see docs/kernels.md)."""

from __future__ import annotations

import warnings

import pytest
import torch

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm.core.formats import from_blocked, quantize_weight, to_blocked
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.templates.sm100_w4a4 import launch as L100
from nvgemm.templates.sm90_w4a16 import launch as L90
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config
from nvgemm.templates.sm90_w4a16.operand import prepare_sm90_weight

MMA = Sm90W4A16Config("mma", tile_m=8, tile_n=128, tile_k=256, num_warps=4, stages=4, pdl=True)


def _layer(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    return q.packed, to_blocked(q.scale), q.global_scale.reshape(()).float()


def _same_prepared(a, b):
    return torch.equal(a.weight, b.weight) and torch.equal(a.scale, b.scale) and torch.equal(
        a.weight_scale_2, b.weight_scale_2)


def test_sm90_sliced_views_hit_the_first_calls_entry():
    """vLLM passes ``weight[a:b]`` per call for the GEMMs of a fused layer: one preparation each."""
    pa, sa, g = _layer(64, 256, 1)
    pb, sb, _ = _layer(64, 256, 2)
    fused = torch.cat([pa, pb])
    first = [L90.cached_sm90_weight(fused[0:64], sa, g), L90.cached_sm90_weight(fused[64:128], sb, g)]
    for _ in range(4):  # new view objects every call
        assert L90.cached_sm90_weight(fused[0:64], sa, g) is first[0]
        assert L90.cached_sm90_weight(fused[64:128], sb, g) is first[1]
    assert _same_prepared(first[0], prepare_sm90_weight(pa, sa, g))
    assert _same_prepared(first[1], prepare_sm90_weight(pb, sb, g))


def test_sm100_uint8_scale_view_hits_the_interleaved_entry():
    """A uint8 checkpoint scale is viewed as e4m3 per call: one re-permute, not one per call."""
    w, s, _ = _layer(256, 512)
    s_u8 = s.view(torch.uint8)
    ws2 = torch.ones(())
    ptrs = {L100.interleave_gate_up(w, s_u8.view(torch.float8_e4m3fn), ws2, None)[0].data_ptr() for _ in range(5)}
    assert len(ptrs) == 1


def test_sm90_inplace_update_reprepares_into_the_same_buffers():
    """An in-place weight update (a reload) keeps the prepared buffers' storage, so a captured CUDA
    graph replays the new weight instead of reading freed memory; the values are the new weight's."""
    p1, s1, g = _layer(64, 256, 3)
    p2, s2, _ = _layer(64, 256, 4)
    w, s = p1.clone(), s1.clone()
    a = L90.cached_sm90_weight(w, s, g)
    ptrs = (a.weight.data_ptr(), a.scale.data_ptr())
    w.copy_(p2)
    s.copy_(s2)
    b = L90.cached_sm90_weight(w, s, g)
    assert b is a and (b.weight.data_ptr(), b.scale.data_ptr()) == ptrs
    assert _same_prepared(b, prepare_sm90_weight(p2, s2, g))


def test_sm90_inplace_update_during_capture_is_refused(monkeypatch):
    p1, s1, g = _layer(64, 256, 5)
    w = p1.clone()
    L90.cached_sm90_weight(w, s1, g)
    w.add_(1)
    monkeypatch.setattr(L90, "capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="updated in place.*cannot be re-prepared during CUDA-graph capture"):
        L90.cached_sm90_weight(w, s1, g)


@pytest.mark.parametrize("which", ["sm90", "sm100"])
def test_first_call_inside_capture_leaves_no_unfilled_entry(monkeypatch, which):
    """Inside a capture the derivation is only recorded (the buffers stay unfilled until replay):
    it must not be stored for later eager calls."""
    w, s, g = _layer(256, 512, 6)
    if which == "sm90":
        mod, call = L90, lambda: L90.cached_sm90_weight(w, s, g)
        monkeypatch.setattr(L90, "capturing", lambda device: True)
    else:
        mod, call = L100, lambda: L100.interleave_gate_up(w, s, g, None)[0]
        monkeypatch.setattr(L100, "_is_capturing", lambda: True)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        in_capture = call()
    assert any("inside a CUDA-graph capture" in str(r.message) for r in rec)
    monkeypatch.undo()
    eager = call()
    assert eager is not in_capture
    if which == "sm100":
        assert eager.data_ptr() != in_capture.data_ptr()
    assert call() is eager  # stored now


def test_inference_tensors_work_on_every_host_path():
    """Weights and input_scale made under inference_mode (no version counter) prepare, hit and
    compute the emulated op's result, on the sm90 and sm100 host paths and the op itself."""
    with torch.inference_mode():
        w, s, g = _layer(64, 256, 7)
        x = torch.randn(3, 256).bfloat16()
        ins = (x.float().abs().amax() / 2688).reshape(())
        bias = torch.randn(64).bfloat16()
        assert w.is_inference() and ins.is_inference()
        p = L90.cached_sm90_weight(w, s, g)
        assert L90.cached_sm90_weight(w[0:64], s, g) is p
        args = L90.prepare_sm90_args(x, p, ins, bias, None, "none", None, MMA)
        got = L90.kernel_view_ref(args, MMA)
        want = nvfp4_linear_emulated(x, w, s, g, ins, bias, None, "none", None)
        # same quantized operands; fp64 vs fp32 sums and one bf16 rounding: within 1 bf16 ulp
        torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=1e-3)
        w_i, s_i, _, _ = L100.interleave_gate_up(w, s, g, None)
        assert torch.equal(w_i, w[L100.gate_up_permutation(64)])
        assert L100.interleave_gate_up(w, s, g, None)[0] is w_i
        y = torch.ops.nvgemm.nvfp4_linear(x, w, s, g, ins, bias, None, "none", None)
        torch.testing.assert_close(y.float(), want.float(), rtol=0, atol=0)


def test_selfcheck_under_inference_mode_does_not_disable_a_backend(monkeypatch):
    """The first call of a layer under inference_mode makes the self-check's inputs inference
    tensors: a backend running the sm90 host path must pass it, not be disabled."""
    from nvgemm.dispatch import registry as B

    def run(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype):
        p = L90.cached_sm90_weight(weight, weight_scale, weight_scale_2)
        a = L90.prepare_sm90_args(x, p, input_scale, bias, residual, activation, out_dtype, MMA)
        return L90.kernel_view_ref(a, MMA)

    fake = B.Backend(name="test_sm90_host", priority=1000, supports=lambda p: None, run=run)
    B.register_backend(fake)
    try:
        prob = B.LinearProblem(m=4, n=128, k=256, x_dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                               weight_only=True, activation="none", bias=False, residual=False, alpha="scalar",
                               device_type="cpu", capability=None)
        with torch.inference_mode():
            assert B._selfcheck(fake, prob) is None
    finally:
        B.unregister_backend("test_sm90_host")
        B._CHECKED.clear()


def test_layer_weight_memory_reports_the_derived_copies():
    """The vLLM load log line states a layer's checkpoint bytes and the copies the launchers made
    (issue 22 item 14: on Hopper the prepared layout is a second copy of every weight)."""
    from nvgemm.templates.common.derived import derived_nbytes
    from nvgemm.integrations.serving import weight_memory

    pa, sa, g = _layer(64, 256, 8)
    pb, sb, _ = _layer(64, 256, 9)
    fused = torch.cat([pa, pb])
    assert derived_nbytes(fused) == 0
    p1 = L90.cached_sm90_weight(fused[0:64], sa, g)
    p2 = L90.cached_sm90_weight(fused[64:128], sb, g)
    want = sum(t.numel() * t.element_size() for p in (p1, p2) for t in (p.weight, p.scale, p.weight_scale_2))
    assert derived_nbytes(fused) == want == derived_nbytes(fused[64:])
    assert derived_nbytes(pa) == 0  # another storage
    ckpt = fused.numel() + sa.numel() + sb.numel()
    assert weight_memory(fused, [sa, sb]) == (f"weight memory: checkpoint {ckpt / 2**20:.2f} MiB + nvgemm copies "
                                              f"{want / 2**20:.2f} MiB")


def test_inference_tensors_on_the_sm100_launcher_and_the_module():
    """The whole sm100 host path (gated: the interleave cache) and NVFP4Linear under inference_mode."""
    from nvgemm.core.epilogue import EpilogueSpec
    from nvgemm.nn.linear import NVFP4Linear
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig

    with torch.inference_mode():
        w, s, g = _layer(128, 256, 10)
        x = torch.randn(4, 256).bfloat16()
        ins = (x.float().abs().amax() / 2688).reshape(())
        spec = EpilogueSpec(alpha="scalar", activation="silu_mul", out_dtype=torch.bfloat16)
        cfg = Sm100Nvfp4GemmConfig(tile_n=64)
        args = L100.prepare_sm100_args(x, w, s, g, ins, None, None, spec, cfg)
        got = L100.kernel_view_ref(args)
        want = nvfp4_linear_emulated(x, w, s, g, ins, None, None, "silu_mul", None)
        # identical quantized operands; fp32 sums in another order, one bf16 rounding: 1 ulp (+ tiny atol)
        torch.testing.assert_close(got.float(), want.float(), rtol=2.0**-7, atol=1e-3)
        mod = NVFP4Linear.from_tensors(w, s, g, ins, activation="silu_mul")
        torch.testing.assert_close(mod(x).float(), want.float(), rtol=0, atol=0)
