"""One eager ``nvfp4_linear`` call is one walk down: validated once at the op, its backend taken from a
decision cache keyed by the problem (operand alignment included), the activation quantizer passed down,
and no layer below the ops calling a custom op. Misaligned operands fall back with one warning."""

from __future__ import annotations

import ast
import collections
import warnings
from pathlib import Path

import pytest
import torch

import nvgemm  # noqa: F401
import nvgemm.core.validation as V
# imported before any fixture wraps validation (a later import would bind the wrapped function)
import nvgemm.integrations.inductor.choices as CH  # registers nvgemm::nvfp4_linear_choice
import nvgemm.ops.linear as L
from nvgemm.core.formats import quantize_weight, to_blocked
from nvgemm.core import backend as core_backend
from nvgemm.dispatch import registry as B

SRC = Path(nvgemm.__file__).parent


def _args(m=4, n=256, k=512, seed=0, w4a4=True):
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    ins = torch.tensor(0.01) if w4a4 else None
    return [x, q.packed, to_blocked(q.scale), q.global_scale.reshape(()), ins, None, None, "none", None]


def _offset(t: torch.Tensor, off: int) -> torch.Tensor:
    """A copy of ``t`` whose data pointer is ``off`` bytes past a 16-byte boundary (a uint8 buffer
    sliced at ``off`` and viewed), as a safetensors file buffer at an unaligned offset holds it."""
    nbytes = t.numel() * t.element_size()
    buf = torch.empty(nbytes + 32, dtype=torch.uint8)
    start = (-buf.data_ptr()) % 16 + off
    out = buf[start:start + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    assert out.data_ptr() % 16 == off
    return out


def _count(monkeypatch, counter, module, name, key=None):
    f = getattr(module, name)

    def counted(*a, **k):
        counter[key or name] += 1
        return f(*a, **k)

    monkeypatch.setattr(module, name, counted)


@pytest.fixture
def counters(monkeypatch):
    """Counts of argument validation, the template's problem rule and backend-list walks."""
    import nvgemm.templates.sm100_w4a4.backend as SB
    import nvgemm.templates.sm100_w4a4.launch as SL
    import nvgemm.templates.sm100_w4a4.validity as SV

    c = collections.Counter()
    for mod in (L, V):
        _count(monkeypatch, c, mod, "check_linear_args")
    for mod in (SV, SB, SL):
        _count(monkeypatch, c, mod, "can_implement_problem")
    _count(monkeypatch, c, B, "_select_backend")
    return c


class _NoLaunch:
    def launch(self, *args):
        pass


def test_eager_call_validates_once_and_repeats_skip_selection(counters, monkeypatch):
    """The first call of a call key (shapes, strides, dtypes, devices, alignment) validates completely and
    decides; a repeated call takes the stored plan (no validation walk, no backend walk) and the sm100 host
    path (``emu_sm100``: the production launcher on CPU, launch replaced) checks the template's problem
    rule once, in the launcher."""
    import nvgemm.emulator.backend as EB
    import nvgemm.emulator.runner as R

    monkeypatch.setattr(EB, "_tooling", lambda: None)
    monkeypatch.setattr(R, "prepare", lambda *a, **k: _NoLaunch())
    monkeypatch.setenv("NVGEMM_SELFCHECK", "0")
    args = _args()
    for forced, rule in (("", 0), ("emu_sm100", 1)):
        monkeypatch.setenv("NVGEMM_BACKEND", forced)
        counters.clear()
        torch.ops.nvgemm.nvfp4_linear(*args)  # first call of this problem: validates and decides
        assert counters["check_linear_args"] == 1 and counters["_select_backend"] == 1, forced
        for _ in range(3):
            counters.clear()
            torch.ops.nvgemm.nvfp4_linear(*args)
            assert dict(counters) == ({"can_implement_problem": rule} if rule else {}), forced
        assert B.last_selected() == (forced or "emulated")


@pytest.fixture
def aligned_kernel(monkeypatch):
    """A kernel backend above ``emulated`` on CPU that, like every kernel backend, refuses operands it
    cannot read in place (here weight and weight_scale, as the sm100 kernel); it computes the emulated op."""
    runs = []

    def run(*args):
        runs.append(args[1])
        return L.nvfp4_linear_emulated(*args)

    def supports(p):
        return V.alignment_reason(p, ("weight", "weight_scale")) if p.device_type == "cpu" else "cpu only"

    monkeypatch.setenv("NVGEMM_SELFCHECK", "0")
    monkeypatch.delenv("NVGEMM_BACKEND", raising=False)
    monkeypatch.setattr(core_backend, "_WARNED", set())
    B.register_backend(B.Backend(name="test_aligned_kernel", priority=5000, supports=supports, run=run))
    yield runs
    B.unregister_backend("test_aligned_kernel")


def test_misaligned_weight_falls_back_with_one_warning_and_decisions_follow_the_tensor(aligned_kernel, counters):
    args = _args(seed=1)
    torch.ops.nvgemm.nvfp4_linear(*args)
    assert B.last_selected() == "test_aligned_kernel"

    # a new weight of the same shape, held at an unaligned offset: not the aligned call's decision
    bad = list(args)
    bad[1] = _offset(args[1], 3)
    with pytest.warns(RuntimeWarning, match=r"misaligned operand \(weight\).*test_aligned_kernel: weight is not "
                                            r"16-byte aligned.*runs on emulated"):
        out = torch.ops.nvgemm.nvfp4_linear(*bad)
    assert B.last_selected() == "emulated"
    assert torch.equal(out, L.nvfp4_linear_emulated(*args))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning: the repeats stay silent
        torch.ops.nvgemm.nvfp4_linear(*bad)
        torch.ops.nvgemm.nvfp4_linear(*_args(m=9, seed=1)[:1], *bad[1:])
    assert B.last_selected() == "emulated"
    with pytest.warns(RuntimeWarning, match=r"\(weight, weight_scale\).*weight, weight_scale are not 16-byte aligned"):
        torch.ops.nvgemm.nvfp4_linear(*bad[:2], _offset(args[2], 8), *bad[3:])

    # an in-place update keeps the pointer: the cached decision serves it, with the new values
    w = args[1].clone()
    new = quantize_weight(torch.randn(256, 512, generator=torch.Generator().manual_seed(7)))
    call = [args[0], w, to_blocked(new.scale), new.global_scale.reshape(()), *args[4:]]
    torch.ops.nvgemm.nvfp4_linear(*call)
    w.copy_(new.packed)
    counters.clear()
    out = torch.ops.nvgemm.nvfp4_linear(*call)
    assert counters["_select_backend"] == 0 and B.last_selected() == "test_aligned_kernel"
    assert torch.equal(out, L.nvfp4_linear_emulated(args[0], new.packed, *call[2:]))

    # the same tensor re-pointed in place at an unaligned buffer: decided again, for its new alignment
    moved = _offset(new.packed, 5)
    w.set_(moved.untyped_storage(), moved.storage_offset(), moved.shape, moved.stride())
    out = torch.ops.nvgemm.nvfp4_linear(*call)  # silent: "weight" was named once already
    assert B.last_selected() == "emulated"
    assert torch.equal(out, L.nvfp4_linear_emulated(args[0], new.packed, *call[2:]))


def test_forced_kernel_refuses_a_misaligned_operand_by_name(aligned_kernel, monkeypatch):
    monkeypatch.setenv("NVGEMM_BACKEND", "test_aligned_kernel")
    args = _args(seed=2)
    args[2] = _offset(args[2], 4)
    with pytest.raises(RuntimeError, match="NVGEMM_BACKEND=test_aligned_kernel cannot run .*weight_scale is not "
                                           "16-byte aligned"):
        torch.ops.nvgemm.nvfp4_linear(*args)


def test_misalignment_names_pointer_and_row_stride():
    t = torch.zeros(64, 48, dtype=torch.uint8)
    assert V.misalignment(t) is None
    assert "3 bytes past" in V.misalignment(_offset(t, 3))
    assert "row stride of 40 bytes" in V.misalignment(torch.zeros(64, 40, dtype=torch.uint8)[:, :32])
    assert V.misalignment(torch.zeros(64, 32, dtype=torch.uint8)[:, :16]) is None  # row stride 32 bytes
    assert V.misaligned_operands(x=t, weight=_offset(t, 1), bias=None) == ("weight",)
    a = V.aligned(_offset(t, 1))
    assert a.data_ptr() % 16 == 0 and torch.equal(a, t)


def test_alpha_is_input_scale_times_weight_scale_2_in_fp32():
    ws2 = torch.tensor([0.5, 3.0, 1e-3])
    assert torch.equal(V.alpha_of(ws2, torch.tensor(0.25)), torch.tensor([0.125, 0.75, 2.5e-4]))
    assert V.alpha_of(torch.tensor(2.0), torch.tensor([3.0])).shape == ()  # a one-element input_scale is a scalar
    assert torch.equal(V.alpha_of(ws2, None), ws2)
    per_expert = V.alpha_of(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[2.0], [0.5]]))
    assert torch.equal(per_expert, torch.tensor([[2.0, 4.0], [1.5, 2.0]]))


