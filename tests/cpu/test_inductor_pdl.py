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
import unittest.mock as um

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import nvgemm.integrations.inductor as ni
from nvgemm.integrations.inductor import compat
from nvgemm.core.formats import blocked_shape

N, K = 256, 128


@contextlib.contextmanager
def _fake_cuda_device(cc: tuple[int, int] = (10, 0)):
    """Answer the device queries of codegen as an sm_100 (B200) or sm_90 (H200) part (nvgemm's own fake device,
    which also forgets Inductor's memoised system on entry and exit)."""
    from nvgemm.integrations.inductor.codegen import fake_cuda_device

    with fake_cuda_device("B200" if cc[0] == 10 else "H200"):
        yield


def _codegen_cuda(fn, example_shapes, cc: tuple[int, int] = (10, 0), graph_pass=None) -> str:
    """Generated wrapper+kernel source for ``fn`` traced on fake CUDA tensors (no GPU needed); ``graph_pass``
    (e.g. nvgemm's capture pass) runs on the traced graph first, as Inductor's post-grad pre-pass would."""
    from torch._inductor.debug import DebugContext
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fm = FakeTensorMode(shape_env=ShapeEnv())  # autotuned lowerings trace their candidates symbolically
    with fm:
        args = [torch.empty(s, dtype=d, device="cuda") for s, d in example_shapes]

    with _fake_cuda_device(cc):
        gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
        if graph_pass is not None:
            graph_pass(gm.graph)
            gm.recompile()
    with _fake_cuda_device(cc), V.set_fake_mode(fm), DebugContext():
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


# --------------------------------------------------------------------------- a whole decode layer
# Every GEMM <-> Triton edge of a Llama decode layer, in the code Inductor generates for a fake H200 (W4A16,
# layers held in the sm90 layout as the ModelOpt loader leaves them on Hopper: nvfp4_linear_sm90_prepared) and
# a fake B200 (W4A4, the gated MLP rewritten to nvfp4_linear_requant -> nvfp4_linear_prequant). An edge is two
# kernels launched back to back on the stream where the second reads what the first wrote:
#
# * GEMM -> Triton: the Triton kernel launches with PDL ('launch_pdl': True) and its gdc_wait comes before its
#   first load of the GEMM's output;
# * Triton -> GEMM: the GEMM's kernel config launches with PDL (its griddepcontrol.wait precedes the activation
#   reads: tests/compile/test_inductor_pdl_ptx.py checks the PTX of the very configs chosen here).
#
# The code is generated under max-autotune with Inductor's benchmark replaced by a stand-in that picks each
# op's second-ranked candidate, so the test also shows every nvgemm op of the layer went through the
# autotuner and that the autotuner's pick (not the policy's first) is what the code launches.

from nvgemm.integrations.inductor import capture as _capture  # noqa: E402
from nvgemm.integrations.inductor.demo import TinyLlamaConfig, TinyNvfp4Llama, _rms, _rope, make_linear  # noqa: E402

_GEMM_CALL = re.compile(r"^\s*(\w+) = torch\.ops\.nvgemm\.(\w+_choice)\.default\((.*)\)\s*$")
#: nvgemm ops that are one Triton kernel launched by nvgemm's own launcher (the fused norm quantizers the layer
#: rewrites insert), and that kernel
_NVGEMM_TRITON_CALL = re.compile(
    r"^\s*(\w+) = torch\.ops\.nvgemm\.((?:add_)?rmsnorm_quantize_nvfp4)\.default\((.*)\)\s*$")
_TRITON_RUN = re.compile(r"^\s*(\w+)\.run\((.*)\)\s*$")
_OTHER = re.compile(r"^\s*(?:\w+ = )?(extern_kernels\.\w+|torch\.ops\.(?!nvgemm)\w+\.\w+(?:\.\w+)?)\(")
_ALIAS = re.compile(r"^\s*(\w+) = (\w+)\[\d+\]\s*$")
_BUF = re.compile(r"\b(buf\d+|arg\d+_\d+)\b")


