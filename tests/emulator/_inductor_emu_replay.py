"""Inductor's generated code for a tiny decoder MLP layer, generated for a fake GPU
(:func:`nvgemm.integrations.inductor.codegen.generate_cuda_code`, as ``nvgemm bench decode-step`` does) and
replayed on CPU tensors with every launch on the PTX emulator:

* Inductor's own Triton kernels (the RMSNorm, the residual add) are compiled from the generated source for the
  GPU's arch and run from their PTX (:class:`~nvgemm.emulator.triton_ptx.EmuTritonKernel`) with the launch
  options the generated code sets (``launch_pdl``, ``enable_fp_fusion``); the tile is the first legal config of
  the generated heuristics (nothing can be autotuned without a GPU): ``XBLOCK`` = the next power of two of
  ``xnumel`` up to 1024 for a pointwise kernel, 1 for a persistent reduction, 4 warps;
* the ``nvgemm::`` ops the wrapper calls run through the dispatch with the emulator backends forced
  (``NVGEMM_BACKEND=emu_sm100`` / ``emu_sm90``): their host launchers, the Triton quantizers from PTX and the
  AOT GEMM artifacts relinked against the fake CUDA runtime.

Inside :func:`nvgemm.emulator.stream.capture` the same replay records the launches instead, in the wrapper's
launch order with their PDL attributes, for :func:`~nvgemm.emulator.stream.run_captured`; with ``segment=`` the
replay captures them itself and hands each run of launches between two host steps to ``segment``.

Host steps: every ``torch.ops.aten`` call and ``extern_kernels`` call of the wrapper (a whole decoder layer has
one: the attention, ``aten._scaled_dot_product_flash_attention``) runs on the host in stream order, on the CPU
tensors. Their device code (cuDNN / flash-attention binaries) has no PTX to emulate. The flash-attention call runs
as ``aten._scaled_dot_product_flash_attention_for_cpu`` (what SDPA runs on a CPU tensor), its output laid out as the
CUDA op lays it out. A host step is a launch boundary: the launches captured before it run (complete) first, and
no launch after it overlaps one before it (on a GPU the attention kernel is launched without the PDL attribute and
never triggers its dependents early, so its dependent starts when it completed).
"""

from __future__ import annotations

import contextlib
import time
import unittest.mock as um
import warnings

import torch
from torch import nn

HIDDEN, INTER = 256, 128


class MlpLayer(nn.Module):
    """The MLP half of a pre-norm decoder layer: ``x + down(silu(gate(n)) * up(n))``, ``n = RMSNorm(x)``, with
    gate/up fused as the loader fuses them."""

    def __init__(self, weight_only: bool, seed: int = 0):
        super().__init__()
        # lazy: the decode-step tool's modules (the RMSNorm and MLP it compiles)
        from nvgemm.cli import decode_step as ds
        from nvgemm.nn.linear import NVFP4Linear
        from nvgemm.nn.mlp import fuse_gated_mlps

        g = torch.Generator().manual_seed(seed)
        p = ds.DecodePreset("tiny-mlp", HIDDEN, INTER, 2, 1, 128, 1024, 1, "test")

        def lin(k, n):
            w = nn.Linear(k, n, bias=False)
            with torch.no_grad():
                w.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
            return NVFP4Linear.from_linear(w, None if weight_only else 0.002)

        self.post_attention_layernorm = ds.RMSNorm(p.hidden, p.eps)
        with torch.no_grad():
            self.post_attention_layernorm.weight.copy_((1 + 0.1 * torch.randn(HIDDEN, generator=g)).bfloat16())
        self.mlp = ds.GatedMLP(p, 1, lin)
        fuse_gated_mlps(self)

    def forward(self, x):
        return x + self.mlp(self.post_attention_layernorm(x))


def _named(module):
    return {k: v for k, v in list(module.named_parameters()) + list(module.named_buffers()) if v is not None}


