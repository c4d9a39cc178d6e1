"""ModelOpt 0.47 MoE exports (Qwen3-MoE, Mixtral, DeepSeek-V3, Llama-4, NemotronH; W4A4 and W4A16), built and
exported at test time, load into nvgemm and match an independent fp64 reference built straight from
the safetensors; the anchors' loader bugs (moe_nvfp4.md section 6) each have a test here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from _moe_reference import Q, RefExpert, moe_tolerance, ref_expert_fp64, ref_moe_fp64
from _reference import ref_linear_fp64
from safetensors.torch import load_file, save_file

pytest.importorskip("modelopt")
pytest.importorskip("transformers")

from nvgemm import NVFP4Linear  # noqa: E402
from nvgemm.core.formats import dequantize  # noqa: E402
from nvgemm.integrations.modelopt import CheckpointError, load_modelopt_checkpoint  # noqa: E402
from nvgemm.nn.experts import NVFP4Experts  # noqa: E402
from nvgemm.testing import build_tiny_model, make_tiny_checkpoint  # noqa: E402

KINDS = ("qwen3_moe", "mixtral", "deepseek_v3", "llama4", "nemotron_h")
# default run: every family in W4A4 and Llama-4 (stacked) in W4A16; the other W4A16 exports are slow
# (the per-expert W4A16 path is the same loader code, and the op's W4A16 path is in test_moe_op)
CASES = [pytest.param(k, a, marks=() if (a == "NVFP4" or k == "llama4") else pytest.mark.slow)
         for k in KINDS for a in ("NVFP4", "W4A16_NVFP4")]
# NVIDIA's experts-only recipe (Kimi-K2.x, MiniMax-M2.x NVFP4): routed experts NVFP4, all else BF16
CASES.append(pytest.param("deepseek_v3", "NVFP4_EXPERTS_ONLY", marks=pytest.mark.slow))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_ckpts")
    made = {}

    def get(kind, algo):
        if (kind, algo) not in made:
            made[(kind, algo)] = make_tiny_checkpoint(root / f"{kind}_{algo}", kind, algo)
        return made[(kind, algo)]

    return get


# ----------------------------------------------------------------------------- the reference


def _alias(key: str) -> str:
    """Checkpoint name -> transformers 5 module name (Mixtral's block_sparse_moe, NemotronH's backbone)."""
    key = key.replace(".block_sparse_moe.", ".mlp.")
    return "model." + key[len("backbone."):] if key.startswith("backbone.") else key


def _src(sd: dict, name: str) -> str:
    """The checkpoint spelling of module ``name``."""
    for c in (name, name.replace(".mlp.", ".block_sparse_moe."), "backbone." + name[len("model."):]):
        if any(k.startswith(c + ".") for k in sd):
            return c
    return name


def _q(sd, p):
    return Q(sd[f"{p}.weight"], sd[f"{p}.weight_scale"])


def ref_experts_from_sd(sd: dict, prefix: str) -> list[RefExpert]:
    """Reference experts read straight from the export (no nvgemm loader code)."""
    if f"{prefix}.gate_up_proj" in sd:  # Llama-4: [E, K/2, N] bytes, [E, K/16, N] scales, one scale_2
        out = []
        gu, gus = sd[f"{prefix}.gate_up_proj"], sd[f"{prefix}.gate_up_proj_weight_scale"]
        dn, dns = sd[f"{prefix}.down_proj"], sd[f"{prefix}.down_proj_weight_scale"]
        for e in range(gu.shape[0]):
            out.append(RefExpert(
                Q(gu[e].t().contiguous(), gus[e].t().contiguous()),
                sd[f"{prefix}.gate_up_proj_weight_scale_2"], sd.get(f"{prefix}.gate_up_proj_input_scale"),
                Q(dn[e].t().contiguous(), dns[e].t().contiguous()),
                sd[f"{prefix}.down_proj_weight_scale_2"], sd.get(f"{prefix}.down_proj_input_scale")))
        return out
    g, u, d = ("w1", "w3", "w2") if f"{prefix}.0.w1.weight" in sd else ("gate_proj", "up_proj", "down_proj")
    out, e = [], 0
    if f"{prefix}.0.{g}.weight" not in sd:  # non-gated (NemotronH): up, down
        while f"{prefix}.{e}.up_proj.weight" in sd:
            pu, pd = f"{prefix}.{e}.up_proj", f"{prefix}.{e}.down_proj"
            out.append(RefExpert(_q(sd, pu), sd[f"{pu}.weight_scale_2"], sd.get(f"{pu}.input_scale"), _q(sd, pd),
                                 sd[f"{pd}.weight_scale_2"], sd.get(f"{pd}.input_scale")))
            e += 1
        return out
    while f"{prefix}.{e}.{g}.weight" in sd:
        pg, pu, pd = (f"{prefix}.{e}.{n}" for n in (g, u, d))
        ws2 = torch.cat([sd[f"{pg}.weight_scale_2"].reshape(1).expand(sd[f"{pg}.weight"].shape[0]),
                         sd[f"{pu}.weight_scale_2"].reshape(1).expand(sd[f"{pu}.weight"].shape[0])])
        gin, uin = sd.get(f"{pg}.input_scale"), sd.get(f"{pu}.input_scale")
        assert (gin is None and uin is None) or torch.equal(gin, uin)  # same input
        out.append(RefExpert(Q(torch.cat([sd[f"{pg}.weight"], sd[f"{pu}.weight"]]),
                               torch.cat([sd[f"{pg}.weight_scale"], sd[f"{pu}.weight_scale"]])),
                             ws2, gin, _q(sd, pd), sd[f"{pd}.weight_scale_2"], sd.get(f"{pd}.input_scale")))
        e += 1
    return out


class RefLinear(torch.nn.Module):
    def __init__(self, sd, p):
        super().__init__()
        self.q, self.ws2, self.ins = _q(sd, p), sd[f"{p}.weight_scale_2"].float(), sd.get(f"{p}.input_scale")

    def forward(self, x):
        y, _ = ref_linear_fp64(x, self.q, self.ws2, self.ins, None, None, "none", x.dtype)
        return y.to(x.dtype)


class RefFusedExperts(torch.nn.Module):
    """transformers 5 experts interface: fp64 per pair, fp64 sum over slots, one rounding."""

    def __init__(self, experts, activation):
        super().__init__()
        self.experts, self.activation = experts, activation

    def forward(self, x, top_k_index, top_k_weights):
        return ref_moe_fp64(x, top_k_index, top_k_weights.double(), self.experts, self.activation).to(x.dtype)


class RefLlama4Moe(torch.nn.Module):
    """Llama-4 block: HF router (sigmoid of the top-1 logit) and shared expert; the score scales the
    expert input (HF: ``routed_in = hidden * score``, rounded to bf16); routed fp64 output plus the
    shared expert's output, rounded once (HF rounds the routed output first: one more rounding)."""

    def __init__(self, block, experts):
        super().__init__()
        self.router, self.shared_expert, self.experts = block.router, block.shared_expert, experts

    def forward(self, hidden):
        x = hidden.reshape(-1, hidden.shape[-1])
        scores, logits = self.router(x)
        out = self.shared_expert(x).double()
        for t in range(x.shape[0]):
            e = int(scores[t].argmax())
            xin = (x[t : t + 1].double() * float(scores[t, e])).to(x.dtype)
            out[t] += ref_expert_fp64(xin, self.experts[e], "silu_mul")[0]
        return out.to(x.dtype), logits


