"""Probe nvgemm's public entry points with bad, hostile and edge-case input; print case -> outcome.

    PYTHONPATH=src python bench/probe_bad_input.py [--markdown bench/results/probe_bad_input.md] [-k SUBSTR]

Entry points: ``torch.ops.nvgemm.nvfp4_linear`` / ``quantize_nvfp4``, ``NVFP4Linear``, the ModelOpt
checkpoint loader (a tiny exported checkpoint, mutated per case), the ``nvgemm`` CLI (``cli.main``
in-process) and the kernel cache (tampering through ``KernelCache``'s API). Each case runs in a
daemon thread with a time limit and ends as one of:

  clear error     raised ValueError/TypeError/LookupError/OSError (CheckpointError included) naming it,
                  or a CLI exit != 0 with one stderr line
  correct result  finished and matched an independent reference (or documented behaviour)
  WRONG           finished without complaint but the result is wrong / the hostile input was accepted
  HANG            still running after the time limit
  TRACEBACK       raised something else (a crash), or a CLI printed a traceback / exited 0 on nonsense

The exit status is 1 when any case is WRONG, HANG or TRACEBACK. CPU only; nothing is compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import nvgemm  # noqa: F401  (registers the ops)
from nvgemm import NVFP4Linear
from nvgemm.core.formats import blocked_shape, quantize_weight, to_blocked
from nvgemm.ops.linear import nvfp4_linear_emulated

GOOD = ("clear error", "correct result")
LIMIT_S = 60.0
CASES: list[tuple[str, str, object]] = []  # (group, name, fn); fn() -> outcome string or raises


def case(group: str, name: str):
    def deco(fn):
        CASES.append((group, name, fn))
        return fn
    return deco


def expect_error(fn, *args, **kwargs) -> str:
    """Call ``fn``; a clear exception is the good outcome, returning normally is WRONG."""
    try:
        fn(*args, **kwargs)
    except (ValueError, TypeError, LookupError, OSError) as e:
        return "clear error" if str(e).strip() else "TRACEBACK"
    return "WRONG"


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same values up to one rounding of the output dtype (2^-7 relative) -- the op's own contract."""
    g, w = got.float(), want.float()
    if g.shape != w.shape:
        return False
    same_nonfinite = (g == w) | (torch.isnan(g) & torch.isnan(w))
    err = (g - w).abs()
    return bool((same_nonfinite | (err <= 2.0**-7 * w.abs() + 1e-3 * w.abs().max().clamp_min(1e-30))).all())


# --------------------------------------------------------------------------- ops

G = torch.Generator().manual_seed(0)
N, K = 128, 128  # N % 128 == 0, K % 64 == 0: flattened linear scales have the swizzled size
Q = quantize_weight(torch.randn(N, K, generator=G))
X = torch.randn(3, K, generator=G).bfloat16()
WS = to_blocked(Q.scale)
INS = torch.tensor(0.01)


def base(**over):
    a = dict(x=X, weight=Q.packed, weight_scale=WS, weight_scale_2=Q.global_scale, input_scale=INS, bias=None,
             residual=None, activation="none", out_dtype=None)
    a.update(over)
    return a


def op(**over):
    a = base(**over)
    return torch.ops.nvgemm.nvfp4_linear(*a.values())


