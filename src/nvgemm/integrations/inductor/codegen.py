"""Inductor's CUDA code for a function, generated on a machine without a GPU (a *fake device*).

Inductor's CUDA *code generation* needs no GPU: the graph is traced with FakeTensors on ``cuda``,
run through the passes ``torch.compile`` runs (the joint-graph passes, then the post-grad passes
with ``config.post_grad_custom_pre_pass`` -- nvgemm's capture pass when :func:`nvgemm.enable` is
active), lowered, scheduled and printed by ``GraphLowering.codegen()``. Nothing is compiled or
launched. The few device queries codegen makes are answered for the named GPU
(:func:`fake_cuda_device`): capability, SM count, L2 size.

What differs from ``torch.compile`` on that GPU: Dynamo is skipped (the function is traced with
``make_fx`` and Inductor's decomposition table, as AOTAutograd does for inference, with
functionalization so in-place updates of inputs -- a KV cache write -- become the mutations Inductor
re-inplaces); autotuning cannot time anything, so every ``select_algorithm`` with more than one
choice would fail -- callers pass ``max_autotune_gemm_backends="ATEN"`` for Inductor's own GEMMs and
nvgemm's lowering is given the policy's first pick (:func:`policy_pick_only`). The kernels, their
fusion and their order are what the scheduler produces for that device.
"""

from __future__ import annotations

import contextlib
import types
import unittest.mock as um
from typing import Callable, Sequence

import torch

from nvgemm.core.backend import LINEAR
from nvgemm.integrations.inductor import choices as _choices, moe as _moe

#: (capability, SM count, L2 bytes, memory bytes) of the GPUs a fake device can stand for (the sm_120 / sm_121 /
#: sm_89 / sm_80 parts: the W4A16 ``mma`` kernel's targets, figures as in ``heuristics.perfmodel.hardware``).
FAKE_GPUS: dict[str, tuple[tuple[int, int], int, int, int]] = {
    "H100": ((9, 0), 132, 50 << 20, 80 << 30),
    "H200": ((9, 0), 132, 50 << 20, 141 << 30),
    "B200": ((10, 0), 148, 126 << 20, 180 << 30),
    "GB200": ((10, 0), 152, 126 << 20, 186 << 30),
    "B300": ((10, 3), 148, 126 << 20, 270 << 30),
    "RTX5090": ((12, 0), 170, 96 << 20, 32 << 30),
    "GB10": ((12, 1), 48, 24 << 20, 128 << 30),
    "L40S": ((8, 9), 142, 96 << 20, 48 << 30),
    "A100": ((8, 0), 108, 40 << 20, 80 << 30),
    "RTX5080": ((12, 0), 84, 64 << 20, 16 << 30),
    "RTXPRO6000": ((12, 0), 188, 128 << 20, 96 << 30),
    "RTX4090": ((8, 9), 128, 72 << 20, 24 << 30),
    "A10": ((8, 6), 72, 6 << 20, 24 << 30),
    "RTX3090": ((8, 6), 82, 6 << 20, 24 << 30),
}
#: Dynamic shared memory one block may opt into, per capability major.minor (CUDA C++ Programming Guide);
#: 227 KB where not listed (sm_90 / sm_100).
_SMEM_OPTIN = {(12, 0): 101376, (12, 1): 101376, (8, 9): 101376, (8, 6): 101376, (8, 0): 166912}