def build(gpu: str, seed: int = 0):
    """(generated code, real CPU inputs in the wrapper's order) for the layer on fake ``gpu``."""
    import copy

    from torch._subclasses.fake_tensor import FakeTensorMode

    from nvgemm.cli import decode_step as ds
    from nvgemm.integrations.inductor.codegen import generate_cuda_code, policy_pick_only
    from nvgemm.nn.linear import NVFP4Linear

    hopper = gpu in ("H100", "H200")
    layer = MlpLayer(weight_only=hopper, seed=seed)
    if hopper:  # the loader's layout on an sm_90 GPU (the layers held in the sm90 kernels' layout only)
        for mod in layer.modules():
            if isinstance(mod, NVFP4Linear):
                mod.prepare_for_sm90("bf16")
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(1, HIDDEN, generator=g).bfloat16()
    real = [x] + list(_named(layer).values())
    fm = FakeTensorMode()
    meta = copy.deepcopy(layer).to("meta")
    fn, inputs = ds._fake_inputs(meta, fm, [((1, HIDDEN), torch.bfloat16)])
    with warnings.catch_warnings(), ds.nvgemm_enabled(), policy_pick_only():
        warnings.simplefilter("ignore")
        code = generate_cuda_code(fn, inputs, gpu=gpu)
    return code, real


#: the tiny decoder layer (hidden, intermediate, heads, KV heads, head dim, static KV cache length, position)
LAYER_DIMS = dict(hidden=256, intermediate=128, heads=2, kv_heads=1, head_dim=128, context=16, pos=5)


def decoder_layer(weight_only: bool, seed: int = 0):
    """A whole pre-norm decoder layer (the decode-step tool's ``DecoderLayer``: RMSNorm, fused qkv, RoPE, static
    KV-cache write, flash attention, o_proj + residual, RMSNorm, fused gate/up with SiLU-mul, down + residual) with
    random NVFP4 weights (ModelOpt recipe; W4A4 input scale 0.002 where ``not weight_only``) on the CPU."""
    from nvgemm.cli import decode_step as ds
    from nvgemm.nn.linear import NVFP4Linear
    from nvgemm.nn.mlp import fuse_gated_mlps

    d = LAYER_DIMS
    p = ds.DecodePreset("tiny-layer", d["hidden"], d["intermediate"], d["heads"], d["kv_heads"], d["head_dim"], 1024,
                        1, "test", context=d["context"])
    g = torch.Generator().manual_seed(seed)
    layer = ds.DecoderLayer(p, 1, weight_only=weight_only, layout="checkpoint", device="cpu")
    for name, mod in list(layer.named_modules()):
        if isinstance(mod, NVFP4Linear):
            w = nn.Linear(mod.in_features, mod.out_features, bias=False)
            with torch.no_grad():
                w.weight.copy_(torch.randn(mod.out_features, mod.in_features, generator=g) * 0.05)
            parent, _, child = name.rpartition(".")
            setattr(layer.get_submodule(parent), child, NVFP4Linear.from_linear(w, None if weight_only else 0.002))
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.copy_((1 + 0.1 * torch.randn(d["hidden"], generator=g)).bfloat16())
    a = layer.self_attn
    a.qkv_proj = NVFP4Linear.fuse([a.q_proj, a.k_proj, a.v_proj])  # the loader's fused layout
    del a.q_proj, a.k_proj, a.v_proj
    fuse_gated_mlps(layer)
    return layer


def decoder_layer_inputs(seed: int = 1):
    """(x, k_cache, v_cache, pos, cos, sin) of one decode step: a random token, caches holding random earlier
    tokens, this token's slot ``pos``, the RoPE angles in the form the layer reads them: the rotary tables
    [positions, head_dim] it indexes at ``pos`` where the decode-step tool has them (``rope_tables``), else this
    token's row [1, 1, 1, head_dim]."""
    from nvgemm.cli import decode_step as ds

    d = LAYER_DIMS
    g = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    x = torch.randn(1, d["hidden"], generator=g).to(bf)
    cache = (1, d["kv_heads"], d["context"], d["head_dim"])
    kc, vc = torch.randn(cache, generator=g).to(bf), torch.randn(cache, generator=g).to(bf)
    if hasattr(ds, "rope_tables"):
        cos, sin = ds.rope_tables(d["context"], d["head_dim"])
    else:
        half = d["head_dim"] // 2
        freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
        ang = torch.cat([freq, freq]) * d["pos"]
        cos, sin = ang.cos().reshape(1, 1, 1, -1).to(bf), ang.sin().reshape(1, 1, 1, -1).to(bf)
    return [x, kc, vc, torch.tensor([d["pos"]]), cos, sin]


