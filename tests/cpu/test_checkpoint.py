"""ModelOpt-exported tiny Llama / Qwen2 checkpoints load into nvgemm and match an independent reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from _reference import ref_linear_fp64
from safetensors.torch import load_file, save_file

pytest.importorskip("modelopt")
pytest.importorskip("transformers")

from nvgemm import NVFP4Linear  # noqa: E402
from nvgemm.core.formats import Nvfp4Tensor, from_blocked, quantize_weight, to_blocked  # noqa: E402
from nvgemm.integrations.modelopt import CheckpointError, load_modelopt_checkpoint, read_quant_config  # noqa: E402
from nvgemm.testing import make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {(kind, algo): make_tiny_checkpoint(root / f"{kind}_{algo}", kind, algo)
            for kind in ("llama", "qwen2") for algo in ("NVFP4", "W4A16_NVFP4")}


class RefLinear(torch.nn.Module):
    """fp64 dequantize-and-matmul straight from the safetensors tensors (no nvgemm code path)."""

    def __init__(self, sd, prefix):
        super().__init__()
        self.q = Nvfp4Tensor(sd[f"{prefix}.weight"], sd[f"{prefix}.weight_scale"], sd[f"{prefix}.weight_scale_2"])
        self.ws2 = sd[f"{prefix}.weight_scale_2"].float()
        self.ins = sd.get(f"{prefix}.input_scale")
        self.bias = sd.get(f"{prefix}.bias")

    def forward(self, x):
        y, _ = ref_linear_fp64(x, self.q, self.ws2, self.ins, self.bias, None, "none", x.dtype)
        return y.to(x.dtype)


def reference_model(ckpt: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    sd = load_file(str(ckpt / "model.safetensors"))
    config = AutoConfig.from_pretrained(str(ckpt))
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    quantized = set()
    for name, mod in list(model.named_modules()):
        if isinstance(mod, torch.nn.Linear) and f"{name}.weight_scale" in sd:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, RefLinear(sd, name))
            quantized.add(name)
    plain = {k: v for k, v in sd.items() if k.rsplit(".", 1)[0] not in quantized}
    missing, unexpected = model.load_state_dict(plain, strict=False)
    assert not unexpected, unexpected
    return model


# Tolerance: both sides compute every quantized linear from the same bytes; nvgemm in fp32 (the
# emulated op), the reference in fp64, each rounding the layer output to bf16 once. They agree
# except where the fp32 sum lands on the other side of a bf16 rounding boundary (1 ulp, 2^-8
# relative); such a flip can move later activation codes and propagates through two layers.
# Measured max |diff| / max |logit| here is ~0 (most runs bit-identical); the bound allows a few
# flips: 2% of the logit range, while a wrong scale, code or layout gives O(100%).
LOGIT_RTOL = 0.02


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_logits_match_independent_reference(ckpts, kind, algo):
    ckpt = ckpts[(kind, algo)]
    model = load_modelopt_checkpoint(ckpt)
    n_q = sum(isinstance(m, NVFP4Linear) for m in model.modules())
    assert n_q == 8  # 2 layers x (qkv, o, gate_up, down): the default decode layout fuses the shards
    assert all(m.weight_only == (algo == "W4A16_NVFP4") for m in model.modules() if isinstance(m, NVFP4Linear))
    if kind == "qwen2":
        assert model.model.layers[0].self_attn.qkv_proj.fused.bias is not None
    ref = reference_model(ckpt)
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(ids).logits.float()
        want = ref(ids).logits.float()
    assert torch.isfinite(got).all()
    diff = (got - want).abs().max().item()
    assert diff <= LOGIT_RTOL * want.abs().max().item(), diff
    # the quantized model is a different function from the bf16 one: the check has teeth
    assert model.model.layers[0].mlp.down_proj.last_path == "emulated"


def unalign_tensor(path: Path, tensor: str, off: int) -> None:
    """Rewrite the safetensors file ``path`` with its header padded (spaces, as the format allows) so that
    ``tensor``'s bytes start ``off`` bytes past a 16-byte file offset: a CPU load views the page-aligned
    file mapping, so the loaded tensor's data pointer is ``off`` bytes past a 16-byte boundary."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8:8 + n].rstrip(b" ")
    begin = json.loads(header)[tensor]["data_offsets"][0]
    header += b" " * ((off - 8 - len(header) - begin) % 16)
    path.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n:])