# ------------------------------------------------------------------------------ no re-entry from below

BELOW_OPS = ("core", "epilogues", "heuristics", "aot", "templates", "dispatch")


def _custom_op_calls(path: Path, root: Path = SRC) -> list[str]:
    """``torch.ops.<ns>`` attribute chains in ``path``'s code (docstrings and comments aside)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                isinstance(node.value.value, ast.Name) and node.value.value.id == "torch" and node.value.attr == "ops":
            hits.append(f"{path.relative_to(root)}:{node.lineno}: torch.ops.{node.attr}")
    return hits


def test_no_layer_below_the_ops_calls_a_custom_op():
    """Kernels get their dependencies passed down (the activation quantizer): nothing under the ops layer
    re-enters ``torch.ops.nvgemm``. (Before: ``templates/sm100_w4a4/launch.py`` called
    ``torch.ops.nvgemm.quantize_nvfp4`` through a quantizer the Triton module installed as a global.)"""
    hits = [h for pkg in BELOW_OPS for f in sorted((SRC / pkg).rglob("*.py")) for h in _custom_op_calls(f)]
    assert hits == []
    assert not hasattr(L, "_CUDA_QUANTIZER") and not hasattr(L, "set_cuda_quantizer")


def test_custom_op_scan_finds_a_call(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""torch.ops.nvgemm.x in a docstring is not a call."""\n'
                       "import torch\n\ndef f(x, s):\n    return torch.ops.nvgemm.quantize_nvfp4(x, s, True)\n")
    assert _custom_op_calls(planted, tmp_path) == ["planted.py:5: torch.ops.nvgemm"]


