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
launch order with their PDL attributes, for :func:`~nvgemm.emulator.stream.run_captured`.
"""

from __future__ import annotations

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


def replay(code: str, inputs: list, arch: str):
    """Run the generated ``call`` on ``inputs`` (CPU tensors), every launch on the emulator; its outputs."""
    from torch._inductor import async_compile as ac

    backend = "emu_sm100" if arch == "sm_100a" else "emu_sm90"
    ns: dict = {"__name__": "nvgemm_emulated_replay"}
    with um.patch.object(ac.AsyncCompile, "triton", lambda self, name, src, *a, **k: InductorKernel(name, src, arch)), \
            um.patch.object(ac.AsyncCompile, "wait", lambda self, scope: None), \
            um.patch.object(ac.AsyncCompile, "__init__", lambda self: None):
        exec(compile(code, "<generated layer>", "exec"), ns)

    def noop(*a, **k):
        return None

    from nvgemm.cli.decode_step import _TorchProxy

    # torch for the wrapper: the real ops (CPU tensors), torch.cuda's device guard a no-op
    def empty_strided(size, stride, dtype=torch.float32, *a, **k):
        return torch.empty_strided(size, stride, dtype=dtype)

    def reinterpret(t, size, stride, offset=0):
        return t.as_strided(size, stride, t.storage_offset() + offset)

    # torch for the wrapper: the real ops (CPU tensors), torch.cuda's device guard a no-op
    ns.update(torch=_TorchProxy(torch.ops), empty_strided_cuda=empty_strided, reinterpret_tensor=reinterpret,
              assert_size_stride=noop, assert_alignment=noop, assert_tensor_metadata=noop,
              assert_size_stride_grouped=noop, get_raw_stream=lambda i: 0)
    env = {"NVGEMM_BACKEND": backend, "NVGEMM_SELFCHECK": "0"}
    with um.patch.dict("os.environ", env), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ns["call"](list(inputs))


__all__ = ["MlpLayer", "build", "replay"]
