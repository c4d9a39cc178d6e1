"""The engine-agnostic serving layer shared by nvgemm's vLLM and SGLang plugins (pure torch: no engine import).

Both engines hand a quantized linear layer to its quant method as one (possibly fused) weight: q/k/v
or gate/up shards concatenated along N, each shard with its own checkpoint ``weight_scale_2`` and
(W4A4) ``input_scale``, in the same parameter names and shapes (SGLang's linear layers descend from
vLLM's). :func:`plan_gemms` turns that into the fewest exact ``nvgemm::nvfp4_linear`` calls:

* all shards share ``input_scale`` (always true for ModelOpt exports, which equalize it) ->
  **one GEMM**; its ``weight_scale_2`` is a scalar when the shards' are equal (ModelOpt's case:
  the scalar-alpha kernels) and otherwise a per-output-column vector (the exact per-column alpha;
  no re-quantization);
* shards with different ``input_scale`` (independently quantized shards) cannot share one
  activation quantization, so each run of adjacent shards with equal ``input_scale`` becomes its
  own GEMM and the outputs are concatenated; still exact.

This is the checkpoint's math, shard by shard: ``out[:, shard] = alpha_s * deq(q(x, is_s)) @
deq(W_s).T + b_s`` (nvgemm's format contract), which both engines' own loaders only approximate when
shard scales differ (they keep ``max(weight_scale_2)`` and ``max(input_scale)``).

:class:`ServedLinear` is one served layer, engine-agnostic: the parameters it registers (through the
engine's own parameter classes and loaders), the plan, the sm90 one-copy layout, the warm-up, the
one load log line and ``apply``. An adapter (``nvgemm.integrations.vllm.method``,
``nvgemm.integrations.sglang.method``) only supplies what its engine decides: the parameter classes,
the activation dtype, the token counts to warm up (:func:`warmup_sizes` of the engine's graph sizes and
token budget), the tensor-parallel rank for dumps (:func:`dump_call`). The routed experts of MoE layers
have their shared part in :mod:`nvgemm.integrations.serving_moe`.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from nvgemm import settings
from nvgemm.core.formats import NVFP4, check_block_scales, to_blocked
from nvgemm.dispatch.registry import _CHECKED, LinearProblem, backends, select_backend
from nvgemm.dispatch.serving_plan import kernel_config, shard_runs
from nvgemm.heuristics import m_buckets
from nvgemm.ops.prepared import one_copy_wanted
from nvgemm.ops.prepared import sm90_serve_reason as serve_reason
from nvgemm.templates.common.derived import derived_nbytes
from nvgemm.templates.sm90_w4a16.config import CHUNK, K_ALIGN, ROW_TILE
from nvgemm.templates.sm90_w4a16.operand import kind_of, prepare_sm90_weight

log = logging.getLogger("nvgemm_cutedsl.serving")


@dataclass
class Gemm:
    """One ``nvfp4_linear`` call covering output rows ``[start, stop)`` of the layer's weight."""

    start: int
    stop: int
    weight_scale: torch.Tensor  # 128x4-swizzled e4m3 of rows [start, stop), tiled shape (formats.blocked_shape)
    weight_scale_2: torch.Tensor  # fp32 () or (stop - start,)
    input_scale: torch.Tensor | None  # fp32 () ; None = weight-only (W4A16)
    tiles: tuple[int, int] | None = None  # held once (:func:`hold_sm90`): row tiles of the sm90 layout; no weight_scale

    @property
    def alpha(self) -> str:
        return "vector" if self.weight_scale_2.dim() == 1 else "scalar"


def _per_shard(t: torch.Tensor, shards: int, name: str, layer: str) -> torch.Tensor:
    t = t.detach().float().reshape(-1)
    if t.numel() == 1 and shards > 1:
        t = t.expand(shards)
    if t.numel() != shards:
        raise ValueError(f"nvgemm layer {layer}: {name} has {t.numel()} values for {shards} shards")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise ValueError(f"nvgemm layer {layer}: {name} = {t.tolist()} is not a positive finite scale "
                         "(was it loaded? the checkpoint may store this layer unquantized)")
    return t