def build_decoder_layer(gpu: str, seed: int = 0):
    """(generated code, real CPU inputs in the wrapper's order, the CPU module) of the whole decoder layer on fake
    ``gpu``, generated as ``nvgemm bench decode-step`` generates a layer (``layer_graph``)."""
    import copy

    from nvgemm.cli import decode_step as ds
    from nvgemm.integrations.inductor.codegen import generate_cuda_code, policy_pick_only
    from nvgemm.nn.linear import NVFP4Linear

    hopper = gpu in ("H100", "H200")
    layer = decoder_layer(weight_only=hopper, seed=seed)
    if hopper:
        for mod in layer.modules():
            if isinstance(mod, NVFP4Linear):
                mod.prepare_for_sm90("bf16")
    step = decoder_layer_inputs(seed + 1)
    fm = ds._fake_mode()
    meta = copy.deepcopy(layer).to("meta")
    fn, inputs = ds._fake_inputs(meta, fm, [(tuple(t.shape), t.dtype) for t in step])
    with warnings.catch_warnings(), ds.nvgemm_enabled(), policy_pick_only():
        warnings.simplefilter("ignore")
        code = generate_cuda_code(fn, inputs, gpu=gpu)
    return code, step + list(_named(layer).values()), layer


def host_flash_attention(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """``aten._scaled_dot_product_flash_attention`` on CPU tensors: the CPU flash attention
    (``_scaled_dot_product_flash_attention_for_cpu``), the output in the CUDA op's layout ([B, L, H, D] memory
    viewed [B, H, L, D]) and the log-sum-exp; the rest (sequence offsets, RNG state, debug mask) empty."""
    if dropout_p or return_debug_mask:
        raise NotImplementedError("host flash attention: dropout / the debug mask are not modelled")
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, scale=scale)
    b, h, lq, dv = out.shape
    laid = torch.empty(b, lq, h, dv, dtype=out.dtype).permute(0, 2, 1, 3)
    laid.copy_(out)
    none = torch.empty(0)
    return laid, lse, none, none, lq, k.shape[2], none, none, none