BAD_OP = {
    "x float32": dict(x=X.float()),
    "x int32": dict(x=X.int()),
    "x 0-dim": dict(x=torch.tensor(1.0).bfloat16()),
    "x K mismatch": dict(x=X[:, :64]),
    "weight int8": dict(weight=Q.packed.to(torch.int8)),
    "weight 1-D": dict(weight=Q.packed.reshape(-1)),
    "weight 3-D": dict(weight=Q.packed.reshape(2, 64, 64)),
    "weight K/2 odd multiple (K=120)": dict(weight=Q.packed[:, :60], x=X[:, :120]),
    "weight_scale float32": dict(weight_scale=WS.float()),
    "weight_scale bfloat16": dict(weight_scale=WS.float().bfloat16()),
    "weight_scale linear 2-D": dict(weight_scale=Q.scale),
    "weight_scale flattened linear (ambiguous size)": dict(weight_scale=Q.scale.reshape(-1)),
    "weight_scale flat swizzled 1-D": dict(weight_scale=WS.reshape(-1)),
    "weight_scale truncated": dict(weight_scale=WS.reshape(-1)[:100]),
    "weight_scale wrong tile count": dict(weight_scale=torch.zeros(2, 2, 32, 4, 4).to(torch.float8_e4m3fn)),
    "weight_scale_2 float64": dict(weight_scale_2=Q.global_scale.double()),
    "weight_scale_2 shape (2,)": dict(weight_scale_2=torch.ones(2)),
    "weight_scale_2 NaN": dict(weight_scale_2=torch.tensor(float("nan"))),
    "weight_scale_2 +Inf": dict(weight_scale_2=torch.tensor(float("inf"))),
    "weight_scale_2 negative": dict(weight_scale_2=torch.tensor(-0.01)),
    "weight_scale_2 vector with a NaN": dict(weight_scale_2=torch.ones(N).index_fill(0, torch.tensor([5]),
                                                                                          float("nan"))),
    "weight_scale_2 vector with a negative": dict(weight_scale_2=torch.ones(N).index_fill(0, torch.tensor([5]), -1.0)),
    "input_scale NaN": dict(input_scale=torch.tensor(float("nan"))),
    "input_scale +Inf": dict(input_scale=torch.tensor(float("inf"))),
    "input_scale zero": dict(input_scale=torch.tensor(0.0)),
    "input_scale negative": dict(input_scale=torch.tensor(-0.01)),
    "input_scale float16": dict(input_scale=torch.tensor(0.01).half()),
    "input_scale shape (2,)": dict(input_scale=torch.ones(2)),
    "bias int32": dict(bias=torch.ones(N, dtype=torch.int32)),
    "bias int64": dict(bias=torch.ones(N, dtype=torch.int64)),
    "bias bool": dict(bias=torch.ones(N, dtype=torch.bool)),
    "bias wrong length": dict(bias=torch.ones(N - 1).bfloat16()),
    "bias 2-D": dict(bias=torch.ones(1, N).bfloat16()),
    "residual int32": dict(residual=torch.ones(3, N, dtype=torch.int32)),
    "residual wrong shape": dict(residual=torch.ones(3, N + 1).bfloat16()),
    "residual missing batch dims": dict(residual=torch.ones(N).bfloat16()),
    "activation relu": dict(activation="relu"),
    "activation empty string": dict(activation=""),
    "silu_mul with residual of N columns": dict(activation="silu_mul", residual=torch.ones(3, N).bfloat16()),
    "weight on meta device": dict(weight=Q.packed.to("meta")),
    "bias on meta device": dict(bias=torch.ones(N, device="meta").bfloat16()),
}
for _name, _over in BAD_OP.items():
    case("op nvfp4_linear", _name)(lambda o=_over: expect_error(op, **o))


GOOD_OP = {
    "M = 0 (empty batch)": dict(x=X[:0]),
    "x 3-D [2, 3, K]": dict(x=torch.randn(2, 3, K, generator=G).bfloat16()),
    "x non-contiguous (transposed view)": dict(x=torch.randn(K, 3, generator=G).bfloat16().t()),
    "x float16": dict(x=X.half()),
    "weight_scale as raw uint8 bytes": dict(weight_scale=WS.view(torch.uint8)),
    "weight-only (input_scale None)": dict(input_scale=None),
    "weight_scale_2 per-column vector": dict(weight_scale_2=Q.global_scale * torch.linspace(0.5, 2, N)),
    "input_scale shape (1,)": dict(input_scale=INS.reshape(1)),
    "bias float32": dict(bias=torch.randn(N, generator=G)),
    "out_dtype float32": dict(out_dtype=torch.float32),
    "silu_mul": dict(activation="silu_mul"),
    "residual bf16": dict(residual=torch.randn(3, N, generator=G).bfloat16()),
    "x holds +Inf / NaN (documented: W4A4 saturates Inf, NaN propagates)": dict(
        x=X.clone().index_fill(1, torch.tensor([0]), float("inf"))),
    "weight_scale_2 zero with all-zero weight": "zero-weight",
}


def _good_op(o):
    if o == "zero-weight":
        z = quantize_weight(torch.zeros(N, K))
        got = op(weight=z.packed, weight_scale=to_blocked(z.scale), weight_scale_2=z.global_scale)
        return "correct result" if bool((got == 0).all()) else "WRONG"
    a = base(**o)
    got = torch.ops.nvgemm.nvfp4_linear(*a.values())
    x = a["x"].contiguous()
    want = nvfp4_linear_emulated(x, *list(a.values())[1:])  # the reference path, contiguous input
    if a["x"].shape[0] == 0:
        return "correct result" if got.shape == (0, N) else "WRONG"
    return "correct result" if close(got, want) else "WRONG"


for _name, _over in GOOD_OP.items():
    case("op nvfp4_linear", _name)(lambda o=_over: _good_op(o))


