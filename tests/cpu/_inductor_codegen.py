"""Inductor CUDA code for a whole module on a fake sm_100 / sm_90 device (no GPU), and the kernels it launches.

The module is traced with its buffers and parameters as inputs on fake CUDA tensors, Inductor's post-grad
passes run (nvgemm's capture pass among them when nvgemm is enabled), and only ``GraphLowering.codegen()`` is
called: nothing is compiled or launched. Device queries are answered as the named part (the trick of
``test_inductor_pdl.py``, for either arch).
"""

from __future__ import annotations

import contextlib
import re
import types
import unittest.mock as um

import torch
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

#: (name, SM count) per compute-capability major
PARTS = {10: ("NVIDIA B200 (codegen only)", 148), 9: ("NVIDIA H200 (codegen only)", 132)}


@contextlib.contextmanager
def fake_cuda_device(major: int):
    from torch._inductor.runtime.hints import DeviceProperties

    name, sms = PARTS[major]
    props = types.SimpleNamespace(
        name=name, total_memory=1 << 37, major=major, minor=0, multi_processor_count=sms, L2_cache_size=1 << 26,
        warp_size=32, max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536, gcnArchName="",
    )
    dev_props = DeviceProperties(type="cuda", index=0, multi_processor_count=sms, cc=major * 10, major=major,
                                 regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, warp_size=32)
    with contextlib.ExitStack() as st:
        st.enter_context(um.patch.object(DeviceProperties, "create", staticmethod(lambda device: dev_props)))
        for target, value in (
            ("torch.cuda.get_device_capability", lambda *a, **k: (major, 0)),
            ("torch.cuda.is_available", lambda: True),
            ("torch.cuda.current_device", lambda: 0),
            ("torch.cuda.device_count", lambda: 1),
            ("torch.cuda.get_device_properties", lambda *a, **k: props),
            ("torch.utils._triton.triton_hash_with_backend", lambda: "codegen-only"),
            ("torch._dynamo.device_interface.CudaInterface.Worker.get_device_properties", lambda *a, **k: props),
        ):
            st.enter_context(um.patch(target, value))
        st.enter_context(um.patch("torch._inductor.scheduler.has_triton", lambda *a, **k: True))
        yield


def _fake_inputs(model, example_inputs):
    """Fake CUDA copies of ``example_inputs`` and of the model's state, and the state names."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    state = {**dict(model.named_buffers()), **dict(model.named_parameters())}
    with FakeTensorMode(allow_non_fake_inputs=True):
        ins = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in example_inputs]
        st = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in state.values()]
    return ins, st, list(state)


def codegen_module(model, example_inputs, major: int) -> str:
    """The generated wrapper + kernel source of ``model(*example_inputs)`` on a fake sm_<major>0 device."""
    from torch._inductor.debug import DebugContext
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.fx_passes.post_grad import post_grad_passes
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    ins, st, names = _fake_inputs(model, example_inputs)
    n_in = len(ins)

    def f(*flat):
        return functional_call(model, dict(zip(names, flat[n_in:])), tuple(flat[:n_in]))

    with fake_cuda_device(major):
        gm = make_fx(f, decomposition_table=select_decomp_table(), tracing_mode="fake")(*ins, *st)
        gm.graph._codegen = torch.fx.graph.CodeGen()  # flat outputs for GraphLowering
        gm.recompile()
        flat = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        fm = flat[0].fake_mode
        with V.set_fake_mode(fm):
            post_grad_passes(gm, is_inference=True)
        with V.set_fake_mode(fm), DebugContext():
            g = GraphLowering(gm, example_inputs=flat)
            with V.set_graph_handler(g):
                g.run(*flat)
                code = g.codegen()
    code = code[0] if isinstance(code, tuple) else code
    return code.value if hasattr(code, "value") else str(code)


def split_args(text: str) -> list[str]:
    """The top-level comma-separated arguments of a call's argument text (nested calls kept whole)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def launches(code: str) -> list[str]:
    """The device launches of the generated ``call`` in order: ``triton:<kernel>``, ``extern:<aten kernel>``,
    ``nvgemm:<op>`` (with ``@<backend>`` for the autotuned choice op) and the nvgemm op's call text after ``|``."""
    body = code[code.index("def call(self, args)"):]
    out = []
    for line in body.splitlines():
        s = line.strip()
        if s.startswith("return ("):
            break
        if s.startswith("#") or "assert_" in s:
            continue
        m = re.match(r"(\w+)\.run\(", s)
        if m:
            out.append(f"triton:{m.group(1)}")
            continue
        m = re.search(r"torch\.ops\.nvgemm\.(\w+)\.default\((.*)\)$", s)
        if m:
            ch = re.search(r"'backend:(\w+)", m.group(2))
            out.append(f"nvgemm:{m.group(1)}{'@' + ch.group(1) if ch else ''}|{m.group(2)}")
            continue
        m = re.search(r"extern_kernels\.(\w+)\(", s)
        if m:
            out.append(f"extern:{m.group(1)}")
    return out
