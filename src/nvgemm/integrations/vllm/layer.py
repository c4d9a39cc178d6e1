"""What one vLLM linear layer becomes in nvgemm terms (pure torch: no vLLM import).

vLLM hands a quantized linear layer to its quant method as one (possibly fused) weight: q/k/v or
gate/up shards concatenated along N, each shard with its own checkpoint ``weight_scale_2`` and
(W4A4) ``input_scale``. :func:`plan_gemms` turns that into the fewest exact
``nvgemm::nvfp4_linear`` calls:

* all shards share ``input_scale`` (always true for ModelOpt exports, which equalize it) ->
  **one GEMM**; its ``weight_scale_2`` is a scalar when the shards' are equal (ModelOpt's case:
  the scalar-alpha kernels) and otherwise a per-output-column vector (the exact per-column alpha;
  no re-quantization);
* shards with different ``input_scale`` (independently quantized shards) cannot share one
  activation quantization, so each run of adjacent shards with equal ``input_scale`` becomes its
  own GEMM and the outputs are concatenated; still exact.

This is the checkpoint's math, shard by shard: ``out[:, shard] = alpha_s * deq(q(x, is_s)) @
deq(W_s).T + b_s`` (nvgemm's format contract), which vLLM's own loader only approximates when
shard scales differ (it keeps ``max(weight_scale_2)`` and ``max(input_scale)``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from nvgemm.core.formats import NVFP4, check_block_scales, to_blocked
from nvgemm.dispatch.serving_plan import shard_runs
from nvgemm.dispatch.registry import LinearProblem, select_backend
from nvgemm.ops.prepared import sm90_serve_reason as serve_reason
from nvgemm.templates.common.derived import derived_nbytes
from nvgemm.templates.sm90_w4a16.config import CHUNK, K_ALIGN, ROW_TILE
from nvgemm.templates.sm90_w4a16.operand import prepare_sm90_weight

log = logging.getLogger("nvgemm_cutedsl.vllm")


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
        raise ValueError(f"nvgemm vLLM layer {layer}: {name} has {t.numel()} values for {shards} shards")
    if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
        raise ValueError(f"nvgemm vLLM layer {layer}: {name} = {t.tolist()} is not a positive finite scale "
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
        raise ValueError(f"nvgemm vLLM layer {layer}: weight must be uint8 [N, K/2], got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    n, k = weight.shape[0], weight.shape[1] * 2
    if k % NVFP4.block_size:
        raise ValueError(f"nvgemm vLLM layer {layer}: per-rank K={k} is not a multiple of {NVFP4.block_size}")
    if tuple(weight_scale.shape) != (n, k // NVFP4.block_size) or weight_scale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"nvgemm vLLM layer {layer}: weight_scale must be float8_e4m3fn {(n, k // 16)}, got "
                         f"{weight_scale.dtype} {tuple(weight_scale.shape)}")
    widths = [int(w) for w in widths]
    if sum(widths) != n or any(w <= 0 for w in widths):
        raise ValueError(f"nvgemm vLLM layer {layer}: shard widths {widths} do not add up to N={n}")
    try:
        check_block_scales(weight_scale, f"nvgemm vLLM layer {layer}: weight_scale")  # same rule as the loader
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
    """Records which parameter shards vLLM's weight loaders filled, so a layer never serves memory that
    no checkpoint tensor was written to (``create_weights`` allocates ``weight`` with ``torch.empty``).

    vLLM calls ``param.weight_loader(param, loaded_weight[, shard_id])`` once per checkpoint tensor:
    once per shard of a fused layer (shard id "q"/"k"/"v" or 0, 1, ...), once with no shard id when
    the checkpoint holds the fused tensor. :meth:`wrap` returns a loader that records the call and
    forwards it; :meth:`check` raises naming every parameter or shard that was never loaded.
    """

    def __init__(self, layer: str, shards: int):
        self.layer, self.shards = layer, shards
        self.loaded: dict[str, set] = {}
        self.untracked = False

    def wrap(self, name: str, loader):
        if loader is None:  # vLLM gave no loader: nothing to track (the NaN-initialised scales still are)
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
                f"nvgemm vLLM layer {self.layer}: never loaded from the checkpoint: {', '.join(missing)}; the layer "
                "would compute on uninitialised memory (is a shard missing from the checkpoint, or the layer "
                "stored unquantized? then list it in the quantization config's ignore / exclude_modules)")


def note_unserved_checkpoint(hf_quant_cfg) -> str | None:
    """One log line when vLLM is about to serve an NVFP4 checkpoint nvgemm does not take over (returned
    for tests); None for anything else. nvgemm's plugin serves ModelOpt exports (``modelopt_fp4`` /
    ``modelopt_mixed``); a compressed-tensors ``nvfp4-pack-quantized`` checkpoint stays on vLLM's own
    compressed-tensors path, which without this line would look like nvgemm serving it."""
    if not isinstance(hf_quant_cfg, dict):
        return None
    method = str(hf_quant_cfg.get("quant_method", "")).lower().replace("_", "-")
    if method != "compressed-tensors" or hf_quant_cfg.get("format") != "nvfp4-pack-quantized":
        return None
    msg = ("nvgemm_cutedsl: this checkpoint is compressed-tensors NVFP4 (nvfp4-pack-quantized); nvgemm's vLLM "
           "plugin serves ModelOpt NVFP4 exports only, so vLLM's own compressed-tensors kernels serve it, not "
           "nvgemm (nvgemm.load_modelopt_checkpoint loads this format outside vLLM)")
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
    """None when the sm90 kernels serve every (GEMM, M) of the layer (:mod:`nvgemm.ops.prepared`)."""
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
    interleaved gate_up; :func:`nvgemm.templates.common.derived.derived_nbytes`). ``held`` names the
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