def _shape_case(n, k, w4a4, act="none"):
    g = torch.Generator().manual_seed(n * 1000 + k)
    q = quantize_weight(torch.randn(n, k, generator=g))
    x = torch.randn(5, k, generator=g).bfloat16()
    args = (x, q.packed, to_blocked(q.scale), q.global_scale, INS if w4a4 else None, None, None, act, None)
    got = torch.ops.nvgemm.nvfp4_linear(*args)
    # independent reference: fp64 dequantize-and-matmul from the linear scales
    from nvgemm.core.formats import dequantize, quantize_activation
    from nvgemm.core.epilogue import apply_activation_ref

    w = dequantize(q.packed, q.scale).double()
    a = dequantize(*quantize_activation(x, INS)).double() if w4a4 else x.double()
    y = (a @ w.t()) * (float(INS) if w4a4 else 1.0) * float(q.global_scale)
    y = apply_activation_ref(y.float(), act)
    return "correct result" if close(got, y.to(torch.bfloat16)) else "WRONG"


for _n, _k in ((1, 16), (7, 32), (130, 48), (129, 80), (256, 64), (200, 4096)):
    for _w4a4 in (True, False):
        case("op nvfp4_linear", f"shape tail N={_n} K={_k} {'W4A4' if _w4a4 else 'W4A16'} vs fp64 reference")(
            lambda n=_n, k=_k, w=_w4a4: _shape_case(n, k, w))
for _act in ("silu", "gelu_tanh", "silu_mul"):
    case("op nvfp4_linear", f"activation {_act} vs fp64 reference")(lambda a=_act: _shape_case(64, 64, True, a))
case("op nvfp4_linear", "silu_mul with odd N")(lambda: expect_error(_shape_case, 7, 32, True, "silu_mul"))


@case("op nvfp4_linear", "8 threads calling the op at once get the single-thread result")
def _():
    want = op()
    outs = [None] * 8

    def work(i):
        outs[i] = op()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return "correct result" if all(o is not None and torch.equal(o, want) for o in outs) else "WRONG"


def quant(x, s, swz=True):
    return torch.ops.nvgemm.quantize_nvfp4(x, s, swz)


for _name, _args in {
    "x 1-D": (torch.randn(32), INS),
    "x 3-D": (torch.randn(2, 2, 32), INS),
    "K = 24": (torch.randn(2, 24), INS),
    "x int32": (torch.ones(2, 32, dtype=torch.int32), INS),
    "input_scale float64": (torch.randn(2, 32), INS.double()),
    "input_scale (2,)": (torch.randn(2, 32), torch.ones(2)),
}.items():
    case("op quantize_nvfp4", _name)(lambda a=_args: expect_error(quant, *a))


@case("op quantize_nvfp4", "swizzled scales round-trip to the linear ones")
def _():
    p, s = quant(X, INS, True)
    p2, s2 = quant(X, INS, False)
    ok = torch.equal(p, p2) and torch.equal(s.view(torch.uint8), to_blocked(s2).view(torch.uint8).reshape(-1))
    return "correct result" if ok else "WRONG"


# --------------------------------------------------------------------------- NVFP4Linear


LIN_BAD = {
    "flattened linear scale": (Q.packed, Q.scale.reshape(-1), Q.global_scale),
    "flat swizzled 1-D scale": (Q.packed, WS.reshape(-1), Q.global_scale),
    "scale of another layer's shape": (Q.packed, Q.scale[:64], Q.global_scale),
    "weight float32": (Q.packed.float(), Q.scale, Q.global_scale),
    "weight_scale_2 NaN": (Q.packed, Q.scale, torch.tensor(float("nan"))),
    "weight_scale_2 negative": (Q.packed, Q.scale, torch.tensor(-1.0)),
    "weight_scale_2 zero with non-zero codes": (Q.packed, Q.scale, torch.tensor(0.0)),
    "input_scale zero": (Q.packed, Q.scale, Q.global_scale, torch.tensor(0.0)),
    "input_scale NaN": (Q.packed, Q.scale, Q.global_scale, torch.tensor(float("nan"))),
}
for _name, _args in LIN_BAD.items():
    case("NVFP4Linear.from_tensors", _name)(lambda a=_args: expect_error(NVFP4Linear.from_tensors, *a))


@case("NVFP4Linear.from_tensors", "linear 2-D and tiled scales build the same layer, reference output")
def _():
    a = NVFP4Linear.from_tensors(Q.packed, Q.scale, Q.global_scale, INS)
    b = NVFP4Linear.from_tensors(Q.packed, WS, Q.global_scale, INS)
    ok = torch.equal(a.weight_scale.view(torch.uint8), b.weight_scale.view(torch.uint8)) and close(
        a(X), nvfp4_linear_emulated(*base().values()))
    return "correct result" if ok else "WRONG"