def test_loader_holds_16_byte_aligned_tensors(ckpts, tmp_path):
    """A checkpoint whose tensors sit at unaligned file offsets loads into 16-byte aligned layers (the
    kernels read weight / weight_scale / bias in place), with the same values."""
    from safetensors import safe_open

    src = ckpts[("qwen2", "NVFP4")]
    ck = _copy(src, tmp_path)
    for name, off in (("model.layers.0.mlp.down_proj.weight", 3), ("model.layers.1.self_attn.q_proj.bias", 6)):
        unalign_tensor(ck / "model.safetensors", name, off)
        with safe_open(str(ck / "model.safetensors"), framework="pt", device="cpu") as f:
            assert f.get_tensor(name).data_ptr() % 16 == off  # the file buffer is unaligned
    model = load_modelopt_checkpoint(ck, fuse_shards=False)  # the checkpoint's own layers
    layers = [m for m in model.modules() if isinstance(m, NVFP4Linear)]
    assert len(layers) == 14
    for m in layers:
        for t in (m.weight, m.weight_scale, m.bias):
            assert t is None or t.data_ptr() % 16 == 0
    ref = load_modelopt_checkpoint(src, fuse_shards=False)
    ids = torch.randint(0, 512, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_exclude_modules_honoured(ckpts):
    model = load_modelopt_checkpoint(ckpts[("llama", "NVFP4")])
    assert type(model.lm_head) is torch.nn.Linear
    assert model.lm_head.weight.dtype == torch.bfloat16


# ----------------------------------------------------------------------- editing checkpoints


def _copy(ckpt: Path, tmp: Path) -> Path:
    dst = tmp / "edited"
    shutil.copytree(ckpt, dst)
    return dst


def _edit_tensors(ckpt: Path, fn) -> None:
    sd = load_file(str(ckpt / "model.safetensors"))
    fn(sd)
    save_file(sd, str(ckpt / "model.safetensors"))


def _edit_json(path: Path, fn) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d))


P = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    "edit,msg",
    [
        (lambda sd: sd.pop(f"{P}.weight_scale_2"), f"missing tensor {P}.weight_scale_2"),
        (lambda sd: sd.pop(f"{P}.input_scale"), f"missing tensor {P}.input_scale"),
        (lambda sd: sd.update({f"{P}.extra_thing": torch.zeros(1)}), f"unexpected tensor {P}.extra_thing"),
        (lambda sd: sd.update({f"{P}.weight": sd[f"{P}.weight"][:, :-1].contiguous()}), f"tensor {P}.weight: shape"),
        (lambda sd: sd.update({f"{P}.weight_scale": sd[f"{P}.weight_scale"].float()}), f"tensor {P}.weight_scale: dtype"),
        (lambda sd: sd.update({f"{P}.weight_scale": sd[f"{P}.weight_scale"].view(torch.uint8).reshape(-1)[:-3].contiguous()}),
         "1-D block scales"),
        (lambda sd: sd.update({f"{P}.weight_scale_2": torch.tensor([1.0, 2.0])}), "expected a scalar"),
        (lambda sd: sd.update({f"{P}.input_scale": torch.tensor(-1.0)}), "not a positive finite scale"),
        (lambda sd: sd.pop("model.norm.weight"), "missing tensor model.norm.weight"),
        (lambda sd: sd.update({"model.norm.weight": torch.zeros(7, dtype=torch.bfloat16)}), "tensor model.norm.weight: shape"),
    ],
)
def test_bad_tensors_named(ckpts, tmp_path, edit, msg):
    ck = _copy(ckpts[("llama", "NVFP4")], tmp_path)
    _edit_tensors(ck, edit)
    with pytest.raises(CheckpointError, match=msg.replace(".", r"\.").replace("(", r"\(")):
        load_modelopt_checkpoint(ck)


def test_weight_only_with_input_scale_is_refused(ckpts, tmp_path):
    ck = _copy(ckpts[("llama", "W4A16_NVFP4")], tmp_path)
    _edit_tensors(ck, lambda sd: sd.update({f"{P}.input_scale": torch.tensor(0.01)}))
    with pytest.raises(CheckpointError, match="weight-only"):
        load_modelopt_checkpoint(ck)


def test_unknown_algo_and_foreign_method(ckpts, tmp_path):
    ck = _copy(ckpts[("llama", "NVFP4")], tmp_path)
    _edit_json(ck / "hf_quant_config.json", lambda d: d["quantization"].update(quant_algo="FP8"))
    with pytest.raises(CheckpointError, match="quant_algo 'FP8' is not NVFP4"):
        load_modelopt_checkpoint(ck)
    (ck / "hf_quant_config.json").unlink()
    _edit_json(ck / "config.json", lambda d: d["quantization_config"].update(quant_method="gptq"))
    with pytest.raises(CheckpointError, match="quant_method 'gptq'"):
        read_quant_config(ck)