class HostAttention:
    """Inside: a CPU call of ``aten._scaled_dot_product_flash_attention`` (the decode-step tool's attention, which
    has no CPU kernel) runs :func:`host_flash_attention` (for the layer's eager CPU forward)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        flash = torch.ops.aten._scaled_dot_product_flash_attention.default

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is flash:
                    return host_flash_attention(*args, **(kwargs or {}))
                return func(*args, **(kwargs or {}))

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


#: host steps with a stand-in for the CUDA op (anything else runs as the aten op on the CPU tensors)
HOST_STEPS = {"_scaled_dot_product_flash_attention": host_flash_attention}


class InductorKernel:
    """One ``async_compile.triton(name, source)`` of the generated code, launched on the emulator."""

    def __init__(self, name: str, src: str, arch: str):
        from torch._inductor.runtime import triton_helpers, triton_heuristics

        from nvgemm.emulator.triton_ptx import EmuTritonKernel

        self.name, self.meta = name, {}

        def deco(kind):
            def outer(*a, **k):
                self.meta.update(k, kind=kind)
                return lambda fn: fn
            return outer

        import hashlib
        import importlib.util
        import tempfile
        from pathlib import Path

        # @triton.jit needs its source in a file (as Inductor's own code cache writes it)
        d = Path(tempfile.gettempdir()) / f"nvgemm_emu_inductor_{hashlib.sha256(src.encode()).hexdigest()[:16]}"
        d.mkdir(exist_ok=True)
        path = d / f"{name}.py"
        path.write_text(src)
        with um.patch.multiple(triton_heuristics, pointwise=deco("pointwise"), reduction=deco("reduction"),
                               persistent_reduction=deco("persistent_reduction")), \
                um.patch.object(triton_helpers, "set_driver_to_gpu", lambda: None):  # no GPU driver here
            spec = importlib.util.spec_from_file_location(f"nvgemm_emu_inductor_{name}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        self.fn = getattr(mod, name)
        self.kernel = EmuTritonKernel(self.fn, arch)

    def run(self, *args, stream=None, **kw):
        kind = self.meta["kind"]
        tm = self.meta["triton_meta"]
        sig = [n for n in tm["signature"] if tm["signature"][n] != "constexpr" or n in tm.get("constants", {})]
        numels = dict(zip(sig, args))
        xnumel = int(numels.get("xnumel", tm.get("constants", {}).get("xnumel", 1)))
        if kind == "pointwise":
            xblock = min(1024, 1 << max(0, (xnumel - 1).bit_length()))
        elif kind == "persistent_reduction":
            xblock = 1
        else:
            raise NotImplementedError(f"{self.name}: a {kind} kernel (looped reduction) has no launch rule here")
        grid = (-(-xnumel // xblock), 1, 1)
        self.kernel[grid](*args, XBLOCK=xblock, num_warps=4, launch_pdl=bool(tm.get("launch_pdl")),
                          enable_fp_fusion=bool(tm.get("enable_fp_fusion", True)))


class _HostOps:
    """``torch.ops`` for the replayed wrapper: ``aten`` calls are host steps (:data:`HOST_STEPS`), run by
    ``step(name, fn, args, kwargs)``; every other namespace (``nvgemm``, ``inductor``) is torch's."""

    def __init__(self, step, log):
        self._step, self._log = step, log

    def __getattr__(self, ns):
        real = getattr(torch.ops, ns)
        if ns == "nvgemm":
            return _NvgemmOps(real, self._log)
        if ns != "aten":
            return real
        step = self._step

        class Op:
            def __init__(self, name):
                self.name = name

            def __getattr__(self, overload):
                fn = HOST_STEPS.get(self.name) or getattr(getattr(real, self.name), overload)

                return lambda *a, **k: step(f"aten.{self.name}", fn, a, k)

            def __call__(self, *a, **k):
                return self.default(*a, **k)

        class Ns:
            def __getattr__(self, name):
                return Op(name)

        return Ns()


class _NvgemmOps:
    """``torch.ops.nvgemm`` for the replayed wrapper. ``nvfp4_linear_choice`` names the kernel backend of the fake
    GPU (``cutedsl_sm100``), which cannot take CPU tensors: the call runs the op itself, as the other choice ops
    do for a call their backend refuses (``nvfp4_linear_prequant_choice``, ``..._sm90_prepared_choice``), i.e. on the
    forced emulator backend, which runs the same kernel config (the policy's first pick, as the choice names;
    the tests compare the names). ``log``: gets ``("op", name, kernels)`` after each call (``kernels``: the
    emulated launches it made, counted where the log has them: launch by launch)."""

    def __init__(self, real, log):
        self._real, self._log = real, log

    def __getattr__(self, op):
        log = self._log
        if op == "nvfp4_linear_choice":
            linear = self._real.nvfp4_linear.default

            def fn(*a):
                return linear(*a[:-1])
        else:
            fn = getattr(self._real, op).default

        def run(*a, **k):
            if log is None:
                return fn(*a, **k)
            n = len(log)
            out = fn(*a, **k)
            log.append(("op", op, sum(e[0] == "kernel" for e in log[n:])))
            return out

        class Op:
            default = staticmethod(run)

            def __call__(self, *a, **k):
                return run(*a, **k)

        return Op()


class _Externs:
    """``extern_kernels`` for the replayed wrapper: each a host step (the aten op on the CPU tensors)."""

    def __init__(self, step):
        self._step = step

    def __getattr__(self, name):
        from torch._inductor.select_algorithm import extern_kernels

        fn = getattr(extern_kernels, name)

        return lambda *a, **k: self._step(f"extern_kernels.{name}", fn, a, k)


class _Stop(Exception):
    def __init__(self, grids):
        self.grids = grids