@case("NVFP4Linear.fuse", "unequal input_scale refused")
def _():
    a = NVFP4Linear.from_tensors(Q.packed, Q.scale, Q.global_scale, INS)
    b = NVFP4Linear.from_tensors(Q.packed, Q.scale, Q.global_scale, INS * 2)
    return expect_error(NVFP4Linear.fuse, [a, b])


@case("NVFP4Linear.fuse", "weight-only with W4A4 refused")
def _():
    a = NVFP4Linear.from_tensors(Q.packed, Q.scale, Q.global_scale, INS)
    b = NVFP4Linear.from_tensors(Q.packed, Q.scale, Q.global_scale)
    return expect_error(NVFP4Linear.fuse, [a, b])


# --------------------------------------------------------------------------- checkpoint loader

_CK: dict[str, Path] = {}
TMP = Path(tempfile.mkdtemp(prefix="nvgemm_probe_"))


def tiny(algo="NVFP4") -> Path:
    if algo not in _CK:
        from nvgemm.testing import make_tiny_checkpoint

        _CK[algo] = make_tiny_checkpoint(TMP / f"src_{algo}", "llama", algo)
    return _CK[algo]


_COPIES = iter(range(10**6))


def copy(algo="NVFP4") -> Path:
    dst = TMP / f"ck{next(_COPIES)}"
    shutil.copytree(tiny(algo), dst)
    return dst