class _B200Layer(TinyNvfp4Llama):
    """TinyNvfp4Llama's layer with the MLP's gate and up held as one gate_up linear with ``silu_mul`` in its
    epilogue (nvgemm's gated layers; what the capture pass rewrites into requant -> prequant on sm_100)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        g = torch.Generator().manual_seed(11)
        for layer in self.layers:
            w = (torch.randn(2 * cfg.intermediate, cfg.hidden, generator=g) * 0.08).to(torch.bfloat16)
            layer.gate_up = make_linear(w, None, 0.002, "op")
            layer.gate_up.activation = "silu_mul"
            del layer.gate, layer.up

    def forward(self, ids, k_cache, v_cache):
        c = self.cfg
        B = ids.shape[0]
        x = self.embed[ids].unsqueeze(1)
        pos = torch.full((1,), c.cache_len, device=ids.device, dtype=torch.long)
        for li, layer in enumerate(self.layers):
            h = _rms(x, layer.ln1)
            q = layer.q(h).view(B, 1, c.heads, c.head_dim).transpose(1, 2)
            k = layer.k(h).view(B, 1, c.kv_heads, c.head_dim).transpose(1, 2)
            v = layer.v(h).view(B, 1, c.kv_heads, c.head_dim).transpose(1, 2)
            q, k = _rope(q, pos), _rope(k, pos)
            keys = torch.cat((k_cache[li], k), dim=2)
            vals = torch.cat((v_cache[li], v), dim=2)
            attn = torch.nn.functional.scaled_dot_product_attention(q, keys, vals, enable_gqa=True)
            x = x + layer.o(attn.transpose(1, 2).reshape(B, 1, c.heads * c.head_dim))
            x = x + layer.down(layer.gate_up(_rms(x, layer.ln2)))
        return _rms(x, self.norm)[:, 0].float() @ self.lm_head.float().t()


def _hopper_checkpoint_model():
    """A tiny W4A16 Llama whose NVFP4 layers are held in the sm90 layout, as ``load_modelopt_checkpoint`` leaves
    them on an H200 (its ``prepare_for_sm90(model, kind)`` call; the H200 check -- an sm_90 GPU whose kernels
    pass their first-use check -- answered yes)."""
    import nvgemm.nn.linear as nl

    model = TinyNvfp4Llama(TinyLlamaConfig(layers=1, weight_only=True))
    with um.patch.object(nl, "sm90_serve_reason", lambda problems: None):
        held = nl.prepare_for_sm90(model, "bf16")
    assert len(held) == 7
    return model


class _StandInBenchmark:
    """Replaces Inductor's benchmark of custom-op choices: picks the second of an op's CuTeDSL kernel candidates
    (the config the policy ranked second; the only one where there is one) and records what it was offered."""

    def __init__(self):
        self.offered: list[list[str]] = []
        self.picked: list[str] = []

    def __call__(self, *, name, choices, **kwargs):
        keys = [getattr(getattr(c, "decomposition", None), "nvgemm_choice", None) for c in choices]
        assert all(keys), f"a choice of {name} is not an nvgemm candidate: {[c.name for c in choices]}"
        self.offered.append(keys)
        kernels = [i for i, k in enumerate(keys) if k.startswith("backend:cutedsl_")]
        pick = kernels[1] if len(kernels) > 1 else kernels[0]
        self.picked.append(keys[pick])
        return None, choices[pick]  # the winner's graph is inlined; the selected node is only used for the eager fallback


def _decode_layer_code(cc):
    model = _hopper_checkpoint_model() if cc == (9, 0) else _B200Layer(TinyLlamaConfig(layers=1))
    cfg = model.cfg
    names, tensors = zip(*(list(model.named_parameters()) + list(model.named_buffers())))
    cache = (1, 1, cfg.kv_heads, cfg.cache_len, cfg.head_dim)
    shapes = [((1,), torch.long), (cache, torch.bfloat16), (cache, torch.bfloat16)]
    shapes += [(tuple(t.shape), t.dtype) for t in tensors]

    def step(ids, k, v, *state):
        return torch.func.functional_call(model, dict(zip(names, state)), (ids, k, v))

    bench = _StandInBenchmark()
    patch = {"max_autotune": True, "max_autotune_gemm_backends": "ATEN"}
    with torch._inductor.config.patch(patch), \
            um.patch("torch._inductor.kernel.custom_op.autotune_select_algorithm", bench):
        code = _codegen_cuda(step, shapes, cc, graph_pass=_capture.make_pass(claim_scaled_mm=False,
                                                                              fuse_requant=True))
    return code, bench


def _launches(code: str) -> list[dict]:
    """The wrapper's launches in stream order: nvgemm choice calls, Triton kernels, other extern kernels."""
    kernels = _kernels(code)
    body = code[code.index("def call("):]
    out = []
    for line in body.splitlines():
        m = _GEMM_CALL.match(line)
        if m:
            out.append({"kind": "gemm", "op": m.group(2), "writes": {m.group(1)},
                        "reads": set(_BUF.findall(m.group(3))), "choice": re.findall(r"'([^']*)'", m.group(3))[-1],
                        "m": 1})
            continue
        m = _NVGEMM_TRITON_CALL.match(line)
        if m:
            out.append({"kind": "triton", "name": m.group(2), "src": None, "params": {}, "writes": {m.group(1)},
                        "reads": set(_BUF.findall(m.group(3)))})
            continue
        m = _ALIAS.match(line)
        if m and out and m.group(2) in out[-1]["writes"]:
            out[-1]["writes"].add(m.group(1))  # a multi-output op's outputs
            continue
        m = _TRITON_RUN.match(line)
        if m and m.group(1) in kernels:
            src = kernels[m.group(1)]
            params = re.search(r"def triton_\w*\(([^)]*)\)", src).group(1).split(",")
            params = [p.split(":")[0].strip() for p in params]
            args = [a.strip() for a in m.group(2).split(",")]
            by_param = dict(zip(params, args))
            written = {a for p, a in by_param.items() if p.startswith(("out_ptr", "in_out_ptr"))}
            out.append({"kind": "triton", "name": m.group(1), "src": src, "params": by_param,
                        "writes": {b for a in written for b in _BUF.findall(a)},
                        "reads": {b for a in args for b in _BUF.findall(a)}})
            continue
        if _OTHER.match(line):
            out.append({"kind": "other", "line": line.strip(), "writes": set(_BUF.findall(line)), "reads": set()})
    return out