def reference_model(ckpt: Path):
    """The HF model (its own routers and blocks) with every quantized module computed in fp64 from the export."""
    from transformers import AutoConfig, AutoModelForCausalLM

    sd = load_file(str(ckpt / "model.safetensors"))
    config = AutoConfig.from_pretrained(str(ckpt))
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ck = {_alias(k): k for k in sd}
    used = set()
    for name, mod in list(model.named_modules()):
        parent, _, child = name.rpartition(".")
        src = _src(sd, name)
        if not (f"{src}.weight_scale" in sd or f"{src}.0.w1.weight" in sd or f"{src}.0.up_proj.weight" in sd
                or f"{src}.gate_up_proj" in sd):
            continue
        if isinstance(mod, torch.nn.Linear):
            new = RefLinear(sd, src)
        elif type(mod).__name__ == "Llama4TextExperts":
            block = model.get_submodule(parent)
            gp, _, pc = parent.rpartition(".")
            setattr(model.get_submodule(gp), pc, RefLlama4Moe(block, ref_experts_from_sd(sd, src)))
            used.add(name)
            continue
        elif hasattr(mod, "gate_up_proj"):
            new = RefFusedExperts(ref_experts_from_sd(sd, src), "silu_mul")
        elif hasattr(mod, "up_proj"):  # NemotronH: non-gated, act_fn relu2 (the config's mlp_hidden_act)
            assert type(mod.act_fn).__name__ == "ReLUSquaredActivation"
            new = RefFusedExperts(ref_experts_from_sd(sd, src), "relu2")
        else:
            continue
        setattr(model.get_submodule(parent), child, new)
        used.add(name)
    plain = {a: sd[k] for a, k in ck.items() if not any(a.startswith(u + ".") for u in used)}
    _, unexpected = model.load_state_dict(plain, strict=False)
    assert not unexpected, unexpected
    return model, sd


