"""Run NVIDIA's published CuTeDSL example kernels on nvgemm's PTX emulator (issue 21 item 4).

Nothing of the examples is copied here: each example module is imported at run time from a CUTLASS checkout
given with ``--cutlass`` (``<checkout>/examples/python/CuTeDSL/...``). For each example an adapter below builds
the inputs on the CPU (torch, the example's own data recipe where it has one), compiles the example's own
``@cute.jit`` host function (through the example's own compile helper where it has one) for the example's
architecture (``CUTE_DSL_ARCH``, with ``CUTE_DSL_KEEP=ptx``), runs it through
:class:`nvgemm.emulator.cute_host.EmulatedHostFunction` (the DSL's AOT export relinked against the fake CUDA
runtime, every launch interpreted) and compares the output with the example's reference semantics computed here
with torch on the CPU in fp32/fp64.

Every host call runs under each cluster schedule of ``--schedules`` (:data:`SCHEDULES`, all three by default:
serial in launch order, two clusters resident in reverse order, the whole grid resident in a shuffled order;
see :mod:`nvgemm.emulator.ptx.schedule`), each from the same initial memory. The first schedule's output is
compared with the reference, and every other schedule must leave every tensor bit for bit as the first did.

Every example runs in a child process of its own (CuTeDSL keeps the first compile's architecture per process).
An opcode the emulator lacks is reported by name, never skipped.

    python bench/run_nvidia_examples.py --cutlass /path/to/cutlass [--only NAME ...] [--results FILE.md]
        [--schedules serial,2-resident,all-resident]
    python bench/run_nvidia_examples.py --list
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

EXAMPLES_SUBDIR = Path("examples/python/CuTeDSL")


@dataclass
class Example:
    name: str
    path: str  # relative to <checkout>/examples/python/CuTeDSL
    arch: str
    device: str  # emulator device profile
    size: str  # the problem this adapter runs
    run: Callable  # (module, Harness) -> (result text, ok)
    tolerance: str  # what "matches" means here, and why


EXAMPLES: dict[str, Example] = {}
# examples of the same tree with no adapter here, and why (reported in the results table, not run)
NOT_ADAPTED = {
    "cute/blackwell/kernel/attention/fmha/fmha.py": "not adapted yet: 19 host arguments (variable-length "
    "cumulative sequence tensors, window / residual masks, LSE, sink, skip-softmax counters) built on the GPU",
    "cute/hopper/kernel/attention/fmha.py": "not adapted yet: host setup as large as Blackwell FMHA's",
    "cute/blackwell/kernel/attention/mla/*, mamba2_ssd/*, mixed_input_fmha/*": "not adapted yet",
    "cute/hopper/kernel/grouped_gemm/grouped_gemm.py, cute/blackwell/kernel/grouped_gemm/*, "
    "blockscaled_grouped_gemm/*, moe/*": "not adapted yet: device tensors of per-group pointers and problem sizes",
    "cute/blackwell/kernel/distributed/*": "out of scope: multi-GPU (peer memory, multimem) -- the emulator models "
    "one device",
    "cute/blackwell/kernel/reduce/reduce.py": "a helper module (block / cluster row reductions), no kernel of "
    "its own: runs inside blackwell/rmsnorm and blackwell/rmsnorm_cluster",
    "cute/blackwell/kernel/mixed_input_gemm/*, blockwise_gemm/*, dense_gemm_persistent_dynamic.py, "
    "blockscaled_gemm/*_amax.py, *_prefetch.py, sm103_*": "not adapted yet",
}
NOTED_STATS = ("int_div_by_zero", "cp_async_unwaited")  # Launch.stats worth a note in the table
#: cluster schedules (nvgemm.emulator.ptx.schedule.Schedule(order, resident clusters, preferred regions)):
#: "serial": launch order, one cluster at a time -- a cluster launch control kernel's first cluster cancels and
#: computes every pending one; "2-resident": two at once in reverse order; "all-resident": the whole grid at once
#: in a shuffled order -- every try_cancel fails, each cluster computes its own work. A launch with a preferred
#: cluster shape runs all preferred, mixed (seeded per region) and all fallback in these three.
SCHEDULES = {"serial": ("forward", 1, "all"), "2-resident": ("reverse", 2, 3), "all-resident": (7, 1 << 20, "none")}


def example(name, path, arch, device, size, tolerance):
    def deco(fn):
        EXAMPLES[name] = Example(name, path, arch, device, size, fn, tolerance)
        return fn

    return deco


# ------------------------------------------------------------------------------------------------------------
# child side: one example in this process
# ------------------------------------------------------------------------------------------------------------


class Harness:
    """What an adapter needs: run a compiled host function on the emulator, compare outputs."""

    def __init__(self, ex: Example, schedules=("serial",)):
        self.ex = ex
        self.schedules = tuple(schedules)
        self.timings: dict[str, float] = {}
        self.launches = []  # of the first schedule
        self.canceled: dict[str, int] = {}  # schedule -> successful try_cancels over its launches
        self.schedule_mismatch: list[str] = []  # schedules whose memory differed from the first's

    def compile(self, fn, *args, **kwargs):
        import cutlass.cute as cute

        t0 = time.perf_counter()
        compiled = cute.compile(fn, *args, **kwargs)
        self.timings["compile_s"] = self.timings.get("compile_s", 0.0) + time.perf_counter() - t0
        return compiled

    def emulate(self, compiled, *args, memory, **kwargs):
        from nvgemm.emulator.cute_host import EmulatedHostFunction

        """Run the host call once per schedule, each from the initial contents of ``memory``; the first
        schedule's memory is left for the adapter to check, the others' must equal it bit for bit."""
        from nvgemm.emulator.ptx.schedule import Schedule

        t0 = time.perf_counter()
        fn = EmulatedHostFunction(compiled, device=self.ex.device)
        t1 = time.perf_counter()
        self.timings["export_link_s"] = t1 - t0
        initial = [t.clone() for t in memory]
        first, launches = None, []
        try:
            for name in self.schedules:
                for t, t_init in zip(memory, initial):
                    t.copy_(t_init)
                made = fn(*args, memory=memory, order=Schedule(*SCHEDULES[name]), **kwargs)
                self.canceled[name] = sum(L.stats.get("clusters_canceled", 0) for L in made)
                state = [t.clone() for t in memory]
                if first is None:
                    first, launches = state, made
                elif not all(_same_bits(a, b) for a, b in zip(first, state)):
                    self.schedule_mismatch.append(name)
        finally:  # an emulation error still reports how long it ran
            self.timings["emulate_s"] = self.timings.get("emulate_s", 0.0) + time.perf_counter() - t1
        for t, t_first in zip(memory, first):
            t.copy_(t_first)
        self.launches += launches
        return launches

    @staticmethod
    def compare(out, ref, atol: float = 0.0, rtol: float = 0.0) -> tuple[str, bool]:
        import torch

        o, r = out.double(), ref.double()
        if torch.equal(o, r):
            return "bit-exact", True
        if torch.isnan(o).any():
            return f"{int(torch.isnan(o).sum())} NaN outputs (poisoned output never written?)", False
        err = (o - r).abs()
        bad = err > atol + rtol * r.abs()
        text = f"max abs err {err.max().item():.3g} (atol {atol:g}, rtol {rtol:g}): {int(bad.sum())} of {o.numel()} outside"
        return text, not bool(bad.any())


def _same_bits(a, b) -> bool:
    """Bit-for-bit equality of two tensors of one dtype and shape (NaNs included)."""
    import torch

    return a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def gmem(t, **kwargs):
    """CuTe tensor over CPU tensor ``t`` typed as device (global) memory, as a CUDA tensor would be."""
    from cutlass.cute.runtime import from_dlpack

    from nvgemm.emulator.cute_host import device_view

    return from_dlpack(device_view(t), **kwargs)


def _stream():
    import cuda.bindings.driver as cuda

    return cuda.CUstream(0)


def _ints(shape, lo, hi, seed, dtype=None):
    import torch

    g = torch.Generator().manual_seed(seed)
    t = torch.randint(lo, hi, shape, generator=g).float()
    return t if dtype is None else t.to(dtype)


# --- Ampere (sm_80) ------------------------------------------------------------------------------------------


@example("ampere/elementwise_add", "cute/ampere/kernel/elementwise/elementwise_add.py", "sm_80", "A100",
         "M=37 N=200 fp32 (tails in both modes)", "bit-exact (one fp32 add per element, same rounding as torch)")
def _elementwise_add(mod, h: Harness):
    import torch
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 200, generator=g), torch.randn(37, 200, generator=g)
    c = torch.full_like(a, float("nan"))
    args = [gmem(t).mark_layout_dynamic() for t in (a, b, c)]
    compiled = h.compile(mod.elementwise_add, *args)
    h.emulate(compiled, *args, memory=[a, b, c])
    return h.compare(c, a + b)


def _apply_mul(mod, h: Harness, m: int, n: int):
    import operator

    import torch

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(m, n, generator=g), torch.randn(m, n, generator=g)
    c = torch.full_like(x, float("nan"))
    ins = [gmem(t, assumed_align=16) for t in (x, y)]
    c_ = gmem(c, assumed_align=16).mark_layout_dynamic()
    compiled = h.compile(mod.elementwise_apply, operator.mul, ins, c_, _stream())
    h.emulate(compiled, ins, c_, _stream(), memory=[x, y, c])
    return h.compare(c, x * y)


@example("ampere/elementwise_apply", "cute/ampere/kernel/elementwise/elementwise_apply.py", "sm_80", "A100",
         "M=128 N=512 fp32 (2 x 2 CTA tiles of 64 x 256), op=mul", "bit-exact (one fp32 multiply per element)")
def _elementwise_apply(mod, h: Harness):
    return _apply_mul(mod, h, 128, 512)


@example("ampere/elementwise_apply_tail", "cute/ampere/kernel/elementwise/elementwise_apply.py", "sm_80", "A100",
         "M=40 N=96 fp32 (not a multiple of the 64 x 256 CTA tile), op=mul",
         "expected: an out-of-bounds error -- the kernel computes its predicate (frgPred) but its load and store "
         "do not use it, so a partial tile reads and writes past the tensors")
def _elementwise_apply_tail(mod, h: Harness):
    from nvgemm.emulator.ptx.errors import EmulationError

    try:
        _apply_mul(mod, h, 40, 96)
    except EmulationError as e:
        if "out-of-bounds" in str(e):
            return f"out-of-bounds access reported: {str(e).splitlines()[0][:300]}", "finding"
        raise
    return "no out-of-bounds access reported for a partial tile", False


@example("ampere/sgemm", "cute/ampere/kernel/dense_gemm/sgemm.py", "sm_80", "A100",
         "M=N=128 K=64 fp32, A/B K-major, C N-major (example data: integers in [-5, 5))",
         "bit-exact (integer data: every fp32 product and partial sum is exact)")
def _sgemm(mod, h: Harness):
    m, n, k = 128, 128, 64
    a, b = _ints((m, k), -5, 5, 2), _ints((n, k), -5, 5, 3)
    c = _ints((m, n), -5, 5, 4)
    ta = gmem(a, assumed_align=16)
    tb = gmem(b, assumed_align=16).mark_layout_dynamic(leading_dim=1).mark_compact_shape_dynamic(
        mode=1, divisibility=k)
    tc = gmem(c, assumed_align=16).mark_layout_dynamic(leading_dim=1).mark_compact_shape_dynamic(
        mode=1, divisibility=n)
    from nvidia_example_hosts import call_abc_stream  # SGemm.__call__'s default CUstream does not export

    compiled = h.compile(call_abc_stream, mod.SGemm(), ta, tb, tc, _stream())
    h.emulate(compiled, ta, tb, tc, _stream(), memory=[a, b, c])
    return h.compare(c, a.double() @ b.double().T)


@example("ampere/tensorop_gemm", "cute/ampere/kernel/dense_gemm/tensorop_gemm.py", "sm_80", "A100",
         "M=N=128 K=64 L=1 fp16 in / fp16 out / fp32 acc, atom layout 2x2x1, A/B K-major, C N-major "
         "(example data: integers in [-2, 3))",
         "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _tensorop_gemm(mod, h: Harness, mn_major: bool = False):
    import cutlass
    import torch

    from nvgemm.emulator.cute_host import device_view

    m, n, k, l = 128, 128, 64, 1
    if mn_major:  # A M-major, B N-major, C M-major (the example's prepare_tensors layouts for "m", "n", "m")
        a = _ints((l, k, m), -2, 3, 5, torch.float16).permute(0, 2, 1)
        b = _ints((l, k, n), -2, 3, 6, torch.float16)
        c = _ints((l, n, m), -2, 3, 7, torch.float16).permute(0, 2, 1)
        dims = (1, 2, 1)
    else:  # A K-major, B K-major, C N-major
        a = _ints((l, m, k), -2, 3, 5, torch.float16)
        b = _ints((l, n, k), -2, 3, 6, torch.float16).permute(0, 2, 1)
        c = _ints((l, m, n), -2, 3, 7, torch.float16)
        dims = (2, 1, 2)
    a_, b_, c_ = mod.mark_dynamic_layout(device_view(a), device_view(b), device_view(c), *dims, cutlass.Float16,
                                         cutlass.Float16)
    t0 = time.perf_counter()
    compiled = mod.compile_bmm((m, n, k, l), a_, b_, c_, cutlass.Float16, cutlass.Float16, cutlass.Float32,
                               (2, 2, 1))
    h.timings["compile_s"] = time.perf_counter() - t0
    h.emulate(compiled, a_, b_, c_, _stream(), memory=[a, b, c])
    ref = torch.bmm(a.double(), b.double())
    return h.compare(c, ref)


@example("ampere/tensorop_gemm_mn_major", "cute/ampere/kernel/dense_gemm/tensorop_gemm.py", "sm_80", "A100",
         "as ampere/tensorop_gemm with A M-major, B N-major, C M-major (fragments through ldmatrix .trans)",
         "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _tensorop_gemm_mn(mod, h: Harness):
    return _tensorop_gemm(mod, h, mn_major=True)


@example("ampere/flash_attention_v2", "cute/ampere/kernel/attention/flash_attention_v2.py", "sm_80", "A100",
         "batch 1, seqlen_q 128, seqlen_k 256 (two KV blocks: online softmax rescaling), 2 heads, head_dim 64, fp16, "
         "softmax_scale 0.125, not causal (example data: integers in [-2, 2))",
         "the example's own: atol 1e-2, rtol 1e-4 vs torch SDPA in fp64 (softmax uses ex2.approx, whose bits are "
         "implementation-defined; the emulator rounds 2^x exactly)")
def _flash_attention_v2(mod, h: Harness, causal: bool = False):
    import cutlass
    import torch

    b, sq, sk, nh, d = 1, 128, 256, 2, 64
    q, k, v = (_ints((b, s, nh, d), -2, 2, 41 + i, torch.float16) for i, s in enumerate((sq, sk, sk)))
    o = torch.full((b, sq, nh, d), float("nan"), dtype=torch.float16)
    ts = [gmem(t, assumed_align=16).mark_layout_dynamic(leading_dim=3).mark_compact_shape_dynamic(
        mode=3, stride_order=t.dim_order(), divisibility=8) for t in (q, k, v, o)]
    fa = mod.FlashAttentionForwardAmpere(d, 128, 128, 128, causal)
    compiled = h.compile(fa, *ts, cutlass.Float32(0.125), _stream())
    h.emulate(compiled, *ts, 0.125, _stream(), memory=[q, k, v, o])
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.permute(0, 2, 1, 3).double() for t in (q, k, v)), scale=0.125, is_causal=causal).permute(0, 2, 1, 3)
    return h.compare(o, ref, atol=1e-2, rtol=1e-4)


@example("ampere/flash_attention_v2_causal", "cute/ampere/kernel/attention/flash_attention_v2.py", "sm_80", "A100",
         "as ampere/flash_attention_v2 with is_causal=True (masked diagonal block, skipped upper blocks)",
         "the example's own: atol 1e-2, rtol 1e-4 vs torch SDPA (causal) in fp64")
def _flash_attention_v2_causal(mod, h: Harness):
    return _flash_attention_v2(mod, h, causal=True)


@example("ampere/hstu_attention", "cute/ampere/kernel/attention/hstu_attention.py", "sm_80", "A100",
         "batch 1, seqlen_q = seqlen_kv = 128, 2 heads, head_dim 64, bf16, blocks 64x64, not causal (torch.randn "
         "data as the example)",
         "the example's own rule: max |out - fp32 reference| <= 4 x max |bf16 reference - fp32 reference|, "
         "the references from its own run_pytorch_hstu_test on the CPU")
def _hstu_attention(mod, h: Harness):
    import cutlass
    import torch

    b, sq, sk, nh, d = 1, 128, 128, 2, 64
    g = torch.Generator().manual_seed(81)
    q, k, v = (torch.randn(b, s, nh, d, generator=g).to(torch.bfloat16) for s in (sq, sk, sk))
    rab = torch.randn(b, nh, sq, sk, generator=g).to(torch.bfloat16)
    o = torch.full((b, sq, nh, d), float("nan"), dtype=torch.bfloat16)
    ts = [gmem(t, assumed_align=16).mark_layout_dynamic(leading_dim=3).mark_compact_shape_dynamic(
        mode=3, stride_order=t.dim_order(), divisibility=8) for t in (q, k, v, o, rab)]
    fa = mod.HSTUAttentionForwardAmpere(cutlass.BFloat16, b, sq, sk, nh, d, 64, 64, 128)
    compiled = h.compile(fa, *ts, _stream())
    h.emulate(compiled, *ts, _stream(), memory=[q, k, v, o, rab])
    qh, kh, vh = (t.permute(0, 2, 1, 3).contiguous() for t in (q, k, v))
    ref32 = mod.run_pytorch_hstu_test(torch.float32, qh, kh, vh, rab, False)
    ref16 = mod.run_pytorch_hstu_test(torch.bfloat16, qh, kh, vh, rab, False)
    tol = 4 * (ref16.float() - ref32).abs().max().item()
    return h.compare(o, ref32, atol=tol)


def _mkl(l, rows, cols, dtype, seed, lo=-2, hi=3):
    """Integer-valued (rows, cols, l) operand, ``cols`` contiguous (the examples' K-major / N-major layout)."""
    return _ints((l, rows, cols), lo, hi, seed, dtype).permute(1, 2, 0)


def _gemm_mkl(mod_call, h: Harness, m, n, k, l, dtype, out_dtype, *, constexprs=()):
    """C (m, n, l) = A (m, k, l) B (n, k, l)^T through ``mod_call`` (the example's kernel object), called as
    ``(a, b, c, *constexprs, stream)``."""
    import torch

    a, b = _mkl(l, m, k, dtype, 11), _mkl(l, n, k, dtype, 12)
    c = torch.full((l, m, n), float("nan"), dtype=out_dtype).permute(1, 2, 0)
    ta, tb, tc = [gmem(t, assumed_align=16).mark_layout_dynamic(leading_dim=1) for t in (a, b, c)]
    compiled = h.compile(mod_call, ta, tb, tc, *constexprs, _stream())
    h.emulate(compiled, ta, tb, tc, _stream(), memory=[a, b, c])
    ref = torch.einsum("mkl,nkl->mnl", a.double(), b.double())
    return h.compare(c, ref)


# --- Hopper (sm_90a) -----------------------------------------------------------------------------------------


@example("hopper/dense_gemm", "cute/hopper/kernel/dense_gemm/dense_gemm.py", "sm_90a", "H200",
         "M=N=K=128 L=1 bf16 in / fp32 acc / bf16 out, tile 128x128, cluster 1x1, A/B K-major, C N-major "
         "(example data: integers in [-2, 2])",
         "bit-exact (integer data: products, fp32 sums and the bf16 result are exact)")
def _hopper_dense_gemm(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.HopperWgmmaGemmKernel(cutlass.Float32, (128, 128), (1, 1))
    return _gemm_mkl(gemm, h, 128, 128, 128, 1, torch.bfloat16, torch.bfloat16)


@example("hopper/dense_gemm_persistent", "cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py", "sm_90a", "H200",
         "M=N=256 K=128 L=1 bf16 / fp32 acc / bf16 out, tile 128x128, cluster 1x1, max_active_clusters 2 "
         "(4 tiles on 2 persistent CTAs), raster along M, swizzle 1",
         "bit-exact (integer data: products, fp32 sums and the bf16 result are exact)")
def _hopper_dense_gemm_persistent(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.HopperWgmmaGemmPersistentKernel(cutlass.Float32, (128, 128), (1, 1), 1, True)
    return _gemm_mkl(gemm, h, 256, 256, 128, 1, torch.bfloat16, torch.bfloat16, constexprs=(2,))


@example("hopper/dense_gemm_fp8", "cute/hopper/kernel/dense_gemm/dense_gemm.py", "sm_90a", "H200",
         "M=N=K=128 L=1 fp8 E4M3 in / fp32 acc / fp16 out, tile 128x128, cluster 1x1 (integer data in [-2, 2])",
         "bit-exact (integer data: exact in E4M3, products, fp32 sums and the fp16 result are exact)")
def _hopper_dense_gemm_fp8(mod, h: Harness):
    import cutlass
    import torch

    m, n, k, l = 128, 128, 128, 1
    a8, b8 = _mkl(l, m, k, torch.float8_e4m3fn, 13), _mkl(l, n, k, torch.float8_e4m3fn, 14)
    a, b = a8.view(torch.uint8), b8.view(torch.uint8)
    c = torch.full((l, m, n), float("nan"), dtype=torch.float16).permute(1, 2, 0)
    ta, tb, tc = [gmem(t, assumed_align=16).mark_layout_dynamic(leading_dim=1) for t in (a, b, c)]
    ta.element_type = tb.element_type = cutlass.Float8E4M3FN
    gemm = mod.HopperWgmmaGemmKernel(cutlass.Float32, (128, 128), (1, 1))
    compiled = h.compile(gemm, ta, tb, tc, _stream())
    h.emulate(compiled, ta, tb, tc, _stream(), memory=[a, b, c])
    ref = torch.einsum("mkl,nkl->mnl", a8.double(), b8.double())
    return h.compare(c, ref.to(torch.float16))


def _cta_norm(mod, h: Harness, norm_type: str):
    import torch

    m, n, eps = 6, 1024, 1e-6
    g = torch.Generator().manual_seed(51)
    x, w, bias = torch.randn(m, n, generator=g), torch.randn(n, generator=g), torch.randn(n, generator=g)
    y = torch.full_like(x, float("nan"))
    ty, tx, tw = (gmem(t, assumed_align=16) for t in (y, x, w))
    tb = gmem(bias, assumed_align=16) if norm_type == "layer" else None
    norm = mod.CtaNorm(n, norm_type)
    compiled = h.compile(norm, ty, tx, tw, tb)
    h.emulate(compiled, ty, tx, tw, tb, eps, memory=[y, x, w, bias])
    xd = x.double()
    if norm_type == "layer":
        ref = torch.nn.functional.layer_norm(xd, (n,), w.double(), bias.double(), eps)
    else:
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    return h.compare(y, ref, atol=1e-5, rtol=1e-5)


@example("hopper/cta_norm_layer", "cute/hopper/kernel/cta_norm/cta_norm.py", "sm_90a", "H200",
         "LayerNorm, M=6 rows, N=1024, fp32, the example's thread heuristic, eps 1e-6 (torch.randn data)",
         "atol 1e-5, rtol 1e-5 vs fp64 (fp32 reductions in the kernel's order and rsqrt.approx: a few fp32 ulp; "
         "the example's own check is 1e-3)")
def _cta_norm_layer(mod, h: Harness):
    return _cta_norm(mod, h, "layer")


@example("hopper/cta_norm_rms", "cute/hopper/kernel/cta_norm/cta_norm.py", "sm_90a", "H200",
         "RMSNorm, M=6 rows, N=1024, fp32, eps 1e-6 (torch.randn data)",
         "atol 1e-5, rtol 1e-5 vs fp64 (as the LayerNorm row)")
def _cta_norm_rms(mod, h: Harness):
    return _cta_norm(mod, h, "rms")


def _fp8_operands(m, n, k):
    import torch

    a8, b8 = (_mkl(1, r, k, torch.float8_e4m3fn, sd) for r, sd in ((m, 15), (n, 16)))
    return a8, b8, [gmem(t.view(torch.uint8), assumed_align=16).mark_layout_dynamic(leading_dim=1) for t in (a8, b8)]


@example("hopper/dense_gemm_fp8_2xacc", "cute/hopper/kernel/dense_gemm/dense_gemm_fp8_2xacc.py", "sm_90a", "H200",
         "M=N=128 K=256 L=1 E4M3 -> fp16, tile 128x128, cluster 1x1, swizzle 1, promotion every 4 MMAs, "
         "scale_a 0.5, scale_b 2, max_active_clusters 2 (integer data in [-2, 2])",
         "bit-exact (integer data, power-of-two scales: exact in fp32; the fp16 result exact)")
def _hopper_fp8_2xacc(mod, h: Harness):
    import cutlass
    import torch

    m, n, k = 128, 128, 256
    a8, b8, (ta, tb) = _fp8_operands(m, n, k)
    ta.element_type = tb.element_type = cutlass.Float8E4M3FN
    d = torch.full((1, m, n), float("nan"), dtype=torch.float16).permute(1, 2, 0)
    sa, sb = torch.tensor([0.5]), torch.tensor([2.0])
    td = gmem(d, assumed_align=16).mark_layout_dynamic(leading_dim=1)
    tsa, tsb = gmem(sa, assumed_align=16), gmem(sb, assumed_align=16)
    gemm = mod.HopperFP8WarpSpecialized2xAccGemmKernel((128, 128), (1, 1), 1, True, 4)
    compiled = h.compile(gemm, ta, tb, td, tsa, tsb, 2, _stream())
    h.emulate(compiled, ta, tb, td, tsa, tsb, _stream(), memory=[a8, b8, d, sa, sb])
    ref = torch.einsum("mkl,nkl->mnl", a8.double(), b8.double()) * 0.5 * 2.0
    return h.compare(d, ref.to(torch.float16))


@example("hopper/dense_gemm_fp8_gelu_persistent", "cute/hopper/kernel/dense_gemm/dense_gemm_fp8_gelu_persistent.py",
         "sm_90a", "H200", "C = erf-GELU(0.125 A B), M=N=128 K=256 L=1 E4M3 -> fp16, tile 128x128, cluster 1x1, "
         "max_active_clusters 2, the example's default epilogue (erf_gelu)",
         "the example's own rule: atol 2e-3 + rtol 1e-3 (fp16 output) vs torch's exact GELU in fp64 (the kernel's erf "
         "is an approximation)")
def _hopper_fp8_gelu(mod, h: Harness):
    import cutlass
    import torch

    m, n, k = 128, 128, 256
    a8, b8, (ta, tb) = _fp8_operands(m, n, k)
    ta.element_type = tb.element_type = cutlass.Float8E4M3FN
    c = torch.full((1, m, n), float("nan"), dtype=torch.float16).permute(1, 2, 0)
    tc = gmem(c, assumed_align=16).mark_layout_dynamic(leading_dim=1)
    gemm = mod.HopperFP8GeluPersistentGemmKernel(cutlass.Float32, (128, 128), (1, 1), 1, True)
    compiled = h.compile(gemm, ta, tb, tc, cutlass.Float32(0.125), True, 2, _stream())
    h.emulate(compiled, ta, tb, tc, 0.125, _stream(), memory=[a8, b8, c])
    acc = torch.einsum("mkl,nkl->mnl", a8.double(), b8.double()) * 0.125
    ref = torch.nn.functional.gelu(acc, approximate="none")
    return h.compare(c, ref.to(torch.float16).double(), atol=2e-3, rtol=1e-3)


# --- Blackwell (sm_100a) -------------------------------------------------------------------------------------


@example("blackwell/dense_gemm", "cute/blackwell/kernel/dense_gemm/dense_gemm.py", "sm_100a", "B200",
         "M=N=K=128 L=1 fp16 in / fp32 acc / fp16 out, 1-CTA MMA 128x128, cluster 1x1, TMA store, A/B K-major, "
         "C N-major (integer data in [-2, 2])",
         "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _blackwell_dense_gemm(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.DenseGemmKernel(cutlass.Float32, False, (128, 128), (1, 1), True)
    return _gemm_mkl(gemm, h, 128, 128, 128, 1, torch.float16, torch.float16)


@example("blackwell/dense_gemm_2cta", "cute/blackwell/kernel/dense_gemm/dense_gemm.py", "sm_100a", "B200",
         "M=256 N=128 K=128 L=1 fp16 / fp32 acc / fp16 out, 2-CTA MMA 256x128 (cta_group::2), cluster 2x1, "
         "TMA store (the example's default kind of config)",
         "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _blackwell_dense_gemm_2cta(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.DenseGemmKernel(cutlass.Float32, True, (256, 128), (2, 1), True)
    return _gemm_mkl(gemm, h, 256, 128, 128, 1, torch.float16, torch.float16)


@example("blackwell/dense_gemm_persistent", "cute/blackwell/kernel/dense_gemm/dense_gemm_persistent.py", "sm_100a",
         "B200", "M=N=256 K=128 L=1 fp16 / fp32 acc / fp16 out, 1-CTA MMA 128x128, cluster 1x1, TMA store, "
         "max_active_clusters 2 (4 tiles on 2 persistent CTAs)",
         "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _blackwell_dense_gemm_persistent(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.PersistentDenseGemmKernel(cutlass.Float32, False, (128, 128), (1, 1), True)
    return _gemm_mkl(gemm, h, 256, 256, 128, 1, torch.float16, torch.float16, constexprs=(2,))


TUTORIAL_GEMM = "cute/blackwell/tutorial/tutorial_gemm"
TUTORIAL_TMA = "cute/blackwell/tutorial/tutorial_tma"
EXACT_FP16 = "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)"


def _tutorial_fp16_gemm(mod, h: Harness, m, n, k, *constexprs):
    """``host_function(a, b, c, *constexprs)`` of a Blackwell fp16 GEMM tutorial: C = A B^T, fp16 K-major A / B,
    fp16 C, integer data in [-2, 2) (the tutorials' own recipe)."""
    import torch

    a, b = _ints((m, k), -2, 2, 31, torch.float16), _ints((n, k), -2, 2, 32, torch.float16)
    c = torch.full((m, n), float("nan"), dtype=torch.float16)
    ta, tb = [gmem(t, assumed_align=32).mark_layout_dynamic(leading_dim=1).mark_compact_shape_dynamic(
        mode=1, divisibility=k) for t in (a, b)]
    tc = gmem(c, assumed_align=32).mark_layout_dynamic(leading_dim=1).mark_compact_shape_dynamic(mode=1,
                                                                                               divisibility=n)
    compiled = h.compile(mod.host_function, ta, tb, tc, *constexprs)
    h.emulate(compiled, ta, tb, tc, memory=[a, b, c])
    return h.compare(c, (a.double() @ b.double().T).to(torch.float16))


@example("blackwell/tutorial_fp16_gemm_0", f"{TUTORIAL_GEMM}/fp16_gemm_0.py", "sm_100a", "B200",
         "M=128 N=256 K=128 fp16 / fp32 acc / fp16 out (the tutorial's fixed 128x256x64 MMA tiler): tcgen05 "
         "kind::f16 1-CTA, TMA, pipelines; example data: integers in [-2, 2)", EXACT_FP16)
def _blackwell_tutorial_fp16_gemm_0(mod, h: Harness):
    return _tutorial_fp16_gemm(mod, h, 128, 256, 128)


#: fp16 GEMM tutorials 1..5: (file stem, M, N, K, the host function's constexprs after a, b, c, what it adds)
TUTORIAL_FP16_GEMMS = (
    ("fp16_gemm_1", 256, 256, 128, (), "kind::f16 `.cta_group::2` over a 2x1 cluster"),
    ("fp16_gemm_2", 256, 256, 128, (), "+ TMA-store epilogue, warp specialisation"),
    ("fp16_gemm_3", 512, 512, 128, (2,), "+ static persistent scheduler, max_active_clusters 2 (4 tiles on 2 "
     "clusters)"),
    ("fp16_gemm_3_1", 512, 512, 128, (2,), "+ cluster launch control dynamic scheduler (multicast try_cancel), "
     "max_active_clusters 2"),
    ("fp16_gemm_4", 512, 1024, 128, (2, 2), "CLC + preferred (2x4) / fallback (2x1) cluster shapes, 2 active "
     "clusters of each"),
    ("fp16_gemm_5", 512, 256, 128, (2,), "CLC + TMA prefetch, max_active_clusters 2"),
)
for _stem, _m, _n, _k, _cx, _what in TUTORIAL_FP16_GEMMS:
    example(f"blackwell/tutorial_{_stem}", f"{TUTORIAL_GEMM}/{_stem}.py", "sm_100a", "B200",
            f"M={_m} N={_n} K={_k}: {_what}", EXACT_FP16)(
        lambda mod, h, _shape=(_m, _n, _k), _cx=_cx: _tutorial_fp16_gemm(mod, h, *_shape, *_cx))


DEQUANT_SCALE = 0.5  # fp16_gemm_6: B = int8 codes x 0.5, exact in fp16


@example("blackwell/tutorial_fp16_gemm_6", f"{TUTORIAL_GEMM}/fp16_gemm_6.py", "sm_100a", "B200",
         "M=512 N=256 K=128: an int8 -> fp16 dequant kernel (scale 0.5), then the CLC GEMM under PDL, "
         "max_active_clusters 2; int8 codes and A integers in [-2, 2) (the tutorial's recipe)",
         "bit-exact, both the dequantized B (exact: codes x 0.5) and C (as the fp16 rows)")
def _blackwell_tutorial_fp16_gemm_6(mod, h: Harness):
    import torch

    m, n, k = 512, 256, 128
    a = _ints((m, k), -2, 2, 33, torch.float16)
    bq = _ints((n, k), -2, 2, 34).to(torch.int8)
    b = torch.full((n, k), float("nan"), dtype=torch.float16)
    c = torch.full((m, n), float("nan"), dtype=torch.float16)
    ta, tc = (gmem(t).mark_layout_dynamic() for t in (a, c))
    tbq, tb = (gmem(t, assumed_align=32).mark_layout_dynamic(leading_dim=1).mark_compact_shape_dynamic(
        mode=1, divisibility=k) for t in (bq, b))
    compiled = h.compile(mod.host_function, ta, tbq, tb, tc, DEQUANT_SCALE, 2, _stream())
    h.emulate(compiled, ta, tbq, tb, tc, DEQUANT_SCALE, _stream(), memory=[a, bq, b, c])
    b_ref = (bq.double() * DEQUANT_SCALE).to(torch.float16)
    text, ok = h.compare(b, b_ref)
    if not ok:
        return f"dequantized B: {text}", False
    return h.compare(c, (a.double() @ b_ref.double().T).to(torch.float16))


def _tma_tutorial(mod, h: Harness, cls: str, transpose: bool, *constexprs):
    """``cls()(src, dst, *constexprs)`` of a TMA tutorial on a 256 x 384 fp16 tensor of random bit patterns (NaNs
    replaced by 1): dst must be src (copy) or src^T (transpose) bit for bit."""
    import torch

    m, n = 256, 384
    g = torch.Generator().manual_seed(91)
    src = torch.randint(-30000, 30000, (m, n), generator=g, dtype=torch.int16).view(torch.float16)
    src[src.isnan()] = 1.0
    dst = torch.full((n, m) if transpose else (m, n), float("nan"), dtype=torch.float16)
    ts, td = (gmem(t, assumed_align=16).mark_layout_dynamic(leading_dim=1).mark_compact_shape_dynamic(
        mode=1, divisibility=16) for t in (src, dst))
    compiled = h.compile(getattr(mod, cls)(), ts, td, *constexprs)
    h.emulate(compiled, ts, td, memory=[src, dst])
    ref = src.T.contiguous() if transpose else src
    return h.compare(dst.view(torch.int16), ref.view(torch.int16))


TMA_EXACT = "bit-exact (a copy: the output's bits must be the input's)"


#: TMA tutorials: (file stem, kernel class, transposes, constexprs after src, dst, what it does)
TUTORIAL_TMAS = (
    ("tma_v0", "Sm100SimpleCopyKernel", False, (), "TMA load / store copy"),
    ("tma_v1", "Sm100MatrixTransposeKernelV1", True, (), "TMA transpose through two smem views"),
    ("tma_v2", "Sm100MatrixTransposeKernelV2", True, (2,), "persistent TMA transpose, max_active_clusters 2"),
)
for _stem, _cls, _tr, _cx, _what in TUTORIAL_TMAS:
    example(f"blackwell/tutorial_{_stem}", f"{TUTORIAL_TMA}/{_stem}.py", "sm_100a", "B200",
            f"256 x 384 fp16 (random bit patterns){' -> 384 x 256' if _tr else ''}: {_what}", TMA_EXACT)(
        lambda mod, h, _a=(_cls, _tr, *_cx): _tma_tutorial(mod, h, *_a))


@example("blackwell/dense_gemm_software_pipeline", "cute/blackwell/kernel/dense_gemm/dense_gemm_software_pipeline.py",
         "sm_100a", "B200", "M=N=K=128 L=1 fp16 / fp32 acc / fp16 out, 1-CTA MMA 128x128, cluster 1x1, TMA store",
         "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _blackwell_dense_gemm_swp(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.DenseGemmKernel(cutlass.Float32, False, (128, 128), (1, 1), True)
    return _gemm_mkl(gemm, h, 128, 128, 128, 1, torch.float16, torch.float16)


@example("blackwell/dense_gemm_persistent_prefetch",
         "cute/blackwell/kernel/dense_gemm/dense_gemm_persistent_prefetch.py", "sm_100a", "B200",
         "M=N=256 K=256 L=1 fp16 / fp32 acc / fp16 out, 1-CTA MMA 128x128, cluster 1x1, TMA store, default "
         "prefetch distance, max_active_clusters 2",
         "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _blackwell_dense_gemm_prefetch(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.PersistentDenseGemmKernel(cutlass.Float32, False, (128, 128), (1, 1), True)
    return _gemm_mkl(gemm, h, 256, 256, 256, 1, torch.float16, torch.float16, constexprs=(2,))


@example("blackwell/dense_gemm_alpha_beta_persistent",
         "cute/blackwell/kernel/dense_gemm/dense_gemm_alpha_beta_persistent.py", "sm_100a", "B200",
         "D = alpha A B + beta C, M=N=256 K=128 L=1 fp16 A/B/C/D, fp32 acc and epilogue, alpha 0.5, beta -2, "
         "1-CTA MMA 128x128, cluster 1x1, max_active_clusters 2",
         "bit-exact (integer data, power-of-two alpha/beta: every step is exact in fp32 and the fp16 result exact)")
def _blackwell_alpha_beta(mod, h: Harness):
    import cutlass
    import torch

    m, n, k, l = 256, 256, 128, 1
    a, b = _mkl(l, m, k, torch.float16, 11), _mkl(l, n, k, torch.float16, 12)
    c = _mkl(l, m, n, torch.float16, 13)
    d = torch.full((l, m, n), float("nan"), dtype=torch.float16).permute(1, 2, 0)
    ts = [gmem(t, assumed_align=16).mark_layout_dynamic(leading_dim=1) for t in (a, b, c, d)]
    gemm = mod.SM100PersistentDenseGemmAlphaBetaKernel(cutlass.Float32, cutlass.Float32, False, (128, 128), (1, 1))
    compiled = h.compile(gemm, *ts, cutlass.Float32(0.5), cutlass.Float32(-2.0), 2, _stream())
    h.emulate(compiled, *ts, 0.5, -2.0, _stream(), memory=[a, b, c, d])
    ref = 0.5 * torch.einsum("mkl,nkl->mnl", a.double(), b.double()) - 2.0 * c.double()
    return h.compare(d, ref.to(torch.float16))


def _rmsnorm(mod, h: Harness, m: int, n: int):
    import cutlass
    import cutlass.cute as cute
    import torch
    from cutlass.cute.runtime import make_ptr

    g = torch.Generator().manual_seed(71)
    x = torch.randn(m, n, generator=g).to(torch.bfloat16)
    w = torch.randn(n, generator=g).to(torch.bfloat16)
    o = torch.full_like(x, float("nan"))
    cfg = mod.RMSNormConfig(cutlass.BFloat16, n, True, sm_version=100)  # the B200 profile (no GPU to query)
    ptr = lambda t: make_ptr(cutlass.BFloat16, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=16)  # noqa: E731
    args = (ptr(x), ptr(w), ptr(o), cutlass.Int32(m), cutlass.Float32(1e-6), _stream())
    compiled = h.compile(mod.RMSNormKernel(cutlass.BFloat16, n, True, config=cfg), *args)
    h.emulate(compiled, ptr(x), ptr(w), ptr(o), m, 1e-6, _stream(), memory=[x, w, o])
    xd = x.double()
    ref = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    return h.compare(o, ref, atol=0.0, rtol=2.0 ** -7)


@example("blackwell/rmsnorm", "cute/blackwell/kernel/rmsnorm/rmsnorm.py", "sm_100a", "B200",
         "M=8 N=4096 bf16 with weight, eps 1e-6, sm_version 100 (cluster_n 1)",
         "rtol 2^-7 vs fp64 (one bf16 rounding of the output, 2^-8 relative, plus the fp32 reduction order and "
         "rsqrt.approx)")
def _blackwell_rmsnorm(mod, h: Harness):
    return _rmsnorm(mod, h, 8, 4096)


@example("blackwell/rmsnorm_cluster", "cute/blackwell/kernel/rmsnorm/rmsnorm.py", "sm_100a", "B200",
         "M=2 N=32768 bf16 with weight, sm_version 100: cluster_n 2 (each row split over a 2-CTA cluster, the "
         "partial sums exchanged through distributed shared memory)",
         "rtol 2^-7 vs fp64 (as blackwell/rmsnorm)")
def _blackwell_rmsnorm_cluster(mod, h: Harness):
    return _rmsnorm(mod, h, 2, 32768)


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _nvfp4_operand(rows, k, seed):
    """(packed uint8 (rows, k / 2), fp64 values (rows, k)): random E2M1 codes, the even k in the low nibble."""
    import torch

    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, k), generator=g)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, torch.tensor(E2M1, dtype=torch.float64)[codes]


def _pow2_scales(rows, nblocks, seed):
    """(E4M3 codes uint8 (rows, nblocks), fp64 values): powers of two 2^-1, 2^0, 2^1 (codes 0x30, 0x38, 0x40)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-1, 2, (rows, nblocks), generator=g)
    return ((e + 7) * 8).to(torch.uint8), torch.pow(2.0, e.double())


@example("blackwell/dense_blockscaled_gemm_persistent",
         "cute/blackwell/kernel/blockscaled_gemm/dense_blockscaled_gemm_persistent.py", "sm_100a", "B200",
         "M=N=128 K=256 L=1 NVFP4 (E2M1, block-16 E4M3 scales) -> fp16, MMA 128x128, cluster 1x1, "
         "max_active_clusters 148; random E2M1 codes, scales 2^-1..2^1 (the example's own scale recipe, E4M3 codes "
         "0..2, is subnormal 2^-9 scales that round almost every fp16 output to 0)",
         "bit-exact (products of E2M1 values and power-of-two scales and their fp32 sums are exact; the fp16 "
         "rounding of the exact sum is the same on both sides)")
def _blackwell_blockscaled(mod, h: Harness):
    return _blockscaled(mod, h, 128, (128, 128), (1, 1), 148)


def _blockscaled(mod, h: Harness, m, mma_tiler, cluster, max_active_clusters):
    import cutlass
    import cutlass.cute as cute
    import torch
    from cutlass.cute.runtime import make_ptr

    n, k, l = 128, 256, 1
    a, av = _nvfp4_operand(m, k, 21)
    b, bv = _nvfp4_operand(n, k, 22)
    sfa_codes, sfa = _pow2_scales(m, k // 16, 23)
    sfb_codes, sfb = _pow2_scales(n, k // 16, 24)
    # the kernel's scale layout (128 x 4 blocks of 32 x 16 bytes) is the example's own to_blocked order for L = 1
    sfa_blk, sfb_blk = mod.to_blocked(sfa_codes).contiguous(), mod.to_blocked(sfb_codes).contiguous()
    c = torch.full((m, n), float("nan"), dtype=torch.float16)
    gemm = mod.Sm100BlockScaledPersistentDenseGemmKernel(16, mma_tiler, cluster)
    t0 = time.perf_counter()
    compiled = mod.scaled_mm(gemm, cutlass.Float4E2M1FN, cutlass.Float4E2M1FN, cutlass.Float16, cutlass.Float8E4M3FN,
                             "k", "k", "n", max_active_clusters, _stream())
    h.timings["compile_s"] = time.perf_counter() - t0
    ptr = lambda dt, t, al: make_ptr(dt, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=al)  # noqa: E731
    h.emulate(compiled, ptr(cutlass.Float4E2M1FN, a, 16), ptr(cutlass.Float4E2M1FN, b, 16),
              ptr(cutlass.Float8E4M3FN, sfa_blk, 32), ptr(cutlass.Float8E4M3FN, sfb_blk, 32),
              ptr(cutlass.Float16, c, 16), (m, n, k, l), _stream(), memory=[a, b, sfa_blk, sfb_blk, c])
    ref = (av * sfa.repeat_interleave(16, dim=1)) @ (bv * sfb.repeat_interleave(16, dim=1)).T
    return h.compare(c, ref.to(torch.float16))


@example("blackwell/dense_blockscaled_gemm_persistent_2cta",
         "cute/blackwell/kernel/blockscaled_gemm/dense_blockscaled_gemm_persistent.py", "sm_100a", "B200",
         "M=256 N=128 K=256 L=1 NVFP4 -> fp16, 2-CTA MMA 256x128 (cta_group::2), cluster 2x1, max_active_clusters "
         "74; data as the 1-CTA row", "bit-exact (as the 1-CTA row)")
def _blackwell_blockscaled_2cta(mod, h: Harness):
    return _blockscaled(mod, h, 256, (256, 128), (2, 1), 74)


def _blocked_scales(sf):
    """(rows, k / 16) scale codes in the tcgen05 block-scaled layout (cuBLAS's 128 x 4 blocks, row-major over
    (row block, k block); inside a block, byte ``16 (m % 32) + 4 (m // 32 % 4) + k % 4``), rows padded to 128."""
    import torch

    rows, nk = sf.shape
    rb, kb = -(-rows // 128), -(-nk // 4)
    out = torch.zeros(rb * kb * 512, dtype=torch.uint8)
    for m in range(rows):
        for k in range(nk):
            out[((m // 128) * kb + k // 4) * 512 + 16 * (m % 32) + 4 * (m // 32 % 4) + k % 4] = sf[m, k]
    return out


@example("blackwell/tutorial_nvfp4_gemm_0", "cute/blackwell/tutorial/tutorial_gemm/nvfp4_gemm_0.py", "sm_100a", "B200",
         "M=128 N=256 K=256 L=1 NVFP4 -> fp16 (the tutorial's fixed 128x256 MMA tiler); data as "
         "blackwell/dense_blockscaled_gemm_persistent, scales laid out by the harness (cuBLAS 128x4 blocks)",
         "bit-exact (as blackwell/dense_blockscaled_gemm_persistent)")
def _blackwell_tutorial_nvfp4_gemm_0(mod, h: Harness):
    return _tutorial_nvfp4(mod, h, 128, 256, 256)


@example("blackwell/tutorial_nvfp4_gemm_1", f"{TUTORIAL_GEMM}/nvfp4_gemm_1.py", "sm_100a", "B200",
         "M=N=256 K=512 L=1 NVFP4 -> fp16: kind::mxf4nvf4 `.cta_group::2` (the tutorial's fixed 256x256 MMA tiler, "
         "2x1 cluster); data as tutorial_nvfp4_gemm_0", "bit-exact (as blackwell/dense_blockscaled_gemm_persistent)")
def _blackwell_tutorial_nvfp4_gemm_1(mod, h: Harness):
    return _tutorial_nvfp4(mod, h, 256, 256, 512)


def _tutorial_nvfp4(mod, h: Harness, m, n, k):
    import cutlass
    import cutlass.cute as cute
    import torch
    from cutlass.cute.runtime import make_ptr

    l = 1
    a, av = _nvfp4_operand(m, k, 61)
    b, bv = _nvfp4_operand(n, k, 62)
    sfa_codes, sfa = _pow2_scales(m, k // 16, 63)
    sfb_codes, sfb = _pow2_scales(n, k // 16, 64)
    sfa_blk, sfb_blk = _blocked_scales(sfa_codes), _blocked_scales(sfb_codes)
    c = torch.full((m, n), float("nan"), dtype=torch.float16)
    ptr = lambda dt, t, al: make_ptr(dt, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=al)  # noqa: E731
    args = (ptr(cutlass.Float4E2M1FN, a, 16), ptr(cutlass.Float4E2M1FN, b, 16), ptr(cutlass.Float8E4M3FN, sfa_blk, 32),
            ptr(cutlass.Float8E4M3FN, sfb_blk, 32), ptr(cutlass.Float16, c, 32), (m, n, k, l), _stream())
    # its problem_size parameter is annotated `tuple`: the export specialises it while the call marshalling packs
    # it, so call it from a host function of ours taking the sizes as Int32 (nvidia_example_hosts.py)
    from nvidia_example_hosts import call_ptrs_mnkl_stream

    args = args[:5] + (m, n, k, l, args[6])
    compiled = h.compile(call_ptrs_mnkl_stream, mod.Sm100BlockScaledDenseGemmKernel(), *args)
    h.emulate(compiled, *args, memory=[a, b, sfa_blk, sfb_blk, c])
    ref = (av * sfa.repeat_interleave(16, dim=1)) @ (bv * sfb.repeat_interleave(16, dim=1)).T
    return h.compare(c, ref.to(torch.float16))


# --- Blackwell GeForce (sm_120a / sm_121a) ------------------------------------------------------------------

GEFORCE_BS = "cute/blackwell_geforce/kernel/blockscaled_gemm"


def _fp4_mkl(rows, k, l, seed):
    """(uint8 (l, rows, k) storage viewed (rows, k, l), fp64 values (rows, k)) of a K-major E2M1 operand as the
    sm_120 examples build it: a byte-per-element torch buffer typed Float4E2M1FN, so the packed codes (element
    (r, k) at nibble r * k + k, the even one low) fill its first half; l must be 1."""
    import torch

    packed, values = _nvfp4_operand(rows, k, seed)
    buf = torch.zeros(l, rows, k, dtype=torch.uint8)
    buf.view(-1)[: rows * k // 2] = packed.reshape(-1)
    return buf.permute(1, 2, 0), values


def _fp4_tensor(t):
    import cutlass

    tt = gmem(t, assumed_align=16)
    tt.element_type = cutlass.Float4E2M1FN
    tt = tt.mark_layout_dynamic(leading_dim=1)
    return tt.mark_compact_shape_dynamic(mode=1, stride_order=(2, 0, 1), divisibility=2)


def _ue8m0_scales(rows, nblocks, seed):
    """(UE8M0 codes uint8 (rows, nblocks), fp64 values): powers of two 2^-1, 2^0, 2^1 (codes 126, 127, 128)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-1, 2, (rows, nblocks), generator=g)
    return (e + 127).to(torch.uint8), torch.pow(2.0, e.double())


def _fp8_mkl(rows, k, l, seed):
    """(uint8 codes (l, rows, k) viewed (rows, k, l), fp64 values (rows, k)) of a K-major E4M3 operand: random
    codes of every finite E4M3 value with exponent field 4..10 (magnitudes 2^-3 .. 2^3 x 1.875)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    codes = (torch.randint(0, 2, (rows, k), generator=g) << 7) | (torch.randint(4, 11, (rows, k), generator=g) << 3) \
        | torch.randint(0, 8, (rows, k), generator=g)
    buf = codes.to(torch.uint8).reshape(l, rows, k)
    return buf.permute(1, 2, 0), buf[0].view(torch.float8_e4m3fn).double()


def _fp8_tensor(t):
    import cutlass

    tt = gmem(t, assumed_align=16)
    tt.element_type = cutlass.Float8E4M3FN
    return tt.mark_layout_dynamic(leading_dim=1)


def _sm120_blockscaled(mod, h: Harness, m, n, k, tile, max_active_clusters, fmt="nvfp4"):
    """The example's own kernel object and ``cute.compile(gemm, a, b, sfa, sfb, c, max_active_clusters, stream)``
    (its run_bs path) on A (m, k, 1) / B (n, k, 1) K-major, scales in the example's (32, 4, rest_m, 4, rest_k, l)
    scale buffer (the tcgen05 128 x 4 blocks), C (m, n, 1) N-major fp16. ``fmt``: "nvfp4" (E2M1, E4M3 scales per
    16), "mxfp4" (E2M1, UE8M0 per 32), "mxfp8" (E4M3, UE8M0 per 32)."""
    import cutlass
    import torch

    l = 1
    vec = 16 if fmt == "nvfp4" else 32
    a_fp8, b_fp8 = fmt in ("mxfp8", "mxf8_fp4"), fmt in ("mxfp8", "mxf4_fp8")
    a, av = (_fp8_mkl if a_fp8 else _fp4_mkl)(m, k, l, 81)
    b, bv = (_fp8_mkl if b_fp8 else _fp4_mkl)(n, k, l, 82)
    scales = _pow2_scales if fmt == "nvfp4" else _ue8m0_scales
    sfa_codes, sfa = scales(m, k // vec, 83)
    sfb_codes, sfb = scales(n, k // vec, 84)
    sfa_blk, sfb_blk = _blocked_scales(sfa_codes), _blocked_scales(sfb_codes)
    c = torch.full((l, m, n), float("nan"), dtype=torch.float16).permute(1, 2, 0)
    a_, b_ = (_fp8_tensor(t) if fp8 else _fp4_tensor(t) for t, fp8 in ((a, a_fp8), (b, b_fp8)))
    sfa_, sfb_ = gmem(sfa_blk, assumed_align=16), gmem(sfb_blk, assumed_align=16)
    sfa_.element_type = sfb_.element_type = cutlass.Float8E4M3FN if fmt == "nvfp4" else cutlass.Float8E8M0FNU
    c_ = gmem(c, assumed_align=16).mark_layout_dynamic(leading_dim=1)
    gemm = mod.Sm120BlockScaledGemmKernel(cutlass.Float32, vec, tile, tile[:2])
    compiled = h.compile(gemm, a_, b_, sfa_, sfb_, c_, max_active_clusters, _stream())
    h.emulate(compiled, a_, b_, sfa_, sfb_, c_, _stream(), memory=[a, b, sfa_blk, sfb_blk, c])
    ref = (av * sfa.repeat_interleave(vec, dim=1)) @ (bv * sfb.repeat_interleave(vec, dim=1)).T
    return h.compare(c[:, :, 0], ref.to(torch.float16))


_SM120_BS_TOL = ("bit-exact (products of the elements and power-of-two scales and their fp32 sums are exact; "
                 "the fp16 rounding of the exact sum is the same on both sides)")
_SM120_NVFP4 = ("NVFP4 (E2M1, block-16 E4M3 scales = mma kind::mxf4nvf4 scale_vec::4X ue4m3) -> fp16; random E2M1 "
                "codes, scales 2^-1..2^1")


@example("blackwell_geforce/blockscaled_gemm_cooperative",
         f"{GEFORCE_BS}/dense_blockscaled_gemm_persistent_cooperative.py", "sm_120a", "RTX5090",
         f"M=256 N=128 K=256 L=1 {_SM120_NVFP4}; tile 128x128x128, 8 MMA warps + 1 TMA warp, max_active_clusters 1 "
         "(one persistent CTA walks both tiles)", _SM120_BS_TOL)
def _geforce_bs_cooperative(mod, h: Harness):
    return _sm120_blockscaled(mod, h, 256, 128, 256, (128, 128, 128), 1)


@example("blackwell_geforce/blockscaled_gemm_cooperative_2cta",
         f"{GEFORCE_BS}/dense_blockscaled_gemm_persistent_cooperative.py", "sm_120a", "RTX5090",
         f"M=N=256 K=384 L=1 {_SM120_NVFP4}; tile 128x128x128 (3 K tiles), max_active_clusters 2 (4 tiles on 2 "
         "persistent CTAs)", _SM120_BS_TOL)
def _geforce_bs_cooperative_2cta(mod, h: Harness):
    return _sm120_blockscaled(mod, h, 256, 256, 384, (128, 128, 128), 2)


@example("blackwell_geforce/blockscaled_gemm_cooperative_mxfp4",
         f"{GEFORCE_BS}/dense_blockscaled_gemm_persistent_cooperative.py", "sm_120a", "RTX5090",
         "M=N=128 K=256 L=1 MXFP4 (E2M1, block-32 UE8M0 scales: the dispatch's MmaMXF4Op) -> fp16, tile 128x128x128, "
         "max_active_clusters 1; scales 2^-1..2^1", _SM120_BS_TOL)
def _geforce_bs_cooperative_mxfp4(mod, h: Harness):
    return _sm120_blockscaled(mod, h, 128, 128, 256, (128, 128, 128), 1, fmt="mxfp4")


@example("blackwell_geforce/blockscaled_gemm_cooperative_mxfp8",
         f"{GEFORCE_BS}/dense_blockscaled_gemm_persistent_cooperative.py", "sm_120a", "RTX5090",
         "M=N=128 K=256 L=1 MXFP8 (E4M3 x E4M3, block-32 UE8M0 scales: MmaMXF8Op, mma kind::mxf8f6f4 "
         "scale_vec::1X) -> fp16, tile 128x128x128, max_active_clusters 1; E4M3 codes of magnitude 2^-3..2^3, "
         "scales 2^-1..2^1", _SM120_BS_TOL)
def _geforce_bs_cooperative_mxfp8(mod, h: Harness):
    return _sm120_blockscaled(mod, h, 128, 128, 256, (128, 128, 128), 1, fmt="mxfp8")


@example("blackwell_geforce/blockscaled_gemm_cooperative_mxf4_mxf8",
         f"{GEFORCE_BS}/dense_blockscaled_gemm_persistent_cooperative.py", "sm_120a", "RTX5090",
         "M=N=128 K=256 L=1 mixed A E2M1 x B E4M3, block-32 UE8M0 scales (the dispatch's MmaMXF8F6F4Op: mma "
         "kind::mxf8f6f4 .e2m1.e4m3, A through ldmatrix .m8n16 .b8x16.b4x16_p64 and a 2-bit shift) -> fp16, tile "
         "128x128x128, max_active_clusters 1", _SM120_BS_TOL)
def _geforce_bs_cooperative_mixed(mod, h: Harness):
    return _sm120_blockscaled(mod, h, 128, 128, 256, (128, 128, 128), 1, fmt="mxf4_fp8")


@example("blackwell_geforce/blockscaled_gemm_pingpong", f"{GEFORCE_BS}/dense_blockscaled_gemm_persistent_pingpong.py",
         "sm_120a", "RTX5090",
         f"M=N=256 K=256 L=1 {_SM120_NVFP4}; tile 128x128x128, two MMA warp groups alternating tiles, "
         "max_active_clusters 1 (one persistent CTA, 4 tiles)", _SM120_BS_TOL)
def _geforce_bs_pingpong(mod, h: Harness):
    return _sm120_blockscaled(mod, h, 256, 256, 256, (128, 128, 128), 1)


@example("blackwell_geforce/blockscaled_gemm_cooperative_sm121a",
         f"{GEFORCE_BS}/dense_blockscaled_gemm_persistent_cooperative.py", "sm_121a", "GB10",
         f"as blackwell_geforce/blockscaled_gemm_cooperative (M=256 N=128 K=256, {_SM120_NVFP4}), compiled for "
         "sm_121a (DGX Spark) and run on the GB10 profile", _SM120_BS_TOL)
def _geforce_bs_cooperative_sm121(mod, h: Harness):
    return _sm120_blockscaled(mod, h, 256, 128, 256, (128, 128, 128), 1)


@example("blackwell_geforce/dense_gemm", "cute/blackwell_geforce/kernel/dense_gemm/dense_gemm.py", "sm_120a",
         "RTX5090",
         "M=N=128 K=256 L=1 fp16 in / fp32 acc / fp16 out, tile 64x64x64 (the example's default), 2x2 MMA warps + "
         "1 TMA warp, max_active_clusters 4 (16 tiles on 4 persistent CTAs), A/B K-major, C N-major (example data: "
         "integers in [-2, 2])", "bit-exact (integer data: products, fp32 sums and the fp16 result are exact)")
def _geforce_dense_gemm(mod, h: Harness):
    import cutlass
    import torch

    gemm = mod.Sm120GemmKernel(cutlass.Float32, (64, 64, 64))
    return _gemm_mkl(gemm, h, 128, 128, 256, 1, torch.float16, torch.float16, constexprs=(4,))


def child_main(checkout: Path, name: str, schedules=tuple(SCHEDULES)) -> dict:
    ex = EXAMPLES[name]
    root = checkout / EXAMPLES_SUBDIR
    path = root / ex.path
    out = {"example": name, "path": ex.path, "arch": ex.arch, "size": ex.size, "tolerance": ex.tolerance}
    if not path.exists():
        out.update(result=f"not in this checkout: {path}", ok=False)
        return out
    for p in (str(root), str(root / "cute"), str(Path(__file__).parent)):  # examples import "cute.x" and "blackwell.x"
        if p not in sys.path:
            sys.path.insert(0, p)
    h = Harness(ex, schedules)
    t0 = time.perf_counter()
    try:
        spec = importlib.util.spec_from_file_location(f"nvidia_example_{name.replace('/', '_')}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses and cute.jit look their module up
        spec.loader.exec_module(mod)
        result, ok = ex.run(mod, h)
        if h.schedule_mismatch:
            result, ok = (f"schedule MISMATCH: {', '.join(h.schedule_mismatch)} left memory different from "
                          f"{h.schedules[0]} (which gave: {result})"), False
        out.update(result=result, ok=ok)
    except Exception as e:  # report the failure (an unknown opcode names itself), keep going with the others
        from nvgemm.emulator.ptx.errors import EmulationError

        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        kind = "emulator" if isinstance(e, EmulationError) else "harness/compile"
        out.update(result=f"{kind} error: {type(e).__name__}: {first[:400]}", ok=False,
                   traceback=traceback.format_exc()[-3000:])
    out["wall_s"] = time.perf_counter() - t0
    out["schedules"] = h.canceled  # schedule -> clusters canceled (the schedules that ran)
    out.update({k: round(v, 2) for k, v in h.timings.items()})
    out["launches"] = [{"grid": L.grid, "block": L.block, "cluster": L.cluster, "dyn_smem": L.dyn_smem,
                        "stats": {k: v for k, v in L.stats.items() if k in NOTED_STATS and v}} for L in h.launches]
    return out


# ------------------------------------------------------------------------------------------------------------
# parent side
# ------------------------------------------------------------------------------------------------------------


def cutlass_commit(checkout: Path, given: str | None) -> str:
    if given:
        return given
    r = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0:
        return r.stdout.strip()
    f = checkout / "COMMIT"
    return f.read_text().strip() if f.exists() else "unknown"


def run_child(checkout: Path, ex: Example, timeout: int, schedules=tuple(SCHEDULES)) -> dict:
    env = dict(os.environ)
    dump = tempfile.mkdtemp(prefix="nvgemm_nvex_dump_")
    env.update(CUTE_DSL_ARCH=ex.arch, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=dump)
    cmd = [sys.executable, __file__, "--cutlass", str(checkout), "--child", ex.name, "--schedules", ",".join(schedules)]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"example": ex.name, "path": ex.path, "arch": ex.arch, "size": ex.size, "tolerance": ex.tolerance,
                "ok": False, "result": f"timed out after {timeout} s", "wall_s": time.perf_counter() - t0}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("NVEX_RESULT "):
            return json.loads(line[len("NVEX_RESULT "):])
    tail = (r.stderr or r.stdout).strip().splitlines()[-5:]
    return {"example": ex.name, "path": ex.path, "arch": ex.arch, "size": ex.size, "tolerance": ex.tolerance,
            "ok": False, "result": f"child exited {r.returncode}: {' | '.join(tail)[-400:]}",
            "wall_s": time.perf_counter() - t0}


def _status(r: dict) -> str:
    return {True: "PASS", "finding": "FINDING"}.get(r.get("ok"), "FAIL")


def markdown(rows: list[dict], commit: str, checkout_arg: str, note: str = "") -> str:
    from importlib.metadata import version

    lines = [
        "# NVIDIA's CuTeDSL examples on the PTX emulator",
        "",
        f"CUTLASS commit `{commit}` (examples imported at run time from a checkout, nothing copied), "
        f"nvidia-cutlass-dsl {version('nvidia-cutlass-dsl')}, CPU only. Each example's own `@cute.jit` host function "
        "is compiled for its architecture, exported (`export_to_c`), relinked against the fake CUDA runtime and run; "
        "every kernel launch it makes is interpreted from the kept PTX. Reference: the example's own semantics "
        "computed with torch on the CPU in fp64. Each host call runs under the cluster schedules of "
        "`nvgemm.emulator.ptx.schedule` named in the schedules column, each from the same initial memory: serial in "
        "launch order (a cluster launch control kernel's first cluster cancels and computes every pending one), two "
        "clusters resident in reverse order, the whole grid resident in a shuffled order (every `try_cancel` fails); "
        "a launch with a preferred cluster shape runs all preferred, mixed (seeded per region) and all fallback in "
        "these three. The first schedule's output is checked against the reference and every other schedule must "
        "leave all memory bit for bit as the first did; the column counts successful `try_cancel`s per schedule. "
        "Times: emulator = the host call with all its launches interpreted, summed over the schedules; compile = "
        "`cute.compile`.",
        "",
        "Regenerate: `python bench/run_nvidia_examples.py --cutlass <checkout> --results "
        "bench/results/emulator_nvidia_examples.md` (one example: `--only NAME`).",
        "",
        *([note, ""] if note else []),
        "| example | arch | problem | result | tolerance | schedules: clusters canceled | emulator s | compile s "
        "| launches (grid/block/cluster/smem) |",
        "|---|---|---|---|---|---|---:|---:|---|",
    ]
    for r in rows:
        launches = "; ".join(f"{tuple(L['grid'])}/{tuple(L['block'])}/{tuple(L['cluster'])}/{L['dyn_smem']}"
                             + "".join(f" ({k}: {v})" for k, v in L.get("stats", {}).items())
                             for L in r.get("launches", []))
        res = f"{_status(r)}: " + r["result"].replace("|", "\\|")
        emu = f"{r['emulate_s']:.2f}" if "emulate_s" in r else "-"
        comp = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
        sched = " / ".join(f"{k} {v}" for k, v in r.get("schedules", {}).items()) or "-"
        lines.append(f"| `{r['example']}` (`{r['path']}`) | {r['arch']} | {r['size']} | {res} | {r['tolerance']} | "
                     f"{sched} | {emu} | {comp} | {launches or '-'} |")
    lines += ["", "Command per row: `python bench/run_nvidia_examples.py --cutlass <checkout> --only <example>`.", "",
              "## Examples without an adapter", "", "| example(s) | why |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in NOT_ADAPTED.items()]
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cutlass", type=Path, help="path to a CUTLASS checkout (holds examples/python/CuTeDSL)")
    ap.add_argument("--only", action="append", default=[], help="run only this example (repeatable); see --list")
    ap.add_argument("--list", action="store_true", help="list the examples and exit")
    ap.add_argument("--results", type=Path, help="write the results table (markdown) here")
    ap.add_argument("--commit", help="CUTLASS commit to report (default: git rev-parse HEAD of the checkout)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per example (default 1800)")
    ap.add_argument("--note", default="", help="a paragraph for the results file (e.g. how the commit was chosen)")
    ap.add_argument("--schedules", default=",".join(SCHEDULES),
                    help=f"comma-separated cluster schedules to run each host call under, the first checked against "
                         f"the reference, the others against the first (default: all of {', '.join(SCHEDULES)})")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        for ex in EXAMPLES.values():
            print(f"{ex.name:40s} {ex.arch:8s} {ex.path}")
        return 0
    if args.cutlass is None:
        ap.error("--cutlass is required (a CUTLASS checkout with examples/python/CuTeDSL)")
    checkout = args.cutlass.resolve()
    schedules = tuple(x for x in args.schedules.split(",") if x)
    bad = [x for x in schedules if x not in SCHEDULES]
    if bad or not schedules:
        ap.error(f"unknown schedule(s) {bad or schedules}; choose from {', '.join(SCHEDULES)}")
    if args.child:
        print("NVEX_RESULT " + json.dumps(child_main(checkout, args.child, schedules)), flush=True)
        return 0
    if not (checkout / EXAMPLES_SUBDIR).is_dir():
        ap.error(f"{checkout} has no {EXAMPLES_SUBDIR}")
    unknown = [n for n in args.only if n not in EXAMPLES]
    if unknown:
        ap.error(f"unknown example(s) {unknown}; see --list")
    names = args.only or list(EXAMPLES)
    rows = []
    for n in names:
        r = run_child(checkout, EXAMPLES[n], args.timeout, schedules)
        rows.append(r)
        print(f"{n}: {_status(r)} {r['result']} "
              f"(emulator {r.get('emulate_s', '-')} s, wall {r.get('wall_s', 0):.1f} s)", flush=True)
    if args.results:
        args.results.write_text(markdown(rows, cutlass_commit(checkout, args.commit), str(args.cutlass), args.note))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