def plan_gemms(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor | None,
    widths: Sequence[int],
    layer: str = "?",
) -> list[Gemm]:
    """Split a (fused) layer into exact GEMMs; see the module docstring.

    ``weight`` uint8 [N, K/2]; ``weight_scale`` e4m3 [N, K/16] (linear layout, as in the
    checkpoint); ``weight_scale_2`` / ``input_scale`` one fp32 value per shard; ``widths`` the
    shards' output sizes (sum N).
    """
    if weight.dtype != torch.uint8 or weight.dim() != 2:
        raise ValueError(f"nvgemm layer {layer}: weight must be uint8 [N, K/2], got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    n, k = weight.shape[0], weight.shape[1] * 2
    if k % NVFP4.block_size:
        raise ValueError(f"nvgemm layer {layer}: per-rank K={k} is not a multiple of {NVFP4.block_size}")
    if tuple(weight_scale.shape) != (n, k // NVFP4.block_size) or weight_scale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"nvgemm layer {layer}: weight_scale must be float8_e4m3fn {(n, k // 16)}, got "
                         f"{weight_scale.dtype} {tuple(weight_scale.shape)}")
    widths = [int(w) for w in widths]
    if sum(widths) != n or any(w <= 0 for w in widths):
        raise ValueError(f"nvgemm layer {layer}: shard widths {widths} do not add up to N={n}")
    try:
        check_block_scales(weight_scale, f"nvgemm layer {layer}: weight_scale")  # same rule as the loader
    except ValueError as e:
        raise ValueError(f"{e}. (NaN can also mean the scale was never loaded: a checkpoint storing this "
                         "layer unquantized needs it in exclude_modules)") from None
    shards = len(widths)
    ws2 = _per_shard(weight_scale_2, shards, "weight_scale_2", layer)
    ins = None if input_scale is None else _per_shard(input_scale, shards, "input_scale", layer)
    bounds = [0]
    for w in widths:
        bounds.append(bounds[-1] + w)

    gemms = []
    for run, per_column in shard_runs(ws2.tolist(), None if ins is None else ins.tolist()):
        start, stop = bounds[run[0]], bounds[run[-1] + 1]
        if per_column:
            w2_t = torch.cat([ws2[s].expand(widths[s]) for s in run]).contiguous()
        else:
            w2_t = ws2[run[0]].clone().reshape(())
        gemms.append(Gemm(start, stop, to_blocked(weight_scale[start:stop].contiguous()), w2_t.to(weight.device),
                          None if ins is None else ins[run[0]].clone().reshape(()).to(weight.device)))
    return gemms


class LoadTracker:
    """Records which parameter shards the engine's weight loaders filled, so a layer never serves memory that
    no checkpoint tensor was written to (``create_weights`` allocates ``weight`` with ``torch.empty``).

    vLLM and SGLang call ``param.weight_loader(param, loaded_weight[, shard_id])`` once per checkpoint tensor:
    once per shard of a fused layer (shard id "q"/"k"/"v" or 0, 1, ...), once with no shard id when
    the checkpoint holds the fused tensor. :meth:`wrap` returns a loader that records the call and
    forwards it; :meth:`check` raises naming every parameter or shard that was never loaded.
    """

    def __init__(self, layer: str, shards: int):
        self.layer, self.shards = layer, shards
        self.loaded: dict[str, set] = {}
        self.untracked = False

    def wrap(self, name: str, loader):
        if loader is None:  # the engine gave no loader: nothing to track (the NaN-initialised scales still are)
            self.untracked = True
            return None

        def load(param, loaded_weight, *args, **kwargs):
            shard = args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
            out = loader(param, loaded_weight, *args, **kwargs)
            self.loaded.setdefault(name, set()).add(shard)  # after the copy succeeded
            return out

        return load

    def missing(self, names: Iterable[str]) -> list[str]:
        out = []
        for name in names:
            got = self.loaded.get(name, set())
            if None in got or len(got) >= self.shards:
                continue
            out.append(name if not got else f"{name} (loaded shards {sorted(map(str, got))} of {self.shards})")
        return out

    def check(self, names: Iterable[str]) -> None:
        missing = [] if self.untracked else self.missing(names)
        if missing:
            raise ValueError(
                f"nvgemm layer {self.layer}: never loaded from the checkpoint: {', '.join(missing)}; the layer "
                "would compute on uninitialised memory (is a shard missing from the checkpoint, or the layer "
                "stored unquantized? then list it in the quantization config's ignore / exclude_modules)")


def note_unserved_checkpoint(hf_quant_cfg, engine: str = "vLLM") -> str | None:
    """One log line when ``engine`` is about to serve an NVFP4 checkpoint nvgemm does not take over
    (returned for tests); None for anything else. nvgemm's plugins serve ModelOpt exports
    (``modelopt_fp4`` / ``modelopt_mixed``); a compressed-tensors ``nvfp4-pack-quantized`` checkpoint
    stays on the engine's own compressed-tensors path, which without this line would look like nvgemm
    serving it."""
    if not isinstance(hf_quant_cfg, dict):
        return None
    method = str(hf_quant_cfg.get("quant_method", "")).lower().replace("_", "-")
    if method != "compressed-tensors" or hf_quant_cfg.get("format") != "nvfp4-pack-quantized":
        return None
    msg = (f"nvgemm_cutedsl: this checkpoint is compressed-tensors NVFP4 (nvfp4-pack-quantized); nvgemm's {engine} "
           f"plugin serves ModelOpt NVFP4 exports only, so {engine}'s own compressed-tensors kernels serve it, not "
           f"nvgemm (nvgemm.load_modelopt_checkpoint loads this format outside {engine})")
    log.warning(msg)
    return msg


def run_gemms(x: torch.Tensor, weight: torch.Tensor, gemms: Sequence[Gemm], bias: torch.Tensor | None,
              sm90: "Sm90Held | None" = None) -> torch.Tensor:
    """The layer's output: one ``nvgemm::nvfp4_linear`` per GEMM, concatenated along N
    (``nvgemm::nvfp4_linear_sm90_prepared`` on GEMM ``g``'s tiles when ``weight`` is held in the
    sm90 layout, ``sm90`` from :func:`hold_sm90`)."""
    outs = []
    for g in gemms:
        b = None if bias is None else (bias if (g.start == 0 and g.stop == bias.shape[0]) else bias[g.start:g.stop])
        if sm90 is not None:
            t0, t1 = g.tiles
            whole = t0 == 0 and t1 == weight.shape[0]
            pw, ps = (weight, sm90.scale) if whole else (weight[t0:t1], sm90.scale[t0:t1])
            outs.append(torch.ops.nvgemm.nvfp4_linear_sm90_prepared(
                x, pw, ps, g.weight_scale_2, g.input_scale, b, None, "none", None, g.stop - g.start, sm90.k, sm90.kind))
            continue
        w = weight if (g.start == 0 and g.stop == weight.shape[0]) else weight[g.start:g.stop]
        outs.append(torch.ops.nvgemm.nvfp4_linear(x, w, g.weight_scale, g.weight_scale_2, g.input_scale, b,
                                                  None, "none", None))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


# ------------------------------------------------------------------------- one copy on Hopper


@dataclass
class Sm90Held:
    """A layer whose weight is held once, in the sm90 kernels' layout: every GEMM's prepared rows
    stacked along 16-row tiles (GEMM ``g`` reads tiles ``g.tiles`` of the weight and of ``scale``)."""

    scale: torch.Tensor  # uint8 [tiles, chunks * 64]
    kind: str  # "bf16" | "fp16": the activation dtype the layout decodes to
    k: int


def sm90_serve_reason(gemms: Sequence[Gemm], k: int, device: torch.device, x_dtype: torch.dtype, bias: bool,
                      m_values: Iterable[int]) -> str | None:
    """None when the sm90 kernels serve every (GEMM, M) of the layer (:mod:`nvgemm.prepared`)."""
    return serve_reason(p for _, _, p in problems_of(gemms, k, device, x_dtype, bias, m_values))


def hold_sm90(weight: torch.Tensor, gemms: Sequence[Gemm], kind: str) -> tuple[torch.Tensor, Sm90Held]:
    """The layer's weight in the sm90 layout (one tensor, GEMM by GEMM; each GEMM's rows padded to
    whole tiles). Sets each GEMM's ``tiles`` and drops its checkpoint-layout ``weight_scale``; the
    caller drops ``weight``, so the layer holds one copy."""
    k = weight.shape[1] * 2
    chunks = -(-k // K_ALIGN) * K_ALIGN // CHUNK
    bounds = [0]
    for g in gemms:
        bounds.append(bounds[-1] + -(-(g.stop - g.start) // ROW_TILE))
    pw = ps = None
    if len(gemms) > 1:  # filled GEMM by GEMM: one GEMM's prepared temporaries at a time
        pw = torch.empty((bounds[-1], chunks * 512), dtype=torch.uint8, device=weight.device)
        ps = torch.empty((bounds[-1], chunks * 64), dtype=torch.uint8, device=weight.device)
    for i, g in enumerate(gemms):
        p = prepare_sm90_weight(weight[g.start:g.stop], g.weight_scale, g.weight_scale_2, kind)
        if pw is None:
            pw, ps = p.weight, p.scale
        else:
            pw[bounds[i]:bounds[i + 1]] = p.weight
            ps[bounds[i]:bounds[i + 1]] = p.scale
        g.tiles, g.weight_scale = (bounds[i], bounds[i + 1]), None
    if weight.device.type == "cuda":  # the kernels stream weights before griddepcontrol.wait (PDL)
        torch.cuda.current_stream(weight.device).synchronize()
    return pw, Sm90Held(ps, kind, k)


def weight_memory(weight: torch.Tensor, scales: Sequence[torch.Tensor], held: str = "checkpoint") -> str:
    """``weight memory: <held> X MiB + nvgemm copies Y MiB`` of one layer, for its load log line
    (the copies are what the launchers derived from it: the sm90 prepared layout, sm100's
    interleaved gate_up; :func:`nvgemm.templates.derived.derived_nbytes`). ``held`` names the
    layout of ``weight`` (``"sm90 layout only"`` when :func:`hold_sm90` replaced the checkpoint's)."""
    ckpt = weight.numel() * weight.element_size() + sum(s.numel() * s.element_size() for s in scales)
    return f"weight memory: {held} {ckpt / 2**20:.2f} MiB + nvgemm copies {derived_nbytes(weight) / 2**20:.2f} MiB"


# ---------------------------------------------------------------------------------------- warm-up


def problems_of(gemms: Sequence[Gemm], k: int, device: torch.device, x_dtype: torch.dtype, bias: bool,
                m_values: Iterable[int]):
    """``(gemm index, gemm, LinearProblem)`` of every (GEMM, M) the layer will run."""
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    for gi, g in enumerate(gemms):
        for m in m_values:
            yield gi, g, LinearProblem(m=int(m), n=g.stop - g.start, k=k, device_type=device.type, capability=cap,
                                   weight_only=g.input_scale is None, x_dtype=x_dtype, out_dtype=x_dtype,
                                   alpha=g.alpha, bias=bias, activation="none", residual=False)


_WARMED: set = set()  # problems already resolved in this process (kernel compiled/loaded, workspaces sized)


def warm_up(layer: str, weight: torch.Tensor, gemms: Sequence[Gemm], bias: torch.Tensor | None,
            x_dtype: torch.dtype, m_values: Sequence[int],
            sm90: Sm90Held | None = None) -> list[tuple[int, object, str]]:
    """Resolve every kernel the layer will use for the token counts ``m_values``, now.

    For each (GEMM, M): the runtime selects its backend, which on a GPU runs the first-use check
    (compiles or loads the kernel from the kernel cache), and the layer runs once at that M so
    per-weight caches (e.g. the sm90 weight re-layout) and split-K workspaces exist before any CUDA
    graph is captured. Problems already warmed in this process (another layer of the same shape) are
    only re-run once per layer for the per-weight caches. The emulated op (e.g. on a CPU device) has
    nothing to resolve, so only the selection is made. Returns ``(gemm index, LinearProblem, backend name)``.
    """
    device = weight.device
    k = weight.shape[1] * 2 if sm90 is None else sm90.k
    chosen = []
    ran_layer = False
    for gi, g, p in problems_of(gemms, k, device, x_dtype, bias is not None, m_values):
        backend = select_backend(p)
        chosen.append((gi, p, backend.name))
        if backend.name == "emulated":  # nothing to compile, cache or size
            continue
        key = (p, str(device))
        if key in _WARMED and ran_layer:
            continue
        x = torch.zeros((p.m, k), dtype=x_dtype, device=device)
        run_gemms(x, weight, [g], None if bias is None else bias, sm90)
        _WARMED.add(key)
        ran_layer = True
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return chosen


def describe_choices(chosen: Sequence[tuple[int, object, str]]) -> str:
    """``M=1..8: cutedsl_sm100; M=16..512: triton_w4a16`` (per GEMM when a layer has several)."""
    by_gemm: dict[int, list[tuple[int, str]]] = {}
    for gi, p, name in chosen:
        by_gemm.setdefault(gi, []).append((p.m, name))
    parts = []
    for gi in sorted(by_gemm):
        runs: list[list] = []
        for m, name in sorted(by_gemm[gi]):
            if runs and runs[-1][2] == name:
                runs[-1][1] = m
            else:
                runs.append([m, m, name])
        txt = "; ".join(f"M={a}{'' if a == b else f'..{b}'}: {name}" for a, b, name in runs)
        parts.append(txt if len(by_gemm) == 1 else f"gemm {gi}: {txt}")
    return " | ".join(parts)


def warmup_sizes(graph_sizes: Iterable[int], token_budget: int, device: torch.device) -> list[int]:
    """Token counts to resolve before serving: every graph size the engine will capture, plus the
    upper bound of each of the policy's M buckets up to the engine's token budget (eager batches).
    On a non-CUDA device nothing is compiled, so one count (1) only selects the backend for the log."""
    if device.type != "cuda":
        return [1]
    sizes = {int(s) for s in graph_sizes}
    sizes.update(hi for _, hi in m_buckets(int(token_budget)))
    return sorted(sizes)


def passed_over(problem, chosen: str) -> list[str]:
    """Why each higher-priority backend does not serve ``problem``."""
    out = []
    for b in backends():
        if b.name == chosen:
            break
        reason = b.supports(problem) or _CHECKED.get((b.name, problem, str(_device_of(problem)))) or "first-use check"
        out.append(f"{b.name}: {reason}")
    return out


def _device_of(problem) -> torch.device:
    if problem.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(problem.device_type)


def _hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def kernel_configs(first: dict) -> str:
    """Kernel config names the CuTeDSL backends pick (at the first M each backend serves)."""
    names = []
    for name, p in first.items():
        cfg = kernel_config(name, p)
        if cfg:
            names.append(f"{name}@M={p.m}: {cfg}")
    return ", ".join(names)


def dump_call(dump_dir: str, name: str, record: dict) -> None:
    """Save one call's inputs and output (``record``) as ``<dump_dir>/<name>.pt`` (tests, debugging)."""
    from pathlib import Path

    d = Path(dump_dir)
    d.mkdir(parents=True, exist_ok=True)
    torch.save(record, d / f"{name}.pt")


# ------------------------------------------------------------------------------ one served layer


class ServedLinear:
    """One NVFP4 (W4A4) or W4A16_NVFP4 linear layer served by ``nvgemm::nvfp4_linear``, engine-agnostic.

    * :meth:`create_weights` registers what both engines' own NVFP4 linear methods register (same
      names, shapes, dtypes, through the engine's parameter classes and weight loader, so fused
      q/k/v and gate/up shards and tensor-parallel slices load unchanged): ``weight`` uint8 [N, K/2],
      ``weight_scale`` e4m3 [N, K/16], ``weight_scale_2`` and ``input_scale`` fp32 with one value per
      shard. Scales are created as fp32 explicitly (engines build models under the model dtype) and
      NaN-filled, and every loader call is recorded (:class:`LoadTracker`), so a slot no checkpoint
      tensor reached is refused at :meth:`finish` instead of served.
    * :meth:`finish` (the engine's ``process_weights_after_loading``): :func:`plan_gemms`, the block
      scales swizzled once, on Hopper the one-copy sm90 layout, every kernel the layer will use resolved
      and warmed for ``m_values`` (before the engine sizes its KV cache and captures graphs), and one
      log line naming the backend per M range and why faster ones did not serve.
    * :meth:`apply`: one op per planned GEMM, no host synchronisation and no allocation besides the
      op's output, so it fits CUDA graphs and torch.compile (the ops have fake implementations).
    """

    def __init__(self, engine: str, prefix: str, weight_only: bool, logger: logging.Logger | None = None,
                 dump_dir: str | None = None):
        self.engine, self.prefix, self.weight_only = engine, prefix, weight_only
        self.log = logger or log
        self.dump_dir = dump_dir or None
        self.gemms: list[Gemm] = []
        self.sm90: Sm90Held | None = None
        self.tracker: LoadTracker | None = None
        self.widths: list[int] = []
        self.k = 0

    def create_weights(self, layer: torch.nn.Module, k: int, widths: Sequence[int], weight_loader,
                       weight_param, scale_param) -> None:
        """``weight_param(data=, input_dim=, output_dim=, weight_loader=)`` and
        ``scale_param(data=, weight_loader=)`` are the engine's ``ModelWeightParameter`` and
        ``PerTensorScaleParameter``."""
        k, widths = int(k), [int(w) for w in widths]
        if k % NVFP4.block_size:
            raise ValueError(
                f"nvgemm: {self.engine} layer {self.prefix}: per-rank in_features {k} is not a multiple of "
                f"{NVFP4.block_size} (one NVFP4 scale block must not straddle two tensor-parallel ranks); use a "
                f"tensor-parallel size that divides in_features / {NVFP4.block_size}")
        n, shards = sum(widths), len(widths)
        self.k, self.widths = k, widths
        self.tracker = tracker = LoadTracker(self.prefix, shards)

        def nan(*shape):
            return torch.full(shape, float("nan"), dtype=torch.float32)

        layer.register_parameter("weight", weight_param(
            data=torch.empty(n, k // 2, dtype=torch.uint8), input_dim=1, output_dim=0,
            weight_loader=tracker.wrap("weight", weight_loader)))
        layer.register_parameter("weight_scale", weight_param(
            data=nan(n, k // NVFP4.block_size).to(torch.float8_e4m3fn), input_dim=1, output_dim=0,
            weight_loader=tracker.wrap("weight_scale", weight_loader)))
        layer.register_parameter("weight_scale_2", scale_param(
            data=nan(shards), weight_loader=tracker.wrap("weight_scale_2", weight_loader)))
        # W4A16 layers also accept a (legacy) input_scale, as both engines do; it is dropped after loading
        layer.register_parameter("input_scale", scale_param(
            data=nan(shards), weight_loader=tracker.wrap("input_scale", weight_loader)))

    def finish(self, layer: torch.nn.Module, x_dtype: torch.dtype, m_values: Sequence[int]) -> str:
        """Plan, lay out, warm up and log the loaded layer (see the class docstring); returns the log line."""
        required = ("weight", "weight_scale", "weight_scale_2") + (() if self.weight_only else ("input_scale",))
        self.tracker.check(required)
        weight = layer.weight.data
        ins = None
        if not self.weight_only:
            ins = layer.input_scale.data
        elif not bool(torch.isnan(layer.input_scale.data).all()):
            self.log.warning("nvgemm_cutedsl: %s is W4A16_NVFP4 but its checkpoint has an input_scale; ignored "
                             "(weight-only layers do not quantize activations)", self.prefix)
        self.gemms = plan_gemms(weight, layer.weight_scale.data, layer.weight_scale_2.data, ins, self.widths,
                                self.prefix)
        for name in ("weight_scale", "weight_scale_2", "input_scale"):
            delattr(layer, name)
        bias = getattr(layer, "bias", None)
        self.sm90, why = None, "off (NVGEMM_SM90_ONE_COPY=0)"
        if one_copy_wanted():  # Hopper: hold the weight once, in the sm90 layout, when those kernels serve it all
            why = sm90_serve_reason(self.gemms, self.k, weight.device, x_dtype, bias is not None, m_values)
            if why is None:
                weight, self.sm90 = hold_sm90(weight, self.gemms, kind_of(x_dtype))  # the checkpoint layout goes
                layer.register_buffer("nvgemm_sm90_scale", self.sm90.scale, persistent=False)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        for i, g in enumerate(self.gemms):  # visible in named_buffers(), moved with the module
            if g.weight_scale is not None:
                layer.register_buffer(f"nvgemm_weight_scale_{i}", g.weight_scale, persistent=False)
            layer.register_buffer(f"nvgemm_weight_scale_2_{i}", g.weight_scale_2, persistent=False)
            if g.input_scale is not None:
                layer.register_buffer(f"nvgemm_input_scale_{i}", g.input_scale, persistent=False)
        chosen = warm_up(self.prefix, weight, self.gemms, bias, x_dtype, m_values, self.sm90)
        return self._log(weight, chosen, why)

    def _log(self, weight, chosen, sm90_why=None) -> str:
        kinds = ", ".join(f"N={g.stop - g.start} alpha {'per-column' if g.alpha == 'vector' else 'scalar'}"
                          + ("" if g.input_scale is None else f" input_scale {float(g.input_scale):.4g}")
                          for g in self.gemms)
        first = {}  # backend -> the first problem it serves
        for _gi, p, name in chosen:
            first.setdefault(name, p)
        fallbacks = []
        forced = ""
        for name, p in first.items():
            if name == settings.NVGEMM_BACKEND:  # chosen by name, not by walking the priority list
                forced = f"; forced (NVGEMM_BACKEND={name})"
                continue
            passed = passed_over(p, name)
            if passed:
                fallbacks.append(f"{name} because " + "; ".join(passed))
        config = kernel_configs(first)
        memory = weight_memory(weight, [self.sm90.scale] if self.sm90 else [g.weight_scale for g in self.gemms],
                               "sm90 layout only" if self.sm90 else "checkpoint")
        if self.sm90 is None and sm90_why and _hopper(weight.device):
            memory += f" (not held once in the sm90 layout: {sm90_why})"
        configs = "; configs " + config if config else ""
        fallback = "; fallback: " + " | ".join(fallbacks) if fallbacks else ""
        plural = "" if len(self.gemms) == 1 else "s"
        line = (f"nvgemm_cutedsl: {self.engine} layer {self.prefix} ({'W4A16' if self.weight_only else 'W4A4'}, "
                f"K={self.k}, shards {list(self.widths)}, {len(self.gemms)} GEMM{plural}: {kinds}) served by "
                f"{describe_choices(chosen)}{forced}{configs}{fallback}; {memory}")
        self.log.info("%s", line)
        return line

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None,
              rank: int = 0, tp_size: int = 1) -> torch.Tensor:
        out = run_gemms(x, layer.weight, self.gemms, bias, self.sm90)
        if self.dump_dir is not None and not torch.compiler.is_compiling():
            dump_call(self.dump_dir, f"{self.prefix}.rank{rank}.pid{os.getpid()}.{next(_DUMP_COUNTER)}",
                      {"layer": self.prefix, "rank": rank, "tp_size": tp_size, "x": x.detach().cpu(),
                       "bias": None if bias is None else bias.detach().cpu(), "out": out.detach().cpu()})
        return out


_DUMP_COUNTER = itertools.count()