def edit_tensors(ck: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(str(ck / "model.safetensors"))
    fn(sd)
    save_file(sd, str(ck / "model.safetensors"), metadata={"format": "pt"})


def edit_json(p: Path, fn) -> None:
    d = json.loads(p.read_text())
    fn(d)
    p.write_text(json.dumps(d))


def load(ck, **kw):
    from nvgemm.integrations.modelopt import load_modelopt_checkpoint

    return load_modelopt_checkpoint(ck, **kw)


P = "model.layers.0.self_attn.q_proj"


def _byte(sd, key, idx, value):
    raw = sd[key].view(torch.uint8).clone()
    raw[idx] = value if value is not None else raw[idx] | 0x80
    sd[key] = raw.view(torch.float8_e4m3fn)


TENSOR_EDITS = {
    "block scale NaN (0x7F)": lambda sd: _byte(sd, f"{P}.weight_scale", (3, 2), 0x7F),
    "block scale -NaN (0xFF)": lambda sd: _byte(sd, f"{P}.weight_scale", (3, 2), 0xFF),
    "block scale negative": lambda sd: _byte(sd, f"{P}.weight_scale", (3, 2), None),
    "block scale -0 (0x80)": lambda sd: _byte(sd, f"{P}.weight_scale", (0, 0), 0x80),
    "flattened linear scale (ambiguous size)": lambda sd: sd.update({f"{P}.weight_scale": sd[f"{P}.weight_scale"].reshape(-1)}),
    "swizzled 1-D scale without swizzled_scales=True": lambda sd: sd.update(
        {f"{P}.weight_scale": to_blocked(sd[f"{P}.weight_scale"]).view(torch.uint8).reshape(-1)}),
    "scale float32": lambda sd: sd.update({f"{P}.weight_scale": sd[f"{P}.weight_scale"].float()}),
    "scale wrong shape": lambda sd: sd.update({f"{P}.weight_scale": sd[f"{P}.weight_scale"][:, :-1].contiguous()}),
    "weight wrong shape": lambda sd: sd.update({f"{P}.weight": sd[f"{P}.weight"][:, :-1].contiguous()}),
    "weight int8": lambda sd: sd.update({f"{P}.weight": sd[f"{P}.weight"].view(torch.int8)}),
    "weight_scale_2 NaN": lambda sd: sd.update({f"{P}.weight_scale_2": torch.tensor(float("nan"))}),
    "weight_scale_2 negative": lambda sd: sd.update({f"{P}.weight_scale_2": torch.tensor(-1.0)}),
    "weight_scale_2 zero": lambda sd: sd.update({f"{P}.weight_scale_2": torch.tensor(0.0)}),
    "weight_scale_2 vector": lambda sd: sd.update({f"{P}.weight_scale_2": torch.ones(2)}),
    "input_scale Inf": lambda sd: sd.update({f"{P}.input_scale": torch.tensor(float("inf"))}),
    "input_scale zero": lambda sd: sd.update({f"{P}.input_scale": torch.tensor(0.0)}),
    "missing weight_scale_2": lambda sd: sd.pop(f"{P}.weight_scale_2"),
    "missing input_scale": lambda sd: sd.pop(f"{P}.input_scale"),
    "missing weight": lambda sd: sd.pop(f"{P}.weight"),
    "missing norm weight": lambda sd: sd.pop("model.norm.weight"),
    "unexpected tensor": lambda sd: sd.update({f"{P}.mystery": torch.zeros(1)}),
    "pre_quant_scale present": lambda sd: sd.update({f"{P}.pre_quant_scale": torch.ones(128)}),
    "norm weight quantized dtype": lambda sd: sd.update({"model.norm.weight": torch.zeros(128, dtype=torch.uint8)}),
    "norm weight wrong shape": lambda sd: sd.update({"model.norm.weight": torch.zeros(7).bfloat16()}),
}
for _name, _fn in TENSOR_EDITS.items():
    def _run(fn=_fn):
        ck = copy()
        edit_tensors(ck, fn)
        return expect_error(load, ck)
    case("loader tensors", _name)(_run)


@case("loader tensors", "swizzled 1-D scale with swizzled_scales=True loads exactly")
def _():
    ck = copy()
    edit_tensors(ck, TENSOR_EDITS["swizzled 1-D scale without swizzled_scales=True"])
    a = load(ck, swizzled_scales=True).model.layers[0].self_attn.q_proj
    b = load(tiny()).model.layers[0].self_attn.q_proj
    return "correct result" if torch.equal(a.weight_scale.view(torch.uint8), b.weight_scale.view(torch.uint8)) else "WRONG"


@case("loader tensors", "W4A16 checkpoint with an input_scale refused")
def _():
    ck = copy("W4A16_NVFP4")
    edit_tensors(ck, lambda sd: sd.update({f"{P}.input_scale": torch.tensor(0.01)}))
    return expect_error(load, ck)


JSON_EDITS = {
    "quant_algo FP8": ("hf", lambda d: d["quantization"].update(quant_algo="FP8")),
    "group_size 32": ("hf", lambda d: d["quantization"].update(group_size=32)),
    "group_size '16' (string)": ("hf", lambda d: d["quantization"].update(group_size="16")),
    "quantization section missing": ("hf", lambda d: d.pop("quantization")),
    "mixed map with FP8 layer": ("hf", lambda d: d["quantization"].update(
        quant_algo="MIXED_PRECISION", quantized_layers={P: {"quant_algo": "FP8"}})),
    "quant_method gptq": ("cfg", lambda d: d.update(quantization_config={"quant_method": "gptq"})),
    "unknown model_type": ("cfg", lambda d: d.update(model_type="no_such_model_type")),
}


def _hf(ck: Path) -> Path:
    p = ck / "hf_quant_config.json"
    if not p.exists():
        p.write_text(json.dumps({"producer": {"name": "modelopt"},
                                 "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}))
    return p


for _name, (_which, _fn) in JSON_EDITS.items():
    def _run(which=_which, fn=_fn):
        ck = copy()
        if which == "hf":
            edit_json(_hf(ck), fn)
        else:
            (ck / "hf_quant_config.json").unlink(missing_ok=True)
            edit_json(ck / "config.json", fn)
        return expect_error(load, ck)
    case("loader config", _name)(_run)


def _replace(ck: Path, name: str, kind: str) -> Path:
    p = ck / name
    if p.exists() or p.is_symlink():
        p.unlink()
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "short":
        p.write_bytes(b"abc")
    elif kind == "garbage":
        p.write_bytes(os.urandom(64))
    elif kind == "huge-header":
        p.write_bytes((2**62).to_bytes(8, "little") + b"{}")
    elif kind == "bad-json":
        p.write_text('{"model_type": "llama",')
    elif kind == "symlink-dev-zero":
        p.symlink_to("/dev/zero")
    return ck


for _name in ("model.safetensors", "config.json"):
    for _kind in ("fifo", "dir", "empty", "short", "garbage", "huge-header", "bad-json", "symlink-dev-zero"):
        if _name == "config.json" and _kind in ("huge-header", "short"):
            continue
        def _run(name=_name, kind=_kind):
            ck = _replace(copy(), name, kind)
            return expect_error(load, ck)
        case("loader files", f"{_name} is {_kind}")(_run)


@case("loader files", "hf_quant_config.json is a FIFO")
def _():
    ck = copy()
    p = _hf(ck)
    p.unlink()
    os.mkfifo(p)
    return expect_error(load, ck)


@case("loader files", "no safetensors at all")
def _():
    ck = copy()
    (ck / "model.safetensors").unlink()
    return expect_error(load, ck)


@case("loader files", "folder does not exist")
def _():
    return expect_error(load, TMP / "nowhere")


@case("loader security", "auto_map code never runs without trust_remote_code (prompt answered yes)")
def _():
    import builtins

    ck = TMP / f"evil{next(_COPIES)}"
    ck.mkdir()
    marker = ck / "PWNED"
    (ck / "config.json").write_text(json.dumps({
        "model_type": "nvgemm_probe_evil", "auto_map": {"AutoConfig": "evil.EvilConfig"},
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}))
    (ck / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
                                "from transformers import PretrainedConfig\n"
                                "class EvilConfig(PretrainedConfig):\n    model_type = 'nvgemm_probe_evil'\n")
    old = builtins.input
    builtins.input = lambda *a: "y"
    try:
        out = expect_error(load, ck)
    finally:
        builtins.input = old
    return "WRONG" if marker.exists() else out


@case("loader", "good checkpoint: logits equal the fp64 dequant reference to bf16 rounding")
def _():
    from nvgemm.integrations.modelopt.reference import build_reference_model

    model = load(tiny())
    ref = build_reference_model(model)
    ids = torch.randint(0, 512, (1, 8), generator=G)
    with torch.no_grad():
        a, b = model(ids).logits.float(), ref(ids).logits.float()
    return "correct result" if float((a - b).abs().max() / b.abs().max()) <= 0.02 else "WRONG"


# --------------------------------------------------------------------------- serving plan / precompile


@case("serving_plan", "vllm_gemms on a FIFO safetensors")
def _():
    from nvgemm.dispatch.serving_plan import vllm_gemms

    return expect_error(vllm_gemms, _replace(copy(), "model.safetensors", "fifo"), 1)


@case("serving_plan", "vllm_gemms on bad config.json")
def _():
    from nvgemm.dispatch.serving_plan import vllm_gemms

    return expect_error(vllm_gemms, _replace(copy(), "config.json", "bad-json"), 1)


@case("precompile", "checkpoint_shapes on a FIFO safetensors")
def _():
    from nvgemm.cli.precompile import checkpoint_shapes

    return expect_error(checkpoint_shapes, _replace(copy(), "model.safetensors", "fifo"))


@case("precompile", "checkpoint_shapes on a huge header length")
def _():
    from nvgemm.cli.precompile import checkpoint_shapes

    return expect_error(checkpoint_shapes, _replace(copy(), "model.safetensors", "huge-header"))


# --------------------------------------------------------------------------- vLLM layer (pure torch)


@case("vllm layer", "plan_gemms: negative block scale")
def _():
    from nvgemm.integrations.serving import plan_gemms

    s = Q.scale.view(torch.uint8).clone()
    s[1, 1] |= 0x80
    return expect_error(plan_gemms, Q.packed, s.view(torch.float8_e4m3fn), Q.global_scale.reshape(1), None, [N])


@case("vllm layer", "plan_gemms: NaN (never loaded) block scale")
def _():
    from nvgemm.integrations.serving import plan_gemms

    s = Q.scale.view(torch.uint8).clone()
    s[1, 1] = 0x7F
    return expect_error(plan_gemms, Q.packed, s.view(torch.float8_e4m3fn), Q.global_scale.reshape(1), None, [N])


@case("vllm layer", "plan_gemms: zero weight_scale_2")
def _():
    from nvgemm.integrations.serving import plan_gemms

    return expect_error(plan_gemms, Q.packed, Q.scale, torch.zeros(1), None, [N])


@case("vllm layer", "LoadTracker: a shard never loaded")
def _():
    from nvgemm.integrations.serving import LoadTracker

    t = LoadTracker("qkv", 3)
    load_ = t.wrap("weight", lambda p, w, *a: None)
    load_(None, None, "q")
    load_(None, None, "v")
    return expect_error(t.check, ["weight"])


# --------------------------------------------------------------------------- CLI


CLI = [
    ["demo", "--checkpoint", "{T}/nowhere"],
    ["demo", "--batch", "0"],
    ["demo", "--batch", "-3"],
    ["demo", "--prompt-len", "0"],
    ["demo", "--tokens", "-1"],
    ["demo", "--device", "foo"],
    ["demo", "--device", "cuda:x"],
    ["demo", "--algo", "FP8"],
    ["precompile", "--checkpoint", "{T}/nowhere", "--dry-run", "--arch", "sm_100a"],
    ["precompile", "--checkpoint", "{T}/short", "--dry-run", "--arch", "sm_100a"],
    ["precompile", "--checkpoint", "{T}/fifo", "--dry-run", "--arch", "sm_100a"],
    ["precompile", "--checkpoint", "{T}/badjson", "--vllm", "--dry-run", "--arch", "sm_100a"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_75"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_75", "--gpu", "B200"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_100a", "--gpu", "H100"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_100a", "--sm-count", "0"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_100a", "--max-m", "0"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_100a", "--jobs", "0"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_100a", "--gpu", "Z999"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_100a", "--template-module", "no_such_mod"],
    ["precompile", "--shape", "4096,4096", "--dry-run", "--arch", "sm_100a", "--cache-dir", "{T}/afile"],
    ["precompile", "--shape", "4096,0", "--dry-run", "--arch", "sm_100a"],
    ["precompile", "--shape", "4096", "--dry-run"],
    ["precompile", "--model", "NoSuchModel", "--dry-run"],
    ["plan", "--shape", "4096,4096", "--m-range", "256,1"],
    ["plan", "--shape", "4096,4096", "--sm-count", "0"],
    ["plan", "--shape", "4096,4096", "--gpu", "Z999"],
    ["plan", "--shape", "4096,4096", "--max-candidates", "0"],
    ["plan", "--shape", "x,y"],
    ["plan", "--model", "NoSuchModel"],
    ["plan", "--shape", "4096,4096", "--m", "0"],
    ["model", "--config", "nonsense", "--shape", "4096,4096"],
    ["model", "--policy", "--shape", "4096,4096", "--gpu", "Z999"],
    ["bench", "--no-such-flag"],
    ["env", "--no-such-flag"],
    ["no-such-command"],
]


def _cli_files() -> Path:
    d = TMP / "cli"
    if not d.exists():
        d.mkdir()
        (d / "short").mkdir()
        (d / "short" / "model.safetensors").write_bytes(b"abc")
        (d / "fifo").mkdir()
        os.mkfifo(d / "fifo" / "model.safetensors")
        (d / "badjson").mkdir()
        (d / "badjson" / "config.json").write_text("{")
        (d / "afile").write_text("x")
    return d


def run_cli(argv) -> str:
    from nvgemm import cli

    argv = [a.replace("{T}", str(_cli_files())) for a in argv]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:
            return "TRACEBACK"
    text = err.getvalue()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    if "Traceback" in text:
        return "TRACEBACK"
    if rc in (0, None):
        return "WRONG"  # exit 0 on nonsense
    return "clear error" if len(lines) == 1 else "TRACEBACK"


for _argv in CLI:
    case("cli", " ".join(_argv).replace("{T}/", ""))(lambda a=_argv: run_cli(a))


@case("cli", "nvgemm demo (subprocess) on a missing checkpoint: no traceback, rc != 0")
def _():
    r = subprocess.run([sys.executable, "-m", "nvgemm.cli", "demo", "--checkpoint", str(TMP / "nowhere")],
                       capture_output=True, text=True, timeout=LIMIT_S)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    if "Traceback" in r.stderr:
        return "TRACEBACK"
    return "clear error" if r.returncode != 0 and len(lines) == 1 else "WRONG"


# --------------------------------------------------------------------------- kernel cache tampering
# A hostile user who can write the cache directory plants a kernel.so (its constructor would run on
# dlopen) with a matching meta.json. KernelCache.lookup() returning that entry is WRONG: the runtime
# would load it. A refusal (error naming the path, or a miss) is the good outcome.


def _spec():
    from nvgemm.core.epilogue import EpilogueSpec
    from nvgemm.aot.selftest import SELFTEST_TEMPLATE_ID, SelftestConfig
    from nvgemm.aot.compile_spec import capture_codegen_env
    from nvgemm.aot.abi import DEFAULT_HW, CompileSpec

    return CompileSpec(SELFTEST_TEMPLATE_ID, SelftestConfig(), EpilogueSpec(), "sm_100a", DEFAULT_HW["sm_100a"],
                       a_format="bf16", b_format="bf16", codegen_env=capture_codegen_env())


def _planted_so(path: Path, marker: Path) -> None:
    c = path.with_suffix(".c")
    c.write_text('#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) {'
                 f' FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }} }}\n')
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(c)], check=True, capture_output=True)
    c.unlink()


def _plant(root: Path, *, so_mode=0o600, dir_mode=0o700, symlink=False):
    """A complete entry for _spec() whose meta.json checksum is recomputed over the planted .so."""
    import hashlib

    from nvgemm.aot import cache as C
    from nvgemm.aot.artifact import AOT_ABI_VERSION

    kc = C.KernelCache(root)
    spec = _spec()
    d = kc.entry_dir(spec)
    d.mkdir(parents=True, exist_ok=True)
    marker = root / "PWNED"
    so = d / "kernel.so"
    if symlink:
        real = root / "elsewhere.so"
        _planted_so(real, marker)
        so.symlink_to(real)
    else:
        _planted_so(so, marker)
    files = {}
    for name in C.ENTRY_FILES:
        p = d / name
        if not p.exists():
            p.write_bytes(b"planted")
        data = p.read_bytes()
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    payload = {"key_version": C.KEY_VERSION, "fingerprint": kc.fid, "key": kc.key(spec),
               "abi_version": AOT_ABI_VERSION, "files": files, "abi": [], "kernel_name": "planted"}
    (d / "meta.json").write_text(json.dumps({"payload": payload, "sha256": C._meta_digest(payload)}))
    os.chmod(so if not symlink else root / "elsewhere.so", so_mode)
    for p in (root, *[q for q in d.parents if root in q.parents], d):
        os.chmod(p, dir_mode)
    return kc, spec, marker


def _cache_case(**plant_kw):
    root = TMP / f"cache{next(_COPIES)}"
    root.mkdir()
    try:
        kc, spec, marker = _plant(root, **plant_kw)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"TRACEBACK (setup: {e})"
    try:
        from nvgemm.aot import cache as C

        hit = C.KernelCache(root).lookup(spec)
        if hit is None:
            return "clear error"  # refused as a miss
        try:  # what the runtime does next: load it (needs libcudart; the constructor runs on dlopen)
            C.KernelCache(root).get(spec, build=False)
        except Exception:
            pass
        return "WRONG" + (" (planted constructor ran)" if marker.exists() else " (planted entry accepted)")
    except (ValueError, OSError, PermissionError, LookupError) as e:
        return "clear error" if str(e).strip() else "TRACEBACK"


case("cache tampering", "planted entry with recomputed checksum in a 0777 directory")(
    lambda: _cache_case(dir_mode=0o777))
case("cache tampering", "planted world-writable kernel.so (0666)")(lambda: _cache_case(so_mode=0o666))
case("cache tampering", "kernel.so is a symlink to a planted library")(lambda: _cache_case(symlink=True))
case("cache tampering", "group-writable cache directory (0770)")(lambda: _cache_case(dir_mode=0o770))


@case("cache tampering", "cache created under umask 000 is not world-writable")
def _():
    from nvgemm.aot import cache as C

    root = TMP / f"umask{next(_COPIES)}"
    old = os.umask(0)
    try:
        kc = C.KernelCache(root)
        with kc._lock(kc.fid, "probe"):
            pass
    finally:
        os.umask(old)
    modes = [os.stat(p).st_mode for p in (root, kc.fp_dir())]
    return "WRONG" if any(m & (stat.S_IWGRP | stat.S_IWOTH) for m in modes) else "correct result"


# --------------------------------------------------------------------------- runner


def run_case(fn) -> str:
    box: dict = {}

    def target():
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001  (a crash is an outcome)
            box["out"] = f"TRACEBACK ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(LIMIT_S)
    return "HANG" if t.is_alive() else box["out"]


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", type=Path, help="also write the table as Markdown here")
    ap.add_argument("-k", default="", help="only cases whose group or name contains this")
    args = ap.parse_args(argv)
    os.environ.setdefault("NVGEMM_SELFCHECK", "1")
    rows = []
    t0 = time.time()
    for group, name, fn in CASES:
        if args.k and args.k not in f"{group} {name}":
            continue
        out = run_case(fn)
        rows.append((group, name, out))
        print(f"{out.split(' (')[0]:15s}  {group:26s}  {name}" + (f"   [{out}]" if " (" in out else ""), flush=True)
    bad = [r for r in rows if not r[2].startswith(GOOD)]
    counts: dict[str, int] = {}
    for _, _, o in rows:
        k = o.split(" (")[0]
        counts[k] = counts.get(k, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    print(f"\n{len(rows)} cases in {time.time() - t0:.0f} s: {summary}")
    if args.markdown:
        lines = ["# Bad-input / tampering probe", "",
                 "Command: `PYTHONPATH=src python bench/probe_bad_input.py --markdown bench/results/probe_bad_input.md`",
                 "", f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit {_commit()}, torch "
                 f"{torch.__version__}, Python {sys.version.split()[0]}, CPU only; exit status {1 if bad else 0}.",
                 "", f"{len(rows)} cases: {summary}. Outcomes are defined in the script's docstring. The "
                 "`cache tampering` cases exercise the kernel-cache hardening of issue 22 item 6; without it they "
                 "report WRONG (on a5a8f39 a planted library passed lookup and its constructor ran when the "
                 "runtime loaded it).", "",
                 "| group | case | outcome |", "|---|---|---|"]
        lines += [f"| {g} | {n.replace('|', '/')} | {o.replace('|', '/')} |" for g, n, o in rows]
        args.markdown.write_text("\n".join(lines) + "\n")
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