def test_sm100_launcher_quantizes_with_the_quantizer_it_is_given():
    from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig
    from nvgemm.templates.sm100_w4a4.launch import prepare_sm100_args
    from nvgemm.templates.triton.reference import quantize_ref

    x, w, s, ws2, ins, *_ = _args(m=8, n=256, k=256, seed=3)
    seen = []

    def quantize(x2, input_scale, swizzle):
        seen.append((tuple(x2.shape), float(input_scale), swizzle))
        return quantize_ref(x2, input_scale, swizzle)

    spec = V.check_linear_args(x, w, s, ws2, ins, None, None, "none", None)
    cfg = Sm100Nvfp4GemmConfig(tile_n=8, swap_ab=True)
    args = prepare_sm100_args(x, w, s, ws2, ins, None, None, spec, cfg, quantize=quantize)
    assert seen == [((8, 256), float(ins), True)]
    assert torch.equal(args.b, quantize_ref(x, ins)[0])  # swap-AB: the activation is operand B
    assert torch.equal(args.alpha, V.alpha_of(ws2, ins).reshape(1))


def test_autotuned_choice_validates_once_and_routes_misaligned_operands_to_the_op(aligned_kernel, counters,
                                                                                  monkeypatch):
    """Compiled code calls one named candidate (``nvgemm::nvfp4_linear_choice``): it validates the call once,
    and a kernel candidate that cannot read an operand in place hands the call to the eager op (fallback,
    one warning) instead of launching."""
    _count(monkeypatch, counters, CH, "check_linear_args")

    args = _args(seed=4)
    counters.clear()
    out = torch.ops.nvgemm.nvfp4_linear_choice(*args, "backend:test_aligned_kernel")
    assert counters["check_linear_args"] == 1 and len(aligned_kernel) == 1
    assert torch.equal(out, L.nvfp4_linear_emulated(*args))
    bad = list(args)
    bad[1] = _offset(args[1], 9)
    with pytest.warns(RuntimeWarning, match=r"weight is not 16-byte aligned.*runs on emulated"):
        out = torch.ops.nvgemm.nvfp4_linear_choice(*bad, "backend:test_aligned_kernel")
    assert len(aligned_kernel) == 1 and B.last_selected() == "emulated"
    assert torch.equal(out, L.nvfp4_linear_emulated(*args))