@contextlib.contextmanager
def fake_cuda_device(gpu: str = "B200"):
    """Answer Inductor's (and nvgemm's) device queries as GPU ``gpu`` of :data:`FAKE_GPUS`, no GPU needed."""
    if gpu not in FAKE_GPUS:
        raise KeyError(f"fake_cuda_device: unknown GPU {gpu!r}; known: {', '.join(FAKE_GPUS)}")
    (major, minor), sms, l2, mem = FAKE_GPUS[gpu]
    props = types.SimpleNamespace(
        name=f"NVIDIA {gpu} (codegen only)", total_memory=mem, major=major, minor=minor, multi_processor_count=sms,
        L2_cache_size=l2, warp_size=32, max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
        gcnArchName="", shared_memory_per_block_optin=_SMEM_OPTIN.get((major, minor), 232448),
    )
    from torch._inductor.runtime.hints import DeviceProperties

    dev_props = DeviceProperties(
        type="cuda", index=0, multi_processor_count=sms, cc=major * 10 + minor, major=major,
        regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, warp_size=32,
    )
    with contextlib.ExitStack() as st:
        st.enter_context(um.patch.object(DeviceProperties, "create", staticmethod(lambda device: dev_props)))
        for target, value in (
            ("torch.cuda.get_device_capability", lambda *a, **k: (major, minor)),
            ("torch.cuda.is_available", lambda: True),
            ("torch.cuda.current_device", lambda: 0),
            ("torch.cuda.device_count", lambda: 1),
            ("torch.cuda.get_device_properties", lambda *a, **k: props),
            ("torch.cuda.get_device_name", lambda *a, **k: props.name),
            ("torch.utils._triton.triton_hash_with_backend", lambda: "codegen-only"),
            ("torch._dynamo.device_interface.CudaInterface.Worker.get_device_properties", lambda *a, **k: props),
        ):
            st.enter_context(um.patch(target, value))
        # has_triton() is cached process-wide (False without a GPU); answer it for this context only
        # (the scheduler imported the name).
        st.enter_context(um.patch("torch._inductor.scheduler.has_triton", lambda *a, **k: True))
        # Inductor memoises the device it runs on (the system key of its on-disk caches): forget the fake one on
        # entry and exit, or later compiles in this process would key their autotune caches on it
        _forget_inductor_system()
        st.callback(_forget_inductor_system)
        yield props


def _forget_inductor_system() -> None:
    from torch._inductor.codecache import CacheBase

    CacheBase.get_system.cache_clear()


@contextlib.contextmanager
def policy_pick_only():
    """nvgemm's lowerings (``nvfp4_linear`` and ``nvfp4_moe``) see only the policy's first kernel candidate
    (plus nothing else): what a tuned graph inlines when that candidate wins, with no benchmark (there is no
    GPU to time on)."""
    orig, orig_prepared, orig_moe = _choices.candidates, _choices.prepared_candidates, _moe.moe_candidates

    def first_only(problem, allowed=None, kind=LINEAR):
        return orig(problem, allowed, kind)[:1]

    def first_prepared_only(problem, allowed=None):
        return orig_prepared(problem, allowed)[:1]

    def first_moe_only(problem, allowed=None):
        return orig_moe(problem, allowed)[:1]

    with um.patch.object(_choices, "candidates", first_only), \
            um.patch.object(_choices, "prepared_candidates", first_prepared_only), \
            um.patch.object(_moe, "moe_candidates", first_moe_only):
        yield


def generate_cuda_code(fn: Callable, example_inputs: Sequence[torch.Tensor], gpu: str = "B200",
                       config_patches: dict | None = None) -> str:
    """The wrapper + kernel source Inductor generates for ``fn(*example_inputs)`` on fake GPU ``gpu``.

    ``example_inputs`` are FakeTensors on ``cuda`` made under one ``FakeTensorMode`` (their
    ``fake_mode``); ``fn`` may update inputs in place (functionalized, then re-inplaced by Inductor)."""
    from torch._functorch.aot_autograd import aot_export_module  # noqa: F401  (import order: functorch first)
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import _recursive_joint_graph_passes, _recursive_post_grad_passes
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    fm = next((t.fake_mode for t in example_inputs if hasattr(t, "fake_mode")), None)
    if fm is None:
        raise ValueError("generate_cuda_code: example_inputs must be FakeTensors (made under a FakeTensorMode)")
    patches = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN", "triton.cudagraphs": False,
               "joint_graph_constant_folding": False}
    patches.update(config_patches or {})
    with fake_cuda_device(gpu), inductor_config.patch(patches), V.set_fake_mode(fm):
        with fm:
            # Python functionalization (AOTAutograd's): a custom op that mutates its inputs (the KV cache)
            # becomes auto_functionalized, re-inplaced by Inductor; input mutations are copied back at the end
            func = dispatch_functionalize(fn, FunctionalTensorMode(), propagate_input_mutations=True)
            gm = make_fx(func, decomposition_table=select_decomp_table())(*example_inputs)
        # the pattern tables are traced once on real tensors: on the CPU (they match any device)
        with fm:
            gm = _recursive_joint_graph_passes(gm, input_device=torch.device("cpu"))
            _recursive_post_grad_passes(gm, is_inference=True)
        with DebugContext():
            g = GraphLowering(gm, example_inputs=list(example_inputs), is_inference=True)
            with V.set_graph_handler(g):
                g.run(*example_inputs)
                code = g.codegen()
    code = code[0] if isinstance(code, tuple) else code
    return code.value if hasattr(code, "value") else str(code)


__all__ = ["FAKE_GPUS", "fake_cuda_device", "generate_cuda_code", "policy_pick_only"]
