"""Inductor CUDA code for a whole module on a fake sm_100 / sm_90 device (no GPU), and the kernels it launches.

The module is traced with its buffers and parameters as inputs on fake CUDA tensors, Inductor's post-grad
passes run (nvgemm's capture pass among them when nvgemm is enabled), and only ``GraphLowering.codegen()`` is
called: nothing is compiled or launched. Device queries are answered as the named part (the trick of
``test_inductor_pdl.py``, for either arch).
"""

from __future__ import annotations

import contextlib
import re

import torch
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

@contextlib.contextmanager
def fake_cuda_device(major: int):
    """nvgemm's fake device for codegen: a B200 (major 10) or an H200 (major 9)."""
    from nvgemm.integrations.inductor.codegen import fake_cuda_device as _fake

    with _fake({10: "B200", 9: "H200"}[major]):
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