# Tolerances. Per MoE layer (same inputs): moe_tolerance (_moe_reference.py: output rounding plus
# rare one-ulp moves of the intermediate's rounding). Logits: both models compute every quantized
# module from the same bytes, nvgemm in fp32 with the contract's roundings, the reference in fp64;
# they agree except where a sum lands on the other side of a bf16 rounding boundary, which can move
# later FP4 activation codes and propagates through two layers and the router's top-k (a flip of
# a near-tied expert choice). Bound: 2% of the logit range, as for dense models (a wrong
# scale, layout, expert or slot weight is O(100%)).
LOGIT_RTOL = 0.02


def _moe_calls(model):
    """Capture every NVFP4Experts call (args, kwargs, output) during a forward."""
    calls = []
    hooks = [m.register_forward_hook(lambda mod, a, kw, out: calls.append((mod, a, kw, out)), with_kwargs=True)
             for m in model.modules() if isinstance(m, NVFP4Experts)]
    return calls, hooks


def _prefix_of(model, mod):
    name = next(n for n, m in model.named_modules() if m is mod)
    return name


@pytest.mark.parametrize("kind,algo", CASES)
def test_moe_export_matches_fp64_reference(ckpts, kind, algo):
    ckpt = ckpts(kind, algo)
    model = load_modelopt_checkpoint(ckpt, fuse_shards=False)  # the checkpoint's layers, by name
    moe = [m for m in model.modules() if isinstance(m, NVFP4Experts)]
    assert len(moe) == (1 if kind in ("deepseek_v3", "nemotron_h") else 2)
    assert all(m.activation == ("relu2" if kind == "nemotron_h" else "silu_mul") for m in moe)
    assert all(m.weight_only == (algo == "W4A16_NVFP4") for m in moe)
    # shared experts, dense MLPs and attention are NVFP4Linear; routers stay unquantized
    lin = {n for n, m in model.named_modules() if isinstance(m, NVFP4Linear)}
    assert not any(n.endswith((".gate", ".router")) for n in lin)
    if algo == "NVFP4_EXPERTS_ONLY":
        assert not lin  # attention, shared expert and dense MLP stay BF16 nn.Linear
    elif kind == "deepseek_v3":
        assert {"model.layers.0.mlp.gate_proj", "model.layers.1.mlp.shared_experts.down_proj"} <= lin
        assert model.model.layers[1].mlp.gate.weight.dtype == torch.float32  # router stays fp32
    if kind == "llama4":
        assert "model.layers.0.feed_forward.shared_expert.up_proj" in lin
    ref, sd = reference_model(ckpt)
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    calls, hooks = _moe_calls(model)
    with torch.no_grad():
        got = model(ids).logits.float()
        want = ref(ids).logits.float()
    for h in hooks:
        h.remove()
    # per MoE layer, on the inputs the nvgemm model saw: the op vs the fp64 reference
    for mod, args, kw, out in calls:
        prefix = _prefix_of(model, mod)
        x, tid, tw = args
        r = ref_moe_fp64(x, tid, tw.double(), ref_experts_from_sd(sd, _src(sd, prefix)), mod.activation,
                         mod.router_weight_on_input,
                         None, kw.get("shared_out"), None)
        err = (out.double() - r).abs()
        tol = moe_tolerance(r)
        assert bool((err <= tol).all()), f"{prefix}: max err {err.max():.3g}, ratio {(err / tol).max():.3g}"
    assert len(calls) == len(moe)
    if kind == "deepseek_v3":  # routed_scaling_factor (2.5) reaches the op through the caller's weights
        tw = calls[0][1][2].double()  # (vLLM #43769/#44007 dropped it inside monolithic kernels)
        torch.testing.assert_close(tw.sum(-1), torch.full_like(tw[:, 0], 2.5), rtol=2**-7, atol=0)
    diff = (got - want).abs().max().item()
    assert diff <= LOGIT_RTOL * want.abs().max().item(), f"max |logit diff| {diff:.4g}"