def _launch_config(op: str, choice: str, m: int):
    """The kernel config a GEMM choice launches for ``m`` tokens (None: no nvgemm kernel)."""
    from nvgemm.integrations.inductor.choices import Candidate, choice_for_m
    from nvgemm.templates.sm90_w4a16.config import config_from_name as sm90_config
    from nvgemm.templates.sm100_w4a4.config import config_from_name as sm100_config
    from nvgemm.templates.sm100_w4a4.launch import requant_config

    cand = Candidate(choice_for_m(choice, m))
    if cand.backend == "cutedsl_sm90" and cand.config:
        return sm90_config(cand.config)
    if cand.backend == "cutedsl_sm100" and cand.config:
        return sm100_config(cand.config)
    if cand.backend == "cutedsl_sm100" and op in ("nvfp4_linear_requant_choice",
                                                  "nvfp4_linear_prequant_requant_choice"):
        return requant_config(m)
    return None


def _check_fused_quantizer_pdl():
    """nvgemm's fused RMSNorm quantizer launches with PDL on sm_100 (``use_gdc``) and waits on its predecessor
    before it reads the activation or residual (``_load_h``); only the static input_scale is read before."""
    import types

    from nvgemm.templates.triton import _common, fused

    assert _common.use_gdc(types.SimpleNamespace(capability=(10, 0)), torch.device("cuda"), None)
    src = fused.rmsnorm_quantize_kernel.src
    assert src.index("pdl_wait(USE_GDC)") < src.index("_load_h("), src


