"""PDL chain into the Triton consumer of an nvgemm GEMM, checked in Inductor-generated CUDA code.

This machine has no GPU, but Inductor's CUDA *code generation* runs without one: the graph is
lowered with FakeTensors on ``cuda`` and only ``GraphLowering.codegen()`` is called (nothing is
compiled or launched). The few device queries codegen makes are answered as an sm_100 part
(``_fake_cuda_device``). The generated wrapper + Triton source is then inspected:

* the Triton kernel that reads an nvgemm kernel-backend GEMM's output gets
  ``tl.extra.cuda.gdc_wait()`` and ``'launch_pdl': True``;
* an unrelated Triton kernel in the same graph does not, nor does the consumer of the emulated
  reference, nor anything once nvgemm is disabled.
"""

from __future__ import annotations

import contextlib
import re
import types
import unittest.mock as um

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import nvgemm.integrations.inductor as ni
from nvgemm.integrations.inductor import compat
from nvgemm.core.formats import blocked_shape

N, K = 256, 128


@contextlib.contextmanager
def _fake_cuda_device():
    props = types.SimpleNamespace(
        name="NVIDIA B200 (codegen only)", total_memory=1 << 37, major=10, minor=0, multi_processor_count=148,
        L2_cache_size=1 << 26, warp_size=32, max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
        gcnArchName="",
    )
    from torch._inductor.runtime.hints import DeviceProperties

    dev_props = DeviceProperties(
        type="cuda", index=0, multi_processor_count=148, cc=100, major=10, regs_per_multiprocessor=65536,
        max_threads_per_multi_processor=2048, warp_size=32,
    )
    with contextlib.ExitStack() as st:
        st.enter_context(um.patch.object(DeviceProperties, "create", staticmethod(lambda device: dev_props)))
        for target, value in (
            ("torch.cuda.get_device_capability", lambda *a, **k: (10, 0)),
            ("torch.cuda.is_available", lambda: True),
            ("torch.cuda.current_device", lambda: 0),
            ("torch.cuda.device_count", lambda: 1),
            ("torch.cuda.get_device_properties", lambda *a, **k: props),
            ("torch.utils._triton.triton_hash_with_backend", lambda: "codegen-only"),
            ("torch._dynamo.device_interface.CudaInterface.Worker.get_device_properties", lambda *a, **k: props),
        ):
            st.enter_context(um.patch(target, value))
        # has_triton() is cached process-wide (False on this machine); answer it for this
        # context only (the scheduler imported the name).
        st.enter_context(um.patch("torch._inductor.scheduler.has_triton", lambda *a, **k: True))
        yield


def _codegen_cuda(fn, example_shapes) -> str:
    """Generated wrapper+kernel source for ``fn`` traced on fake CUDA tensors (no GPU needed)."""
    from torch._inductor.debug import DebugContext
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    fm = FakeTensorMode()
    with fm:
        args = [torch.empty(s, dtype=d, device="cuda") for s, d in example_shapes]
    from torch._inductor.decomposition import select_decomp_table

    gm = make_fx(fn, decomposition_table=select_decomp_table())(*args)
    with _fake_cuda_device(), V.set_fake_mode(fm), DebugContext():
        g = GraphLowering(gm, example_inputs=args)
        with V.set_graph_handler(g):
            g.run(*args)
            code = g.codegen()
    code = code[0] if isinstance(code, tuple) else code
    return code.value if hasattr(code, "value") else str(code)


def _shapes(m=4):
    return [
        ((m, K), torch.bfloat16),
        ((N, K // 2), torch.uint8),
        (blocked_shape(N, K // 16), torch.float8_e4m3fn),
        ((), torch.float32),
        ((), torch.float32),
        ((m, 64), torch.float32),
    ]


def _graph(choice: str):
    def f(x, w, ws, ws2, ins, other):
        y = torch.ops.nvgemm.nvfp4_linear_choice(x, w, ws, ws2, ins, None, None, "none", None, choice)
        consumer = torch.relu(y.float()) * 2.0  # reads the GEMM output: the PDL consumer
        unrelated = torch.sin(other) + 1.0  # reads only a graph input
        return consumer, unrelated

    return f


def _kernels(code: str) -> dict[str, str]:
    """Triton kernel name -> its source (the async_compile.triton(...) blocks)."""
    out = {}
    for m in re.finditer(r"(\w+) = async_compile\.triton\('(\w+)', '''(.*?)'''", code, re.S):
        out[m.group(1)] = m.group(3)
    return out


def _consumer_and_other(code: str):
    ks = _kernels(code)
    cons = [src for src in ks.values() if "relu" in src or "maximum" in src]
    other = [src for src in ks.values() if "sin" in src]
    assert len(cons) == 1 and len(other) == 1, list(ks)
    return cons[0], other[0]


needs_pdl_hook = pytest.mark.skipif(
    not compat.available("pdl_hook"),
    reason=f"selective PDL into Triton consumers needs torch >= {compat.BY_NAME['pdl_hook'].since} "
    "(nvgemm.enable() warns and runs without it; tested in test_inductor_registration)",
)


@pytest.fixture
def nvgemm_on():
    ni.enable()
    yield
    ni.disable()


@needs_pdl_hook
def test_triton_consumer_of_nvgemm_gemm_uses_pdl(nvgemm_on):
    code = _codegen_cuda(_graph("backend:cutedsl_sm100"), _shapes())
    assert "nvgemm.nvfp4_linear_choice" in code
    cons, other = _consumer_and_other(code)
    assert "tl.extra.cuda.gdc_wait()" in cons
    assert "'launch_pdl': True" in cons
    assert "gdc_wait" not in other and "'launch_pdl': True" not in other
    assert "'launch_pdl': False" in other


def test_emulated_producer_gets_no_pdl(nvgemm_on):
    cons, other = _consumer_and_other(_codegen_cuda(_graph("backend:emulated"), _shapes()))
    for src in (cons, other):
        assert "gdc_wait" not in src and "'launch_pdl': True" not in src


def test_no_pdl_when_disabled_or_pdl_off():
    for ctx in (contextlib.nullcontext(), ni.enabled(pdl=False)):
        with ctx:
            cons, other = _consumer_and_other(_codegen_cuda(_graph("backend:cutedsl_sm100"), _shapes()))
        for src in (cons, other):
            assert "gdc_wait" not in src and "'launch_pdl': True" not in src
    from torch._inductor.scheduler import Scheduler

    assert "previous_node" not in Scheduler.__dict__  # the property is gone again