@pytest.mark.parametrize("kind", KINDS)
def test_expert_weights_decode_to_the_bf16_weights(ckpts, kind):
    """The loaded experts dequantize to the model's own BF16 weights before quantization (block
    quantization error only: <= half an FP4 step, i.e. <= 1/6 of a block's amax plus the e4m3 scale
    rounding); a transposed, nibble-swapped or gate/up-swapped reading is O(1) off."""
    model = load_modelopt_checkpoint(ckpts(kind, "NVFP4"))
    orig = build_tiny_model(kind, 0)
    for name, mod in model.named_modules():
        if not isinstance(mod, NVFP4Experts):
            continue
        hf = orig.get_submodule(name)
        w13 = (hf.up_proj if kind == "nemotron_h" else hf.gate_up_proj).detach().float()
        w2 = hf.down_proj.detach().float()
        if kind == "llama4":  # BMM layout [E, H, 2I], [E, I, H]
            w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
        d13, d2 = mod.dequantized()
        for d, w in ((d13, w13), (d2, w2)):
            blocks = w.reshape(*w.shape[:-1], -1, 16)
            amax = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-12)
            rel = ((d.reshape(blocks.shape) - blocks).abs() / amax).max().item()
            assert rel <= 0.2, f"{name}: max error / block amax {rel:.3f}"


# ----------------------------------------------------------------------------- edited exports


def _edit(ckpt: Path, tmp: Path, fn, cfg_fn=None) -> Path:
    out = tmp / "edited"
    shutil.copytree(ckpt, out)
    sd = load_file(str(out / "model.safetensors"))
    fn(sd)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    if cfg_fn is not None:
        p = out / "hf_quant_config.json"
        q = json.loads(p.read_text())
        cfg_fn(q["quantization"])
        p.write_text(json.dumps(q))
    return out


def _layer_check(ckpt: Path, prefix: str, expect_row_alpha=None, expect_ins=None):
    model = load_modelopt_checkpoint(ckpt)
    sd = load_file(str(ckpt / "model.safetensors"))
    mod = model.get_submodule(prefix)
    if expect_row_alpha is not None:
        assert (mod.w13_scale_2.dim() == 2) == expect_row_alpha
    if expect_ins is not None:
        assert torch.equal(mod.w13_input_scale, expect_ins)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, mod.hidden_size, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, mod.num_experts, (7, 2), generator=g, dtype=torch.int32)
    wts = torch.rand(7, 2, generator=g)
    out = mod(x, ids, wts)
    ref = ref_moe_fp64(x, ids, wts, ref_experts_from_sd(sd, prefix))
    err = (out.double() - ref).abs()
    assert bool((err <= moe_tolerance(ref)).all()), f"max err {err.max():.3g}"
    return mod


