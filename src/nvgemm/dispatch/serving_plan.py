"""Which kernel the eager dispatch of ``nvgemm::nvfp4_linear`` runs for a problem, without running it.

The op picks, for each call, the highest-priority backend whose ``supports()`` accepts the problem,
and a CuTeDSL backend then picks its kernel config for the exact token count M (the policy's first
candidate). This module answers the same two questions on any host (no GPU, no cutlass), for:

* serving logs (:func:`kernel_config`: the config name a backend will use), and
* ``nvgemm precompile --checkpoint DIR --vllm``: exactly the :class:`CompileSpec` set a served
  model needs (:func:`serving_spec`), so every kernel is a cache load at warm-up.

The same for ``nvgemm::nvfp4_moe`` (:func:`moe_plan`): the MoE backend ``supports()`` picks and the two grouped
GEMM kernels it loads for a call (each grouped backend's ``picked_configs`` / ``call_specs``), and the routed
experts a served checkpoint runs on one rank (:func:`served_moe_layers`).

It mirrors ``run_sm100`` / ``run_sm90`` (the same pick functions and the same ``compile_spec_for``);
``tests/cpu/test_serving_plan.py`` checks that it names the kernel those functions would load.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Sequence

import torch

from nvgemm.core.backend import MOE, MoeProblem
from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.core.experts_layout import ExpertsLayout, expert_tensors, find_experts
from nvgemm.dispatch.registry import LinearProblem, backends
from nvgemm.core.files import checkpoint_tensors, read_json, safetensors_files
from nvgemm.templates.sm100_moe import backend as sm100_moe_backend
from nvgemm.templates.sm100_w4a4 import backend as sm100_backend
from nvgemm.templates.sm120_moe import backend as sm120_moe_backend
from nvgemm.templates.sm90_moe import backend as sm90_moe_backend
from nvgemm.templates.sm90_moe.policy import bucket_of
from nvgemm.templates.sm120_w4a4 import backend as sm120_backend
from nvgemm.templates.sm90_w4a16 import backend as sm90_backend

#: Default SM counts per capability when planning for a named target without a device.
SM_COUNT = {(10, 0): 148, (10, 3): 148, (9, 0): 132, (12, 0): 170, (12, 1): 48, (8, 9): 142, (8, 6): 72, (8, 0): 108}


#: The PTX emulator's backends (``nvgemm.emulator``, forced only, CPU tensors) that run GPU backends' kernels:
#: name -> (the W4A4 backend, the W4A16 backend, the capability of the device profile it is emulated on).
#: Their logs name the config the twin picks on that profile.
EMULATED_TWINS = {"emu_sm120": ("cutedsl_sm120", "cutedsl_mma_w4a16", (12, 0))}


@dataclass(frozen=True)
class Choice:
    backend: str
    config: object | None  # the CuTeDSL kernel config; None for backends without one
    spec: object | None  # the CompileSpec the kernel cache is asked for; None likewise
    passed_over: tuple[tuple[str, str], ...]  # (backend, reason) of higher-priority backends


def epilogue_of(p: LinearProblem) -> EpilogueSpec:
    """The epilogue spec ``check_linear_args`` builds for a call of this problem."""
    return EpilogueSpec(alpha=p.alpha, bias=p.bias, activation=p.activation, residual=p.residual,
                        out_dtype=p.out_dtype)


def _sm_count(p: LinearProblem, sm_count: int | None) -> int:
    if sm_count is not None:
        return sm_count
    if p.device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return SM_COUNT.get(tuple(p.capability or ()), 132)


def serving_spec(backend: str, p: LinearProblem, sm_count: int | None = None):
    """(config, CompileSpec) the named CuTeDSL backend (or its emulated twin) loads for ``p``; (None, None)
    for other backends."""
    if backend in EMULATED_TWINS:
        w4a4, w4a16, capability = EMULATED_TWINS[backend]
        backend, p = (w4a16 if p.weight_only else w4a4), dataclasses.replace(p, capability=capability)
    sms = _sm_count(p, sm_count)
    if backend == "cutedsl_sm100":
        arch = sm100_backend.arch_of(p.capability)
        cfg = sm100_backend._policy_config(p.m, p.n, p.k, p.out_dtype, p.activation, arch, sms)
        return cfg, (None if cfg is None else sm100_backend.compile_spec_for(cfg, epilogue_of(p), arch, sms))
    if backend in (sm90_backend.BACKEND_NAME, sm90_backend.MMA_BACKEND_NAME):
        arch = sm90_backend.arch_of(p.capability) or sm90_backend.ARCH
        cfg = sm90_backend.pick_config(p.m, p.n, p.k, p.x_dtype, p.activation, sms, arch)
        return cfg, sm90_backend.compile_spec_for(cfg, epilogue_of(p), p.x_dtype, sms, arch)
    if backend == sm120_backend.BACKEND_NAME:
        arch = sm120_backend.arch_of(p.capability)
        cfg = sm120_backend.pick_config(p.m, p.n, p.k, p.activation, arch, sms)
        return cfg, (None if cfg is None else sm120_backend.compile_spec_for(cfg, epilogue_of(p), arch))
    return None, None


def plan(p: LinearProblem, sm_count: int | None = None) -> Choice:
    """The backend (by ``supports()``; the first-use check is not run) and kernel for ``p``."""
    passed = []
    for b in backends():
        reason = b.supports(p)
        if reason is None:
            cfg, spec = serving_spec(b.name, p, sm_count)
            return Choice(b.name, cfg, spec, tuple(passed))
        passed.append((b.name, reason))
    raise RuntimeError(f"no nvgemm backend supports {p}: {passed}")


def kernel_config(backend: str, p: LinearProblem, sm_count: int | None = None) -> str | None:
    """Name of the kernel config ``backend`` runs for ``p`` (None for backends without configs)."""
    try:
        cfg, _ = serving_spec(backend, p, sm_count)
    except (ImportError, ValueError) as e:  # planning must never take a serving process down
        return f"unknown ({type(e).__name__}: {e})"
    if cfg is None:
        return None
    return cfg.name() if hasattr(cfg, "name") else str(cfg)


# ------------------------------------------------------------------------------- fused shards


def shard_runs(weight_scale_2: Sequence[float], input_scale: Sequence[float] | None) -> list[tuple[list[int], bool]]:
    """How one fused layer's shards map onto exact GEMMs: ``[(shard indices, per-column alpha)]``.

    Adjacent shards with the same ``input_scale`` (all of them for ModelOpt exports; W4A16 has none)
    share one GEMM, since one activation quantization serves them; its alpha is per-column when
    their ``weight_scale_2`` differ, else scalar. Shards with another ``input_scale`` start a new GEMM.
    """
    runs: list[list[int]] = []
    for s in range(len(weight_scale_2)):
        if runs and (input_scale is None or input_scale[s] == input_scale[runs[-1][0]]):
            runs[-1].append(s)
        else:
            runs.append([s])
    return [(r, len({weight_scale_2[s] for s in r}) > 1) for r in runs]


# ----------------------------------------------------------------------- vLLM serving shapes

#: How vLLM builds Llama/Qwen/Mistral-style decoders: fused column-parallel layers (packed modules)
#: and row-parallel layers (K split across tensor-parallel ranks). Other linears are column-parallel.
VLLM_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
VLLM_ROW_PARALLEL = ("o_proj", "down_proj")


@dataclass(frozen=True)
class ServedGemm:
    """One GEMM a vLLM tensor-parallel rank runs for a checkpoint layer."""

    layer: str
    n: int
    k: int
    weight_only: bool
    alpha: str
    bias: bool


def vllm_gemms(ckpt, tp: int = 1) -> list[ServedGemm]:
    """The GEMMs nvgemm's vLLM plugin runs on a tensor-parallel rank for a ModelOpt NVFP4 export (all
    ranks have the same shapes; a row-parallel bias is rank 0's only), read from the safetensors
    headers and the per-tensor scales."""
    from pathlib import Path

    from safetensors import safe_open

    ckpt = Path(ckpt)
    cfg = read_json(ckpt / "config.json")
    if not isinstance(cfg, dict):
        raise ValueError(f"{ckpt / 'config.json'}: holds a {type(cfg).__name__}, expected a JSON object "
                         "(a Hugging Face model config)")
    heads = int(cfg.get("num_attention_heads", 1))
    kv_heads = int(cfg.get("num_key_value_heads", heads))
    head_dim = int(cfg.get("head_dim") or cfg.get("hidden_size", heads) // heads)
    handles = []
    for f in safetensors_files(ckpt):  # regular files only: a FIFO would hang
        try:
            handles.append(safe_open(str(f), framework="pt", device="cpu"))
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
    where = {k: h for h in handles for k in h.keys()}

    def shape(key):
        return list(where[key].get_slice(key).get_shape())

    def value(key):
        return float(where[key].get_tensor(key).float().reshape(-1)[0]) if key in where else None

    layouts = find_experts(checkpoint_tensors(ckpt))
    experts = expert_tensors(layouts)  # routed experts: a fused-MoE layer each, not linears
    layers = sorted(k[: -len(".weight_scale")] for k in where if k.endswith(".weight_scale") and not experts(k)
                    and f"{k[: -len('.weight_scale')]}.weight" in where and where[k[: -len('.weight_scale')] + ".weight"]
                    .get_slice(k[: -len(".weight_scale")] + ".weight").get_dtype() == "U8")
    if not layers:
        if layouts:  # an experts-only checkpoint: its linears stay unquantized
            return []
        raise ValueError(f"no NVFP4 linear weights (uint8 .weight + .weight_scale) found in {ckpt}")
    fused_of = {f"{base}.{s}": f"{base}.{f}" for name in layers for base in [name.rsplit(".", 1)[0]]
                for f, shards in VLLM_FUSED.items() for s in shards if name.endswith("." + s)}
    groups: dict[str, list[str]] = {}
    for name in layers:
        groups.setdefault(fused_of.get(name, name), []).append(name)
    out = []
    for vname, members in groups.items():
        proj = vname.rsplit(".", 1)[-1]
        order = VLLM_FUSED.get(proj)
        if order:
            members = sorted(members, key=lambda m: order.index(m.rsplit(".", 1)[-1]))
        n_full, k_full = shape(members[0] + ".weight")[0], shape(members[0] + ".weight")[1] * 2
        row = proj in VLLM_ROW_PARALLEL
        if row and k_full % (16 * tp):
            raise ValueError(f"{vname}: K={k_full} does not split into {tp} ranks of whole 16-element blocks")
        k = k_full // tp if row else k_full
        widths = []
        for m in members:
            n = shape(m + ".weight")[0]
            short = m.rsplit(".", 1)[-1]
            if row:
                widths.append(n)
            elif short in ("k_proj", "v_proj") and kv_heads < tp:
                widths.append(head_dim)  # vLLM replicates KV heads when there are fewer than ranks
            else:
                if n % tp:
                    raise ValueError(f"{m}: N={n} does not split into {tp} ranks")
                widths.append(n // tp)
        ws2 = [value(m + ".weight_scale_2") for m in members]
        ins = [value(m + ".input_scale") for m in members]
        weight_only = all(v is None for v in ins)
        bias = any(m + ".bias" in where for m in members)
        bounds = [0]
        for w in widths:
            bounds.append(bounds[-1] + w)
        # a row-parallel layer's bias is added by rank 0 only
        for b in ([True, False] if bias and row and tp > 1 else [bias]):
            for idx, per_col in shard_runs(ws2, None if weight_only else ins):
                out.append(ServedGemm(vname, bounds[idx[-1] + 1] - bounds[idx[0]], k, weight_only,
                                      "vector" if per_col else "scalar", b))
    return out


# --------------------------------------------------------------------------------------- MoE

#: The grouped MoE backends (``BACKEND_NAME`` -> backend module with ``picked_configs``, ``call_specs``,
#: ``candidate_configs``); other MoE backends (Triton, emulated) load no AOT kernel.
MOE_KERNEL_BACKENDS = {m.BACKEND_NAME: m for m in (sm100_moe_backend, sm90_moe_backend, sm120_moe_backend)}


@dataclass(frozen=True)
class MoeChoice:
    backend: str
    configs: tuple | None  # (GEMM1, GEMM2) as the policy picks them; None for backends without configs
    specs: tuple  # the CompileSpecs of the kernels the call loads, GEMM1's first; () for backends without
    passed_over: tuple[tuple[str, str], ...]  # (backend, reason) of higher-priority backends


def moe_backend(p: MoeProblem):
    """(the MoE backend ``nvfp4_moe`` runs for ``p`` by ``supports()``, (backend, reason) of those passed over);
    the first-use check and forced backends are not applied."""
    passed = []
    for b in backends(MOE):
        reason = b.supports(p)
        if reason is None:
            return b, tuple(passed)
        passed.append((b.name, reason))
    raise RuntimeError(f"no nvgemm MoE backend supports {p}: {passed}")


def moe_plan(p: MoeProblem, sm_count: int | None = None) -> MoeChoice:
    """The backend and the grouped kernels one ``nvfp4_moe`` call of ``p`` runs (the run-time pick)."""
    b, passed = moe_backend(p)
    mod = MOE_KERNEL_BACKENDS.get(b.name)
    if mod is None:
        return MoeChoice(b.name, None, (), passed)
    sms = _sm_count(p, sm_count)
    configs = _picked(b.name, dataclasses.replace(p, m=bucket_of(p.m)[1]), sms)
    return MoeChoice(b.name, tuple(configs), tuple(mod.call_specs(p, configs, sms)), passed)


@functools.lru_cache(maxsize=4096)
def _picked(backend: str, p_hi: MoeProblem, sms: int):
    """The backend's pick at a bucket's upper M: every M of the bucket runs it (the grouped policies pick one
    pair per bucket, :func:`~nvgemm.templates.sm90_moe.policy.bucket_of`), so planning 1..max M prices each
    bucket once."""
    return MOE_KERNEL_BACKENDS[backend].picked_configs(p_hi, sms)


def moe_candidate_specs(p: MoeProblem, ms, sm_count: int | None, max_candidates: int) -> tuple[str, list]:
    """(backend, [(candidate index, GEMM index 0 | 1, CompileSpec)]) of the policy's first ``max_candidates``
    (GEMM1, GEMM2) candidates at ``p.m`` (a bucket's upper M), each as the calls of every token count in ``ms``
    launch it; [] when the backend builds no grouped kernel."""
    b, _ = moe_backend(p)
    mod = MOE_KERNEL_BACKENDS.get(b.name)
    if mod is None:
        return b.name, []
    sms = _sm_count(p, sm_count)
    out = []
    for i, configs in enumerate(mod.candidate_configs(p, sms, max_candidates)):
        for m in ms:
            out += [(i, g, s) for g, s in enumerate(mod.call_specs(dataclasses.replace(p, m=m), configs, sms))]
    return b.name, out


def checkpoint_top_k(ckpt) -> int:
    """Experts per token of a checkpoint's MoE layers (``num_experts_per_tok`` of its ``config.json``)."""
    from pathlib import Path

    path = Path(ckpt) / "config.json"
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: holds a {type(cfg).__name__}, expected a JSON object (a Hugging Face model config)")
    for c in (cfg, cfg.get("text_config")):
        if isinstance(c, dict) and isinstance(c.get("num_experts_per_tok"), int) and c["num_experts_per_tok"] > 0:
            return c["num_experts_per_tok"]
    raise ValueError(f"{path}: the checkpoint has routed experts but no positive integer num_experts_per_tok "
                     "(experts per token)")


@dataclass(frozen=True)
class ServedMoe:
    """The routed experts of one MoE layer as a serving rank runs them (``nvfp4_moe``'s problem, M aside)."""

    layer: str
    num_experts: int  # local experts on the rank
    num_global_experts: int
    top_k: int
    hidden: int
    intermediate: int  # per rank
    gated: bool
    weight_only: bool
    alpha13: str  # "expert" | "row" (an expert's gate and up weight_scale_2 differ)
    expert_map: bool  # the router's global ids reach the op with an expert map (vLLM expert parallelism)

    def problem(self, m: int, capability, x_dtype: torch.dtype, activation: str | None = None) -> MoeProblem:
        return MoeProblem(m=m, top_k=self.top_k, num_experts=self.num_experts,
                          num_global_experts=self.num_global_experts, hidden=self.hidden,
                          intermediate=self.intermediate, activation=activation or "silu_mul",
                          weight_only=self.weight_only, alpha13=self.alpha13, x_dtype=x_dtype, out_dtype=x_dtype,
                          device_type="cuda", capability=tuple(capability), router_weight_on_input=False,
                          expert_map=self.expert_map, shared_out=False, residual=False)


def _alpha13(where: dict, lay: ExpertsLayout) -> str:
    """"row" when some expert's gate and up ``weight_scale_2`` differ (the serving loaders then keep a per-row
    alpha), else "expert". ``where``: tensor name -> open safetensors file."""
    for g, u in lay.gate_up_scale_2:
        if g in where and u in where and not torch.equal(where[g].get_tensor(g).float().reshape(-1)[:1],
                                                         where[u].get_tensor(u).float().reshape(-1)[:1]):
            return "row"
    return "expert"


def checkpoint_moe_layers(ckpt) -> list[ExpertsLayout]:
    """The routed-experts modules of a checkpoint folder (:func:`nvgemm.core.experts_layout.find_experts`)."""
    return find_experts(checkpoint_tensors(ckpt))


def served_moe_layers(ckpt, tp: int = 1, expert_parallel: bool = False, engine: str = "vllm") -> list[ServedMoe]:
    """The routed-experts problems nvgemm's vLLM / SGLang plugin runs on one rank of ``tp``: tensor parallel
    experts hold ``I / tp`` of every expert; expert parallel ones (``expert_parallel``: the experts spread over the
    ``tp`` ranks) hold whole experts, ``E // tp`` or one more on the first ``E % tp`` ranks (vLLM routes global
    ids through an expert map, SGLang hands the op local ids). Identical problems are reported once."""
    out = []
    layouts = checkpoint_moe_layers(ckpt)
    top_k = checkpoint_top_k(ckpt) if layouts else 0
    where = {}
    if any(lay.gate_up_scale_2 for lay in layouts):
        from safetensors import safe_open

        for f in safetensors_files(ckpt):
            try:
                h = safe_open(str(f), framework="pt", device="cpu")
            except Exception as e:  # safetensors raises its own error types for corrupt files
                raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
            where.update({k: h for k in h.keys()})
    for lay in layouts:
        if expert_parallel:
            if lay.num_experts < tp:
                raise ValueError(f"experts {lay.prefix}: {lay.num_experts} experts cannot spread over {tp} ranks")
            base, extra = divmod(lay.num_experts, tp)
            locals_, inter = ([base + 1] if extra else []) + [base], lay.intermediate
        else:
            if lay.intermediate % (16 * tp):
                raise ValueError(f"experts {lay.prefix}: I={lay.intermediate} does not split into {tp} ranks of whole "
                                 "16-element blocks")
            locals_, inter = [lay.num_experts], lay.intermediate // tp
        alpha = _alpha13(where, lay)
        for e in locals_:
            out.append(ServedMoe(lay.prefix, e, lay.num_experts, top_k, lay.hidden, inter, lay.gated, lay.weight_only,
                                 alpha, expert_parallel and engine == "vllm"))
    seen: dict = {}
    for s in out:
        seen.setdefault(dataclasses.replace(s, layer=""), s)
    return list(seen.values())