def test_mixed_precision_map(ckpts, tmp_path):
    """MIXED_PRECISION: per-layer algos; W4A16 layers drop their input_scale, unlisted layers stay bf16."""
    ck = _copy(ckpts[("llama", "NVFP4")], tmp_path)
    sd = load_file(str(ck / "model.safetensors"))
    layers = sorted({k.rsplit(".", 1)[0] for k in sd if k.endswith(".weight_scale")})
    wo = [l for l in layers if "mlp" in l]
    plain = "model.layers.1.self_attn.o_proj"
    # make one layer unquantized: dequantize it into a bf16 weight
    q = Nvfp4Tensor(sd[f"{plain}.weight"], sd[f"{plain}.weight_scale"], sd[f"{plain}.weight_scale_2"])
    from nvgemm.core.formats import dequantize

    sd[f"{plain}.weight"] = dequantize(*q).to(torch.bfloat16)
    for s in ("weight_scale", "weight_scale_2", "input_scale"):
        sd.pop(f"{plain}.{s}")
    for l in wo:
        sd.pop(f"{l}.input_scale")
    save_file(sd, str(ck / "model.safetensors"))
    qmap = {l: {"quant_algo": "W4A16_NVFP4" if l in wo else "NVFP4", "group_size": 16} for l in layers if l != plain}
    _edit_json(ck / "hf_quant_config.json", lambda d: d["quantization"].update(
        quant_algo="MIXED_PRECISION", quantized_layers=qmap))
    model = load_modelopt_checkpoint(ck, fuse_shards=False)  # the checkpoint's layers, by name
    mods = dict(model.named_modules())
    assert type(mods[plain]) is torch.nn.Linear
    assert all(mods[l].weight_only for l in wo)
    assert not mods["model.layers.0.self_attn.q_proj"].weight_only
    ref = reference_model(ck)
    ids = torch.randint(0, 512, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = model(ids).logits.float(), ref(ids).logits.float()
    assert (got - want).abs().max().item() <= LOGIT_RTOL * want.abs().max().item()


def test_compressed_tensors_converted(ckpts, tmp_path):
    """compressed-tensors nvfp4-pack-quantized: divisor global scales become multipliers."""
    src = ckpts[("llama", "NVFP4")]
    ck = _copy(src, tmp_path)
    (ck / "hf_quant_config.json").unlink()
    sd = load_file(str(ck / "model.safetensors"))
    layers = sorted({k.rsplit(".", 1)[0] for k in sd if k.endswith(".weight_scale")})
    for l in layers:
        sd[f"{l}.weight_packed"] = sd.pop(f"{l}.weight")
        sd[f"{l}.weight_global_scale"] = (1.0 / sd.pop(f"{l}.weight_scale_2")).reshape(1)
        sd[f"{l}.input_global_scale"] = (1.0 / sd.pop(f"{l}.input_scale")).reshape(1)
    save_file(sd, str(ck / "model.safetensors"))
    group = {"weights": {"num_bits": 4, "type": "float", "group_size": 16},
             "input_activations": {"num_bits": 4, "type": "float", "group_size": 16}, "targets": ["Linear"]}
    _edit_json(ck / "config.json", lambda d: d.update(quantization_config={
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": group}, "ignore": ["lm_head"]}))
    model = load_modelopt_checkpoint(ck, fuse_shards=False)
    orig = load_modelopt_checkpoint(src, fuse_shards=False)
    a, b = model.model.layers[0].self_attn.q_proj, orig.model.layers[0].self_attn.q_proj
    assert torch.equal(a.weight, b.weight)
    # 1/(1/x) in fp32 is within 1 ulp of x
    torch.testing.assert_close(a.weight_scale_2, b.weight_scale_2, rtol=2.0**-23, atol=0)
    torch.testing.assert_close(a.input_scale, b.input_scale, rtol=2.0**-23, atol=0)
    _edit_json(ck / "config.json", lambda d: d["quantization_config"].update(format="pack-quantized"))
    with pytest.raises(CheckpointError, match="'pack-quantized' is not NVFP4"):
        load_modelopt_checkpoint(ck)


def test_preswizzled_scales_unswizzled_exactly(ckpts, tmp_path):
    src = ckpts[("qwen2", "NVFP4")]
    ck = _copy(src, tmp_path)
    _edit_tensors(ck, lambda sd: sd.update(
        {f"{P}.weight_scale": to_blocked(sd[f"{P}.weight_scale"]).view(torch.uint8).reshape(-1)}))
    with pytest.raises(CheckpointError, match="swizzled_scales=True"):
        load_modelopt_checkpoint(ck)  # 1-D scales are only taken as swizzled when the caller says so
    a = load_modelopt_checkpoint(ck, swizzled_scales=True, fuse_shards=False).model.layers[0].self_attn.q_proj
    b = load_modelopt_checkpoint(src, fuse_shards=False).model.layers[0].self_attn.q_proj
    assert torch.equal(a.weight_scale.view(torch.uint8), b.weight_scale.view(torch.uint8))


def _set_scale_byte(sd, byte):
    raw = sd[f"{P}.weight_scale"].view(torch.uint8).clone()
    raw[5, 2] = byte if byte is not None else raw[5, 2] | 0x80
    sd[f"{P}.weight_scale"] = raw.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("byte,what", [(0x7F, "NaN"), (0xFF, "NaN"), (None, "negative"), (0x80, "negative")],
                         ids=["nan", "neg-nan", "negative", "neg-zero"])
def test_nan_and_negative_block_scales_refused(ckpts, tmp_path, byte, what):
    """The loader used to accept these (logits off by 0.89 for a NaN, 0.17 for a negative scale)."""
    ck = _copy(ckpts[("llama", "NVFP4")], tmp_path)
    _edit_tensors(ck, lambda sd: _set_scale_byte(sd, byte))
    with pytest.raises(CheckpointError, match=f"tensor {P}.weight_scale: block scale at index \\[5, 2\\] is {what}"
                       .replace(".", r"\.")):
        load_modelopt_checkpoint(ck)


def test_flattened_linear_scales_refused(ckpts, tmp_path):
    """q_proj is [128, 128]: N % 128 == 0 and K % 64 == 0, so its linear scales flattened to 1-D have
    exactly the swizzled size; the loader used to un-swizzle them (silently wrong logits)."""
    ck = _copy(ckpts[("llama", "NVFP4")], tmp_path)
    _edit_tensors(ck, lambda sd: sd.update({f"{P}.weight_scale": sd[f"{P}.weight_scale"].reshape(-1).contiguous()}))
    with pytest.raises(CheckpointError, match=f"tensor {P}.weight_scale: 1-D block scales".replace(".", r"\.")):
        load_modelopt_checkpoint(ck)


# ----------------------------------------------------------------------- fused shards


def _layer(n, k, scale_mult, ins, bias=True):
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.mul_(scale_mult)
    return NVFP4Linear.from_linear(lin, input_scale=ins)


@pytest.mark.parametrize("w4a4", [True, False])
def test_fuse_unequal_global_scales_exact(w4a4, seed):
    ins = 0.004 if w4a4 else None
    shards = [_layer(64, 96, m, ins) for m in (1.0, 7.0, 0.3)]
    ws2 = [float(s.weight_scale_2) for s in shards]
    assert len(set(ws2)) == 3
    fused = NVFP4Linear.fuse(shards)
    assert fused.weight_scale_2.shape == (192,)
    x = torch.randn(4, 96).to(torch.bfloat16)
    with torch.no_grad():
        want = torch.cat([s(x) for s in shards], dim=-1)
        got = fused(x)
    # same codes, same scales, same fp32 math per column: bit-identical
    assert torch.equal(got, want)


def test_fuse_equal_scales_stays_scalar_and_unequal_inputs_refused():
    a = _layer(32, 64, 1.0, 0.01)
    b = NVFP4Linear.from_tensors(a.weight, from_blocked(a.weight_scale, 32, 4), a.weight_scale_2, a.input_scale, a.bias)
    assert NVFP4Linear.fuse([a, b]).weight_scale_2.dim() == 0
    c = _layer(32, 64, 1.0, 0.02)
    with pytest.raises(ValueError, match="unequal input_scale"):
        NVFP4Linear.fuse([a, c])


def test_from_linear_is_modelopt_recipe(seed):
    lin = torch.nn.Linear(64, 48, bias=False)
    mod = NVFP4Linear.from_linear(lin)
    q = quantize_weight(lin.weight.detach())
    assert torch.equal(mod.weight, q.packed) and mod.weight_only
    torch.testing.assert_close(mod.dequantized_weight(), lin.weight.detach(), rtol=0.5, atol=float(lin.weight.abs().max()) / 6)


# ----------------------------------------------------------------------- one copy on Hopper


def _held_bytes(model) -> int:
    """Bytes the NVFP4 layers hold for their weights: the storages of their weight tensors (either
    layout) plus what the launchers derived from them (:func:`nvgemm.templates.common.derived.derived_nbytes`)."""
    from nvgemm.templates.common.derived import derived_nbytes

    total = 0
    for m in model.modules():
        if isinstance(m, NVFP4Linear):
            ts = [t for t in (m.weight, m.weight_scale, getattr(m, "sm90_weight", None), getattr(m, "sm90_scale", None))
                  if t is not None]
            total += sum(t.untyped_storage().nbytes() for t in ts) + derived_nbytes(ts[0])
    return total


def test_sm90_layers_held_once_at_load(ckpts, caplog):
    """Issue 22 item 14: on Hopper (the sm90 stand-in on CPU: the registry selects cutedsl_sm90 by its
    real rules, the launch is the emulated op on what it is handed) the loader holds every NVFP4 layer
    once, in the sm90 layout, and logs the bytes per layer and in total; the logits are the
    checkpoint-layout model's bit for bit, and state_dict is the checkpoint's bytes. The prepared
    layout's size is computed from the shapes: 16-row tiles, K padded to 256, K/2 + K/16 bytes a row."""
    import logging

    from nvgemm.testing import sm90_stand_in

    ckpt = ckpts[("qwen2", "NVFP4")]  # q/k/v carry a bias
    ids = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(3))
    with sm90_stand_in() as launched:
        two = load_modelopt_checkpoint(ckpt, sm90_one_copy=False, fuse_shards=False)  # the checkpoint's 14 layers
        ckpt_bytes = _held_bytes(two)
        with caplog.at_level(logging.INFO, logger="nvgemm_cutedsl"):
            one = load_modelopt_checkpoint(ckpt, fuse_shards=False)
        with torch.no_grad():
            want = two(ids).logits
            n = len(launched)
            got = one(ids).logits
        assert len(launched) == n + 14  # every layer ran on the (stand-in) kernel, none fell back
    layers = {name: m for name, m in one.named_modules() if isinstance(m, NVFP4Linear)}
    assert len(layers) == 14 and all(m.sm90_kind == "bf16" and m.weight is None for m in layers.values())
    assert torch.equal(got, want)
    one_copy = sum(-(-m.out_features // 16) * 16 * (-(-m.in_features // 256) * 256) * 9 // 16 for m in layers.values())
    assert _held_bytes(one) == one_copy
    assert _held_bytes(two) >= ckpt_bytes + one_copy  # without: the kernels' copy beside the checkpoint's
    lines = [r.getMessage() for r in caplog.records]
    for name, m in layers.items():
        mib = m.sm90_weight.numel() / 2**20 + m.sm90_scale.numel() / 2**20
        head = f"nvgemm: {name} held in the sm90 layout only: {mib:.2f} MiB"
        assert sum(line.startswith(head) for line in lines) == 1
    assert any(line.startswith(f"nvgemm: 14 NVFP4 layers held once, in the sm90 layout: {one_copy / 2**20:.2f} MiB")
               for line in lines)
    # saving re-encodes the checkpoint layout: the same bytes (this checkpoint has no zero or negative
    # block scale, the two forms the prepared layout normalises)
    sd_one, sd_two = one.state_dict(), two.state_dict()
    assert sd_one.keys() == sd_two.keys()
    for key, t in sd_two.items():
        if t.dtype == torch.float8_e4m3fn:
            n, kh = sd_two[key[: -len("_scale")]].shape
            assert bool((from_blocked(t, n, kh // 8).float() > 0).all()), f"{key}: a zero or negative block scale"
            t, sd_one[key] = t.view(torch.uint8), sd_one[key].view(torch.uint8)
        assert torch.equal(sd_one[key], t), key
    # the dequantize-and-matmul reference (the demo's) reads a held layer's re-encoded checkpoint layout
    from nvgemm.integrations.modelopt.reference import build_reference_model

    with torch.no_grad():
        assert torch.equal(build_reference_model(one)(ids).logits, build_reference_model(two)(ids).logits)
    # opting out: nothing held in the sm90 layout
    assert not any(m.sm90_kind for m in two.modules() if isinstance(m, NVFP4Linear))