def replay(code: str, inputs: list, arch: str, segment=None, log: "list | None" = None):
    """Run the generated ``call`` on ``inputs`` (CPU tensors), every launch on the emulator; its outputs.

    ``segment=None``: each launch runs when the wrapper makes it (launch by launch: the compiled step on the
    emulated backend). ``segment(grids)``: the launches are captured (:func:`~nvgemm.emulator.stream.capture`);
    at each host step and at the end the launches captured since the last one (a non-empty list of
    :class:`~nvgemm.emulator.ptx.pdl.StreamGrid`) are handed to ``segment``, which runs them (a PDL stream);
    then the host step runs. ``log``: gets ``("host", name, seconds)`` per host step and, launch by launch,
    ``("kernel", name, seconds)`` per emulated launch, in order."""
    from torch._inductor import async_compile as ac

    from nvgemm.emulator import runner, stream, triton_ptx

    backend = "emu_sm100" if arch == "sm_100a" else "emu_sm90"
    ns: dict = {"__name__": "nvgemm_emulated_replay"}
    with um.patch.object(ac.AsyncCompile, "triton", lambda self, name, src, *a, **k: InductorKernel(name, src, arch)), \
            um.patch.object(ac.AsyncCompile, "wait", lambda self, scope: None), \
            um.patch.object(ac.AsyncCompile, "__init__", lambda self: None):
        exec(compile(code, "<generated layer>", "exec"), ns)

    def noop(*a, **k):
        return None

    from nvgemm.cli.decode_step import _TorchProxy

    def empty_strided(size, stride, dtype=torch.float32, *a, **k):
        return torch.empty_strided(size, stride, dtype=dtype)

    def reinterpret(t, size, stride, offset=0):
        return t.as_strided(size, stride, t.storage_offset() + offset)

    def flush():
        grids = stream.capturing()
        if grids:  # the launches since the last host step, in launch order
            run, grids[:] = list(grids), []
            segment(run)

    def host_step(name, fn, args, kwargs):
        if segment is not None:
            flush()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if log is not None:
            log.append(("host", name, time.perf_counter() - t0))
        return out

    ops = _HostOps(host_step, log)
    # torch for the wrapper: the real ops (CPU tensors), torch.cuda's device guard a no-op
    ns.update(torch=_TorchProxy(ops), aten=ops.aten, extern_kernels=_Externs(host_step),
              empty_strided_cuda=empty_strided, reinterpret_tensor=reinterpret,
              assert_size_stride=noop, assert_alignment=noop, assert_tensor_metadata=noop,
              assert_size_stride_grouped=noop, get_raw_stream=lambda i: 0)
    env = {"NVGEMM_BACKEND": backend, "NVGEMM_SELFCHECK": "0"}
    with contextlib.ExitStack() as st:
        st.enter_context(um.patch.dict("os.environ", env))
        st.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        if log is not None and segment is None:  # per-launch run times
            def timed(fn, name_of):
                def run(self_or_launch, *a, **k):
                    t0 = time.perf_counter()
                    out = fn(self_or_launch, *a, **k)
                    log.append(("kernel", name_of(self_or_launch), time.perf_counter() - t0))
                    return out
                return run
            st.enter_context(um.patch.object(triton_ptx, "run_launch",
                                             timed(triton_ptx.run_launch, lambda ln: ln.program.entry.name)))
            st.enter_context(um.patch.object(runner.EmuKernel, "launch",
                                             timed(runner.EmuKernel.launch, lambda k: k.spec.name())))
        if segment is None:
            return ns["call"](list(inputs))
        st.enter_context(stream.capture())
        out = ns["call"](list(inputs))
        flush()
        return out


def captured_segments(code: str, inputs: list, arch: str, run_segment, stop_at: "int | None" = None):
    """Replay with each segment (the launches between host steps) run by ``run_segment(index, grids)``.
    ``stop_at``: stop at that segment, unrun, and return its grids (the launches before it ran, so its inputs hold
    their values); else return the outputs."""
    count = [0]

    def segment(grids):
        i = count[0]
        count[0] += 1
        if i == stop_at:
            raise _Stop(grids)
        run_segment(i, grids)

    try:
        return replay(code, inputs, arch, segment)
    except _Stop as e:
        return e.grids


__all__ = ["HOST_STEPS", "HostAttention", "LAYER_DIMS", "MlpLayer", "build", "build_decoder_layer", "captured_segments",
           "decoder_layer", "decoder_layer_inputs", "host_flash_attention", "replay"]