def test_unequal_per_expert_input_scales_stay_exact(ckpts, tmp_path):
    """Older exports (vLLM PR #26135; TRT-LLM/FlashInfer collapse to one max): per-expert input scales differ."""
    p = "model.layers.1.mlp.experts"

    def edit(sd):
        for e in range(8):
            for proj, f in (("gate_proj", 1 + 0.5 * e), ("up_proj", 1 + 0.5 * e), ("down_proj", 2.0 - 0.2 * e)):
                sd[f"{p}.{e}.{proj}.input_scale"] = sd[f"{p}.{e}.{proj}.input_scale"] * f

    ck = _edit(ckpts("qwen3_moe", "NVFP4"), tmp_path, edit)
    sd = load_file(str(ck / "model.safetensors"))
    want = torch.stack([sd[f"{p}.{e}.gate_proj.input_scale"] for e in range(8)])
    mod = _layer_check(ck, p, expect_ins=want)
    assert torch.equal(mod.w2_input_scale, torch.stack([sd[f"{p}.{e}.down_proj.input_scale"] for e in range(8)]))


def test_unequal_gate_up_weight_scale_2_stays_exact(ckpts, tmp_path):
    """vLLM 0.32 ModelOptNvFp4FusedMoE keeps only w1's weight_scale_2 (warning); nvgemm keeps both (per-row alpha)."""
    p = "model.layers.0.mlp.experts"

    def edit(sd):
        sd[f"{p}.3.up_proj.weight_scale_2"] = sd[f"{p}.3.up_proj.weight_scale_2"] * 1.75

    mod = _layer_check(_edit(ckpts("qwen3_moe", "NVFP4"), tmp_path, edit), p, expect_row_alpha=True)
    i = mod.intermediate_size
    assert float(mod.w13_scale_2[3, i]) == pytest.approx(1.75 * float(mod.w13_scale_2[3, 0]), rel=1e-6)


def test_mixtral_hub_names_and_unequal_w1_w3(ckpts, tmp_path):
    """Mixtral's w1/w3/w2 hub names; the w3 (up) slot of the gate/up pair is kept, not clobbered by w1
    (NeMo-RL PR #2983: a loader wrote param[expert] and lost one shard)."""
    p = "model.layers.1.block_sparse_moe.experts"

    def edit(sd):
        for e in range(4):
            sd[f"{p}.{e}.w3.weight_scale_2"] = sd[f"{p}.{e}.w3.weight_scale_2"] * (1.5 + 0.25 * e)

    ck = _edit(ckpts("mixtral", "NVFP4"), tmp_path, edit)
    model = load_modelopt_checkpoint(ck)
    mod = model.get_submodule("model.layers.1.mlp.experts")
    sd = load_file(str(ck / "model.safetensors"))
    i = mod.intermediate_size
    for e in range(4):
        assert float(mod.w13_scale_2[e, 0]) == float(sd[f"{p}.{e}.w1.weight_scale_2"])
        assert float(mod.w13_scale_2[e, i]) == float(sd[f"{p}.{e}.w3.weight_scale_2"])
        d13, _ = mod.dequantized()
        w3 = dequantize(sd[f"{p}.{e}.w3.weight"], sd[f"{p}.{e}.w3.weight_scale"], sd[f"{p}.{e}.w3.weight_scale_2"])
        assert torch.equal(d13[e, i:], w3)