def _check_edges(code: str) -> dict:
    launches = _launches(code)
    edges = {"gemm->triton": 0, "triton->gemm": 0}
    for a, b in zip(launches, launches[1:]):
        if a["kind"] == "gemm" and b["kind"] == "triton" and a["writes"] & b["reads"]:
            edges["gemm->triton"] += 1
            if b["src"] is None:  # nvgemm's fused quantizer: launched with PDL, gdc_wait before its first x load
                _check_fused_quantizer_pdl()
                continue
            src = b["src"]
            assert "'launch_pdl': True" in src, (a["op"], b["name"])
            body = src[src.index("def triton_"):]
            consumed = [p for p, arg in b["params"].items() if set(_BUF.findall(arg)) & a["writes"]]
            first_read = min(body.index(f"tl.load({p}") for p in consumed)
            assert "tl.extra.cuda.gdc_wait()" in body[:first_read], (b["name"], consumed)
        elif a["kind"] == "triton" and b["kind"] == "gemm" and a["writes"] & b["reads"]:
            edges["triton->gemm"] += 1
            cfg = _launch_config(b["op"], b["choice"], b["m"])
            assert cfg is not None and cfg.pdl, (a["name"], b["op"], b["choice"])
    return edges


@needs_pdl_hook
@pytest.mark.parametrize("cc", [(9, 0), (10, 0)], ids=["h200-w4a16-prepared", "b200-w4a4-requant"])
def test_every_gemm_triton_edge_of_a_decode_layer_uses_pdl(nvgemm_on, cc):
    code, bench = _decode_layer_code(cc)
    calls = [la for la in _launches(code) if la["kind"] == "gemm"]
    ops = sorted(la["op"] for la in calls)
    if cc == (9, 0):
        # the default H200 path: every layer a prepared-weight GEMM (nothing left as an opaque fallback)
        assert ops == ["nvfp4_linear_sm90_prepared_choice"] * 7, ops
        assert "nvfp4_linear_sm90_prepared.default(" not in code
    else:
        # the layer rewrites: the input norm quantizes for q / k / v (prequant), the post-attention norm for the
        # fused gate_up (prequant_requant: SwiGLU + requant in its epilogue) feeding down (prequant); o_proj's
        # input comes from attention, so it stays nvfp4_linear (quantizing inside its op)
        assert ops == ["nvfp4_linear_choice"] + ["nvfp4_linear_prequant_choice"] * 4 + [
            "nvfp4_linear_prequant_requant_choice"], ops
        for op in ("nvfp4_linear", "nvfp4_linear_requant", "nvfp4_linear_prequant", "nvfp4_linear_prequant_requant"):
            assert f"nvgemm.{op}.default(" not in code, op
    # every GEMM was autotuned over a bounded list of candidates and runs the autotuner's pick
    assert len(bench.offered) == len(calls)
    assert all(2 <= len(keys) <= 10 for keys in bench.offered), bench.offered
    assert sorted(la["choice"] for la in calls) == sorted(bench.picked)
    edges = _check_edges(code)
    # H200: o_proj, up, down feed Triton kernels; the input norm, the attention output, the post-attention norm
    # and the SwiGLU feed GEMMs.
    # B200 (launch order: embedding gather, three fused norm quantizers (q, k, v have their own input scales),
    # q, k, v GEMMs, RoPE / cache / attention kernels, o_proj, the post-attention fused norm quantizer, gate_up
    # prequant_requant, down prequant, the final norm): o_proj -> norm quantizer and down -> final norm are
    # GEMM -> Triton; attention output -> o_proj and norm quantizer -> gate_up are Triton -> GEMM. The q GEMM
    # follows v's quantizer, not its own (no data edge; its griddepcontrol.wait still covers every earlier grid),
    # and the SwiGLU is inside gate_up's epilogue.
    want = {"gemm->triton": 3, "triton->gemm": 4} if cc == (9, 0) else {"gemm->triton": 2, "triton->gemm": 2}
    assert edges == want, edges