def test_kernel_choice_on_cpu_tensors_runs_the_eager_op(monkeypatch):
    """Code autotuned for a GPU names a device kernel (``backend:cutedsl_sm100:<config>``); run on CPU tensors
    (a CPU replay of generated code, the emulated backends) the choice hands the call to the eager op, which
    dispatches as an uncompiled call would, instead of asking CUDA for a device index."""
    monkeypatch.setenv("NVGEMM_BACKEND", "emulated")
    args = _args(m=9, seed=6)
    out = torch.ops.nvgemm.nvfp4_linear_choice(*args, "backend:cutedsl_sm100")
    assert B.last_selected() == "emulated"
    assert torch.equal(out, L.nvfp4_linear_emulated(*args))


def test_fused_requant_call_validates_once(counters, monkeypatch):
    """``nvgemm::nvfp4_linear_requant`` validates at the op, completely on the first call of a call key and
    not again on repeats; its reference backend does not validate."""
    import nvgemm.ops.fused as OF

    _count(monkeypatch, counters, OF, "check_linear_args")
    monkeypatch.delenv("NVGEMM_BACKEND", raising=False)
    x, w, s, ws2, ins, *_ = _args(m=3, n=64, k=128, seed=5)
    out_scale = torch.tensor(0.05)
    for want in (1, 0, 0):
        counters.clear()
        packed, scales = torch.ops.nvgemm.nvfp4_linear_requant(x, w, s, ws2, ins, None, out_scale, None)
        assert counters["check_linear_args"] == want
    assert packed.shape == (3, 16)
    with pytest.raises(ValueError, match="out_input_scale"):  # a new key is validated completely
        torch.ops.nvgemm.nvfp4_linear_requant(x, w, s, ws2, ins, None, torch.ones(2), None)


def test_decision_and_plan_caches_are_bounded():
    """The per-problem decision cache and the per-call plan cache keep at most their size (the oldest entry
    goes first): a server that sees many shapes does not grow them without limit."""
    c = B.BoundedCache(3)
    for i in range(5):
        c[i] = i
    assert len(c) == 3 and 0 not in c and 1 not in c and c.get(4) == 4
    c[4] = 40  # an update keeps the size
    assert len(c) == 3 and c.get(4) == 40
    assert B._DECISIONS.maxsize == B._PLANS.maxsize == B.DECISION_CACHE_SIZE
    keys = [(V.call_key(torch.zeros(m, 16)), m) for m in range(1, 4)]
    assert len(set(keys)) == 3  # the call key tells shapes apart
