"""The pre-bound Triton launch (``nvgemm.templates.triton.prebound.PreboundLaunch``) launches what
``JITFunction.run`` launches, and goes back to ``run`` whenever Triton would pick another kernel.

No GPU here: ``nvgemm.testing.triton_recording_driver`` makes Triton's active driver a stand-in sm_100 device,
so ``JITFunction.run`` runs its real code (binder, specialization, cache key, ``triton.compile`` of real
PTX / cubin for sm_100a, ``CompiledKernel`` handles, launch metadata) and Triton's real ``CudaLauncher`` runs up
to the driver's ``launch`` entry, which records (grid, stream, function handle, cooperative / PDL attributes,
packed metadata, launch metadata, hooks, scratch, the kernel signature, the argument tuple) instead of entering
``cuLaunchKernelEx``. Each loaded binary gets its own function handle, so a record names the compiled kernel.
The reference for every pre-bound launch is the record of ``kernel[grid](...)`` with the same arguments.
Not covered: the C launcher itself (argument packing into ``cuLaunchKernelEx``, which both paths reach with the
same inputs) and a real device's current-stream query.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.runtime.jit import JITFunction  # noqa: E402

from nvgemm.templates.triton import quantize as tq  # noqa: E402
from nvgemm.templates.triton.prebound import PreboundLaunch, prebindable  # noqa: E402
from nvgemm.testing import triton_recording_driver  # noqa: E402

K = tq.quantize_nvfp4_kernel
pytestmark = pytest.mark.skipif(not prebindable(K), reason="Triton interpreter mode, or a Triton release the "
                                "pre-bound launch was not checked against: nothing is pre-bound")


def _problem(m, k=256, dtype=torch.bfloat16, offset=0):
    """(x, input_scale, packed, scales) of an [m, k] swizzled quantization; ``offset`` elements into x's storage."""
    x = torch.randn(m * k + offset, dtype=torch.float32).to(dtype)[offset:].view(m, k)
    gs = torch.ones(1)
    packed = torch.empty(m, k // 2, dtype=torch.uint8)
    sf = torch.empty(((m + 127) // 128 * 128) * ((k // 16 + 3) // 4 * 4), dtype=torch.uint8)
    return x, gs, packed, sf


def _kwargs(pdl: bool):
    return dict(SWIZZLE=True, USE_GDC=pdl, BLOCK_M=8, BLOCK_K=256, num_warps=4, launch_pdl=pdl,
                enable_fp_fusion=False)


def _grid(m):
    return ((m + 127) // 128 * 128 // 8, 1)


def _fixed(t, m, k=256):
    return (None, None, None, None, m, k, t[0].stride(0), t[2].stride(0))


def _same(a, b):
    """Two driver records are the same launch: every field equal, a tensor argument by what the launcher reads of
    it (its data pointer) and its dtype, the launch metadata by value."""
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        if i == 6:  # LazyDict of (name, function, stream) and the kernel's launch_metadata extras
            assert (u is None) == (v is None)
            if u is not None:
                assert u.get() == v.get()
        elif i == 12:
            assert len(u) == len(v)
            for x, y in zip(u, v):
                if isinstance(x, torch.Tensor):
                    assert isinstance(y, torch.Tensor) and (x.data_ptr(), x.dtype) == (y.data_ptr(), y.dtype)
                else:
                    assert type(x) is type(y) and x == y, (x, y)
        else:
            assert u == v, (i, u, v)


@pytest.fixture
def run_calls(monkeypatch):
    """Counts ``JITFunction.run`` calls (the real method still runs)."""
    calls = []
    real = JITFunction.run

    def spy(self, *args, **kwargs):
        calls.append(self.fn.__name__)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", spy)
    return calls


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("m", [1, 3])
def test_repeat_calls_launch_what_run_launches(pdl, m, run_calls):
    with triton_recording_driver() as rec:
        lp = PreboundLaunch(K, _grid(m), _fixed(_problem(m), m), (0, 1, 2, 3), _kwargs(pdl))
        for _ in range(3):
            t = _problem(m)
            K[_grid(m)](*t, m, 256, t[0].stride(0), t[2].stride(0), **_kwargs(pdl))
            ref = rec[-1]
            n_run = len(run_calls)
            lp(*t)
            _same(rec[-1], ref)
        assert len(run_calls) == n_run, "a repeat call went through JITFunction.run"
    assert ref[4] is pdl and ref[3] is False  # the PDL attribute reached the driver as asked
    assert len(rec) == 6


def test_specialization_changes_fall_back_to_run(run_calls):
    m = 3
    with triton_recording_driver() as rec:
        lp = PreboundLaunch(K, _grid(m), _fixed(_problem(m), m), (0, 1, 2, 3), _kwargs(False))
        lp(*_problem(m))  # captures the aligned bf16 kernel
        aligned_fn = rec[-1][2]
        cases = [
            ("x 2 bytes off 16-byte alignment", _problem(m, offset=1)),
            ("x float16", _problem(m, dtype=torch.float16)),
            ("packed 8 bytes off alignment", _problem(m)[:2] + (torch.empty(m * 128 + 8, dtype=torch.uint8)[8:]
                                                                .view(m, 128),) + _problem(m)[3:]),
        ]
        for what, t in cases:
            n_run = len(run_calls)
            lp(*t)
            assert len(run_calls) == n_run + 1, what
            got = rec[-1]
            K[_grid(m)](*t, m, 256, t[0].stride(0), t[2].stride(0), **_kwargs(False))
            _same(got, rec[-1])
            assert got[2] != aligned_fn, f"{what}: launched the kernel specialized for the aligned bf16 call"
        n_run = len(run_calls)
        lp(*_problem(m))  # back to the captured specialization: pre-bound again
        assert len(run_calls) == n_run and rec[-1][2] == aligned_fn


def test_integer_specialization_changes_fall_back_to_run(run_calls):
    """M given per call: ``M == 1`` (a constexpr in Triton's key) and 16-divisibility change the kernel."""
    t = _problem(32)
    fixed = (None, None, None, None, None, 256, t[0].stride(0), t[2].stride(0))
    with triton_recording_driver() as rec:
        lp = PreboundLaunch(K, _grid(32), fixed, (0, 1, 2, 3, 4), _kwargs(False))
        lp(*t, 32)
        captured = rec[-1][2]
        n_run = len(run_calls)
        lp(*t, 16)  # still divisible by 16: same kernel, pre-bound
        assert len(run_calls) == n_run and rec[-1][2] == captured and rec[-1][12][4] == 16
        for mm in (1, 17):
            lp(*t, mm)
            got = rec[-1]
            assert len(run_calls) == n_run + 1, mm
            K[_grid(32)](*t, mm, 256, t[0].stride(0), t[2].stride(0), **_kwargs(False))
            n_run = len(run_calls)
            _same(got, rec[-1])
            assert got[2] != captured


def test_hooks_device_and_skipped_launches_stay_on_run(run_calls, monkeypatch):
    m = 3
    with triton_recording_driver() as rec:
        lp = PreboundLaunch(K, _grid(m), _fixed(_problem(m), m), (0, 1, 2, 3), _kwargs(False))
        lp(*_problem(m))
        n_run = len(run_calls)
        seen = []
        K.add_pre_run_hook(lambda *a, **k: seen.append(1))
        try:
            lp(*_problem(m))
        finally:
            K.pre_run_hooks.clear()
        assert seen == [1] and len(run_calls) == n_run + 1
        from triton.runtime.driver import driver

        monkeypatch.setattr(driver.active, "get_current_device", lambda: 1)
        lp(*_problem(m))  # another current device: run (which binds, compiles and launches for device 1)
        assert len(run_calls) == n_run + 2
        assert len(rec) == 3
    # a run that returns no compiled kernel (a jit_cache_hook skipping the launch, a recorder) is never captured
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: run_calls.append("stub"))
    lp2 = PreboundLaunch(K, _grid(m), _fixed(_problem(m), m), (0, 1, 2, 3), _kwargs(False))
    for _ in range(3):
        lp2(*_problem(m))
    assert run_calls[-3:] == ["stub"] * 3


def test_quantizer_launches_as_kernel_grid_call(monkeypatch, run_calls):
    """``quantize_nvfp4_triton`` on the compiled path: the same driver records as the plain
    ``quantize_nvfp4_kernel[grid](...)`` call of the same problem (grid, block sizes, options from
    ``quantize_config`` / ``launch_options``), the repeat without ``JITFunction.run``."""
    monkeypatch.setattr(tq, "check_device", lambda kernel, *t, op: t[0].device)  # CPU tensors on the stand-in GPU
    tq.quantize_launch.cache_clear()
    m, k = 2, 512
    with triton_recording_driver() as rec:
        for _ in range(2):
            x, gs, packed, sf = _problem(m, k)
            tq.quantize_nvfp4_triton(x, gs, True, pdl=False, out=(packed, sf.view(torch.float8_e4m3fn)))
            got = rec[-1]
            bm, bk, nw = tq.quantize_config(m, k, True, False)
            K[(128 // bm, (k // 16 + 3) // 4 * 64 // bk)](x, gs, packed, sf, m, k, k, k // 2, SWIZZLE=True,
                                                           USE_GDC=False, BLOCK_M=bm, BLOCK_K=bk, num_warps=nw,
                                                           launch_pdl=False, enable_fp_fusion=False)
            _same(got, rec[-1])
        assert run_calls.count("quantize_nvfp4_kernel") == 3  # the first quantizer call and the two references


def test_prebound_launch_rejects_bad_setup():
    t = _problem(3)
    with pytest.raises(TypeError, match="plain @triton.jit"):
        PreboundLaunch(object(), (1,), _fixed(t, 3), (0, 1, 2, 3), {})
    with pytest.raises(TypeError, match="grid"):
        PreboundLaunch(K, [1, 1], _fixed(t, 3), (0, 1, 2, 3), {})
    with pytest.raises(ValueError, match="fixed argument 1 is a tensor"):
        PreboundLaunch(K, (1,), (None, t[1], None, None, 3, 256, 256, 128), (0, 2, 3), {})
    with pytest.raises(ValueError, match="varying"):
        PreboundLaunch(K, (1,), _fixed(t, 3), (0, 0), {})


def test_bound_quantizer_launches_as_the_general_quantizer(monkeypatch, run_calls):
    """``bind_quantize_nvfp4`` (what a bound sm100 launcher calls per step): the same driver records as
    ``quantize_nvfp4_triton`` of the same tensors, and any other call shape / scale tensor goes to it."""
    monkeypatch.setattr(tq, "check_device", lambda kernel, *t, op: t[0].device)  # CPU tensors on the stand-in GPU
    tq.quantize_launch.cache_clear()
    m, k = 3, 512
    ins = torch.tensor(0.5)
    dev = torch.device("cpu")
    with triton_recording_driver() as rec:
        quantize = tq.bind_quantize_nvfp4(m, k, torch.bfloat16, dev, ins, pdl=False)
        for _ in range(3):
            x = _problem(m, k)[0]
            packed, scales = quantize(x, ins, True)
            got = rec[-1]  # its launch wrote the returned buffers: the reference writes the same ones
            n_run = len(run_calls)
            tq.quantize_nvfp4_triton(x, ins, True, pdl=False, out=(packed, scales))
            assert len(run_calls) == n_run  # the general path hit the same problem's pre-bound launch
            _same(got, rec[-1])
        assert run_calls.count("quantize_nvfp4_kernel") == 1
        assert scales.dtype == torch.float8_e4m3fn and tuple(packed.shape) == (m, k // 2)
        # another shape, dtype, layout or scale tensor: the general quantizer (checks, its own problem)
        for what, args in [("M", (_problem(2, k)[0], ins)), ("dtype", (_problem(m, k, torch.float16)[0], ins)),
                           ("scale tensor", (x, torch.tensor(0.5))), ("strides", (_problem(m, 2 * k)[0][:, :k], ins))]:
            n = len(rec)
            quantize(*args)
            tq.quantize_nvfp4_triton(*args, True, pdl=False)
            assert len(rec) == n + 2, what
            assert rec[-2][0] == rec[-1][0] and rec[-2][12][4:] == rec[-1][12][4:], what
    with pytest.raises(ValueError, match="K must be a multiple of 16"):
        tq.bind_quantize_nvfp4(m, 24, torch.bfloat16, dev, ins)(torch.zeros(m, 24, dtype=torch.bfloat16), ins)


def test_quick_key_agrees_with_triton_specialization():
    """The per-call tensor check (dtype, 16-byte aligned pointer) is sound against the installed Triton's
    ``specialize_impl``: two tensors it calls the same, Triton specializes the same, for every dtype the kernels
    take and each byte offset in 0..32 (a quick mismatch only costs a call of ``specialize_impl``). For a
    parameter specialized on alignment (every nvgemm kernel's) it separates exactly what Triton separates."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl

    from nvgemm.templates.triton.prebound import _quick_key

    base = torch.empty(256, dtype=torch.uint8)
    tensors = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.uint8, torch.float8_e4m3fn, torch.int32):
        size = torch.empty((), dtype=dtype).element_size()
        for off in range(0, 33, size):
            tensors.append(base[off:off + 8 * size].view(dtype))
    for flags in [(False, True, True), (False, True, False), (False, False, True), (True, True, True)]:
        specs = [native_specialize_impl(CUDABackend, t, *flags) for t in tensors]
        keys = [_quick_key(t, s) for t, s in zip(tensors, specs)]
        assert all(k is not None for k in keys)
        for i in range(len(tensors)):
            for j in range(len(tensors)):
                if keys[i] == keys[j]:
                    assert specs[i] == specs[j], (flags, keys[i], specs[i], specs[j])
                elif flags[2]:
                    assert specs[i] != specs[j], (flags, keys[i], keys[j], specs[i])


@pytest.mark.parametrize("requant", [False, True], ids=["linear", "requant"])
def test_sm100_bound_launchers_bind_their_quantizer(requant):
    """The bound sm100 launcher gets its quantizer from ``bind_quantize_nvfp4_cuda`` once, at bind time, for the
    layer's call shape and its device-resident input_scale, and calls that one per step (the unbound path calls
    ``quantize_nvfp4_cuda``)."""
    from nvgemm.core.formats import quantize_weight, to_blocked
    from nvgemm.templates.sm100_w4a4 import backend as sb
    from nvgemm.testing import host_path_stand_in

    g = torch.Generator().manual_seed(0)
    q = quantize_weight(torch.randn(256, 512, generator=g))
    w, s, ws2, ins = q.packed, to_blocked(q.scale), q.global_scale.reshape(()).float(), torch.tensor(0.01)
    x = torch.randn(2, 512).to(torch.bfloat16)
    binds, bound_calls = [], []
    with host_path_stand_in("sm100") as rec:
        stand_in = sb.quantize_nvfp4_cuda  # the harness's recording quantizer

        def bind(m, k, dtype, device, input_scale):
            binds.append((m, k, dtype, device, input_scale))

            def quantize(x2, scale, swizzle=True):
                bound_calls.append(scale is input_scale)
                return stand_in(x2, scale, swizzle)
            return quantize

        sb.bind_quantize_nvfp4_cuda = bind  # restored by the harness on exit
        if requant:
            nxt = torch.tensor(0.02)
            call = lambda: torch.ops.nvgemm.nvfp4_linear_requant(x, w, s, ws2, ins, None, nxt, None)
        else:
            call = lambda: torch.ops.nvgemm.nvfp4_linear(x, w, s, ws2, ins, None, None, "none", None)
        for _ in range(4):
            call()
    assert rec.events.count("quantize") == 4
    assert len(binds) == 1 and binds[0][:4] == (2, 512, torch.bfloat16, torch.device("cpu"))
    assert binds[0][4].dtype == torch.float32 and float(binds[0][4]) == pytest.approx(0.01)
    assert bound_calls and all(bound_calls) and len(bound_calls) >= 2