def test_router_missing_from_exclude_modules_stays_unquantized(ckpts, tmp_path):
    """ModelOpt < 0.45 omitted routers from exclude_modules (vLLM load failure); nvgemm reads routers from the model."""
    def cfg(q):
        q["exclude_modules"] = [m for m in q["exclude_modules"] if not m.endswith(("router", "gate"))]

    ck = _edit(ckpts("llama4", "NVFP4"), tmp_path, lambda sd: None, cfg)
    model = load_modelopt_checkpoint(ck)
    r = model.get_submodule("model.layers.0.feed_forward.router")
    assert type(r).__name__ == "Llama4Router" and r.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("edit,msg", [
    (lambda sd: sd.pop("model.layers.1.mlp.experts.5.up_proj.weight_scale"),
     "missing tensor model.layers.1.mlp.experts.5.up_proj.weight_scale"),
    (lambda sd: sd.__setitem__("model.layers.1.mlp.experts.8.down_proj.weight",
                               sd["model.layers.1.mlp.experts.7.down_proj.weight"].clone()),
     "unexpected tensor model.layers.1.mlp.experts.8.down_proj.weight"),
    (lambda sd: sd.__setitem__("model.layers.0.mlp.experts.2.gate_proj.input_scale",
                               sd["model.layers.0.mlp.experts.2.gate_proj.input_scale"] * 2),
     "experts model.layers.0.mlp.experts: .*expert 2 gate/up.*unequal input_scale"),
    (lambda sd: sd.__setitem__("model.layers.0.mlp.experts.1.down_proj.weight",
                               sd["model.layers.0.mlp.experts.1.down_proj.weight"][:, :8].contiguous()),
     r"tensor model.layers.0.mlp.experts.1.down_proj.weight: shape \(64, 8\), expected \(64, 16\)"),
])
def test_bad_moe_tensors_named(ckpts, tmp_path, edit, msg):
    """Fused-expert tensors dropped or mis-mapped (vLLM #49638, PR #40888) are errors naming the tensor."""
    with pytest.raises(CheckpointError, match=msg):
        load_modelopt_checkpoint(_edit(ckpts("qwen3_moe", "NVFP4"), tmp_path, edit))


def test_llama4_stacked_tensor_errors(ckpts, tmp_path):
    p = "model.layers.0.feed_forward.experts"

    def edit(sd):
        sd[f"{p}.down_proj_weight_scale"] = sd[f"{p}.down_proj_weight_scale"][:, :1].contiguous()

    with pytest.raises(CheckpointError, match=rf"tensor {p}.down_proj_weight_scale: .*\(4, 1, 64\), expected"):
        load_modelopt_checkpoint(_edit(ckpts("llama4", "NVFP4"), tmp_path, edit))


def test_stacked_untransposed_per_expert_scales(ckpts, tmp_path):
    """The transformers-5 fused 3-D layout written stacked (``gate_up_proj [E, 2I, H/2]``) with
    per-expert ``weight_scale_2`` / ``input_scale`` vectors loads and matches the per-expert export."""
    src = ckpts("qwen3_moe", "NVFP4")
    p = "model.layers.1.mlp.experts"

    def edit(sd):
        for proj, parts in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            sd[f"{p}.{proj}"] = torch.stack([torch.cat([sd.pop(f"{p}.{e}.{q}.weight") for q in parts]) for e in range(8)])
            sd[f"{p}.{proj}_weight_scale"] = torch.stack(
                [torch.cat([sd.pop(f"{p}.{e}.{q}.weight_scale") for q in parts]) for e in range(8)])
            for t in ("weight_scale_2", "input_scale"):
                vals = [[sd.pop(f"{p}.{e}.{q}.{t}") for q in parts] for e in range(8)]
                sd[f"{p}.{proj}_{t}"] = torch.stack([v[0] for v in vals])

    ck = _edit(src, tmp_path, edit)
    a = load_modelopt_checkpoint(src).get_submodule(p)
    b = load_modelopt_checkpoint(ck).get_submodule(p)
    for x, y in zip(a.tensors(), b.tensors()):
        assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                           y.view(torch.uint8) if y.element_size() == 1 else y)
