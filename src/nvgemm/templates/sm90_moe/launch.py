"""Host side of the sm_90a grouped MoE path: work list, stacked prepared weights, kernel arguments,
the deterministic top-k finalize, and the whole layer (:func:`moe_forward`). Pure torch (no
cutlass); the kernels are launched through a caller-given function (the AOT kernel on a GPU, the
PTX emulator on CPU), so the CPU tests run exactly this host path.

One layer = 1 prep step + GEMM1 + GEMM2 + finalize:

1. **Work list** (:func:`build_work_list`, torch ops only, no host synchronisation, so CUDA-graph
   safe; a handful of small launches -- a fused Triton prep kernel is the obvious next step): pairs
   ``j = t * top_k + s`` are sorted by local expert with a **stable** sort (ties in pair order;
   empty / unmapped slots last), giving the permuted row ``pos[j]`` of every pair, the source token
   ``rows[p]`` of every permuted row, per-expert counts and offsets, and a fixed-length list of
   work tiles ``(expert, first row, rows <= tile_m, 0)`` (:func:`~.config.work_tiles_bound` slots;
   unused slots are all zero and their CTAs exit). On CUDA with at most 4096 pairs the whole step
   is one Triton launch (:mod:`.prep_triton`, the same tables bit for bit).
2. **GEMM1** (``x`` rows gathered through ``rows``): ``h[p] = round(act(acc13 * alpha13[e]))`` into
   a ``[P, I]`` buffer in permuted order (``P = M * top_k``).
3. **GEMM2** (identity row table): ``y[p] = acc2 * alpha2[e]`` in fp32, ``[P, H]``.
4. **Finalize** (:func:`finalize`): ``out[t] = round(sum_s w[t, s] * y[pos[t, s]] (+ shared_out[t])
   (+ residual[t]))`` in fp32, slots in order 0..K-1, empty slots skipped -- exactly the numerics
   contract's step 5 (no float atomics, no contraction of the multiply into the add: torch ops on
   CPU, one Triton kernel with ``enable_fp_fusion=False`` on CUDA).

The per-token result does not depend on the other tokens of the batch: each output column of an
``mma.sync`` depends only on its own activation column, the K split is fixed by the config, and
the finalize sums one token's slots in slot order -- so a token's output is identical at M = 1 and
inside a larger batch that runs the same configs (the batch-invariance test).

W4A16 only (no input scales): W4A4 MoE on Hopper would quantize-dequantize the gathered rows per
pair with the expert's input scale; not implemented (the op falls back to the emulated path).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch

from nvgemm.core.epilogue import EpilogueSpec

from nvgemm.templates.sm90_w4a16.launch import Sm90Workspace, _int32_dummy, _memo, capturing
from nvgemm.templates.common.derived import device_memo
from nvgemm.templates.common.workspace import WORKSPACES
from nvgemm.templates.sm90_w4a16.operand import Sm90Weight, kind_of, prepare_sm90_weight
from nvgemm.templates.sm90_moe.config import (MoeWorkList, Sm90MoeConfig, fused_finalize_ok, moe_shape_problem,
                                              validate_moe_config, work_tiles_bound)
from nvgemm.templates.common.triton_stand_in import stand_in

# --------------------------------------------------------------------------- work list


def build_work_list(local: torch.Tensor, num_experts: int, tile_m: int) -> MoeWorkList:
    """Work list of local expert ids ``local`` ([M, K] int64, -1 = nothing) for tiles of ``tile_m``
    pairs. Torch ops without host synchronisation (CUDA-graph safe); deterministic."""
    m, k = local.shape
    p = m * k
    dev = local.device
    e = num_experts
    flat = local.reshape(-1)
    valid = flat >= 0
    key = torch.where(valid, flat, torch.full_like(flat, e))
    order = torch.sort(key, stable=True).indices  # permuted row -> pair
    pos = torch.empty_like(order)
    pos[order] = torch.arange(p, device=dev)
    counts = torch.zeros(e + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))[:e]
    offs = torch.cumsum(counts, 0) - counts
    ntile = (counts + tile_m - 1) // tile_m
    tend = torch.cumsum(ntile, 0)
    tstart = tend - ntile
    slots = work_tiles_bound(p, e, tile_m)
    j = torch.arange(slots, device=dev)
    te = torch.searchsorted(tend, j, right=True)  # expert of slot j (== E past the last tile)
    used = te < e
    tec = te.clamp(max=e - 1)
    i = j - tstart[tec]
    start = offs[tec] + i * tile_m
    cnt = torch.where(used, (counts[tec] - i * tile_m).clamp(0, tile_m), torch.zeros_like(i))
    start = torch.where(used, start, torch.zeros_like(start))
    tiles = torch.stack([torch.where(used, tec, torch.zeros_like(tec)), start, cnt, torch.zeros_like(cnt)], dim=1).reshape(-1).to(torch.int32)
    rows = (order // k).to(torch.int32)
    y_rows = torch.where(valid, pos, torch.full_like(pos, -1)).to(torch.int32)
    return MoeWorkList(rows, tiles, pos.reshape(m, k), valid.reshape(m, k), counts, tile_m, y_rows)


def local_expert_ids(topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor]) -> torch.Tensor:
    """``topk_ids`` through ``expert_map`` as int64 local ids (-1: nothing); the op's rule
    (``nvgemm.ops.moe.local_ids``), restated here so the template does not import the op layer."""
    ids = topk_ids.long()
    if expert_map is None:
        return ids
    return torch.where(ids < 0, torch.full_like(ids, -1), expert_map.long()[ids.clamp_min(0)])


def work_list(topk_ids: torch.Tensor, expert_map: Optional[torch.Tensor], num_experts: int,
              tile_m: int) -> MoeWorkList:
    """The work list: one Triton launch on CUDA when it fits (:mod:`.prep_triton`), else torch ops."""
    if topk_ids.device.type == "cuda":
        # lazy: triton import cost
        from nvgemm.templates.sm90_moe.prep_triton import build_work_list_triton, prep_supported

        if prep_supported(topk_ids.numel(), num_experts):
            return build_work_list_triton(topk_ids, expert_map, num_experts, tile_m)
    kernel = stand_in("nvgemm.templates.sm90_moe.prep_triton", "_prep_kernel", topk_ids.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in)
        from nvgemm.templates.sm90_moe.prep_triton import build_work_list_triton, prep_supported  # lazy: triton

        if prep_supported(topk_ids.numel(), num_experts):
            return build_work_list_triton(topk_ids, expert_map, num_experts, tile_m, kernel=kernel)
    return build_work_list(local_expert_ids(topk_ids, expert_map), num_experts, tile_m)


_IDENT: dict[str, torch.Tensor] = {}
_ZEROS: dict[str, torch.Tensor] = {}


def identity_rows(n: int, device: torch.device) -> torch.Tensor:
    """int32 ``arange(n)`` from a per-device buffer (no launch per call; grown outside capture)."""
    memo = device_memo(_IDENT)
    t = memo.get(str(device))
    if t is None or t.numel() < n:
        t = torch.arange(max(n, 4096), dtype=torch.int32, device=device)
        memo[str(device)] = t
    return t[:n]


def zero_rows(n: int, device: torch.device) -> torch.Tensor:
    """int32 zeros of length ``n`` from a per-device buffer (no launch per call; grown outside capture)."""
    memo = device_memo(_ZEROS)
    t = memo.get(str(device))
    if t is None or t.numel() < n:
        t = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        memo[str(device)] = t
    return t[:n]


def direct_ok(topk_ids: torch.Tensor, expert_map, x_dtype, out_dtype, shared_out, residual) -> bool:
    """Whether a call runs without a work list (``config.direct``): one token, no expert map, int32
    contiguous ids, and GEMM2 running the finalize (:func:`~.config.fused_finalize_ok`)."""
    return (topk_ids.shape[0] == 1 and expert_map is None and topk_ids.dtype == torch.int32
            and topk_ids.is_contiguous() and fused_finalize_ok(1, x_dtype, out_dtype, shared_out, residual))


def direct_work_list(topk_ids: torch.Tensor, tile_m: int) -> MoeWorkList:
    """The routing of one token without a launch (``config.direct``): work slot ``j`` is pair ``j`` (its
    expert read by the kernels from the ids, kept as ``y_rows``), permuted row ``j``; the row table is all
    zeros (the one token) and the tile table is never read (it sizes the grid: one slot per pair).
    ``valid`` and ``counts`` are not derived (they would take a launch)."""
    k = topk_ids.shape[1]
    dev = topk_ids.device
    return MoeWorkList(zero_rows(k, dev), zero_rows(4 * k, dev), identity_rows(k, dev).view(1, k), None, None,
                       tile_m, topk_ids.reshape(-1))


# --------------------------------------------------------------------------- stacked weights


@dataclass
class MoeStack:
    """One stacked expert weight in the sm90 operand layout (experts' row tiles back to back)."""

    weight: torch.Tensor  # uint8 [E * tiles, chunks * 512]
    scale: torch.Tensor  # uint8 [E * tiles, chunks * 64]
    rows: int  # weight rows per expert (gate + up for gated GEMM1)
    k: int
    num_experts: int
    kind: str


def prepare_moe_stack(w: torch.Tensor, w_scale: torch.Tensor, kind: str) -> MoeStack:
    """Stacked ``[E, rows, K/2]`` packed weights + per-expert swizzled scales -> :class:`MoeStack`
    (each expert through :func:`~nvgemm.templates.sm90_w4a16.operand.prepare_sm90_weight`)."""
    e, rows = w.shape[0], w.shape[1]
    one = torch.ones((), dtype=torch.float32, device=w.device)
    parts: list[Sm90Weight] = [prepare_sm90_weight(w[i], w_scale[i], one, kind) for i in range(e)]
    return MoeStack(torch.cat([p.weight for p in parts]), torch.cat([p.scale for p in parts]), rows,
                    w.shape[2] * 2, e, kind)


def cached_moe_stack(w: torch.Tensor, w_scale: torch.Tensor, kind: str) -> MoeStack:
    """:func:`prepare_moe_stack` memoized per (weight tensor, kind) like the dense weights
    (:func:`nvgemm.templates.sm90_w4a16.launch.cached_sm90_weight`): invalidated when the weight or its
    scales change in place, dropped when the weight is freed; a fresh preparation on CUDA ends
    with a stream synchronisation (outside capture)."""

    def make() -> MoeStack:
        st = prepare_moe_stack(w, w_scale, kind)
        if w.device.type == "cuda" and not capturing(w.device):
            torch.cuda.current_stream(w.device).synchronize()
        return st

    return _memo(f"moe_stack:{kind}", w, (w, w_scale, kind), make)


# --------------------------------------------------------------------------- GEMM arguments


@dataclass
class MoeGemmArgs:
    """One grouped GEMM's arguments in ABI order (:class:`~.kernel.Sm90MoeMmaTemplate`)."""

    x: torch.Tensor
    rows: torch.Tensor
    tiles: torch.Tensor
    weight: torch.Tensor
    scale: torch.Tensor
    alpha: torch.Tensor
    out: torch.Tensor
    work: torch.Tensor
    count: torch.Tensor
    spec: EpilogueSpec
    config: Sm90MoeConfig
    fin: Optional["FinalizeArgs"] = None
    ids: Optional[torch.Tensor] = None  # ``config.direct``: the one token's int32 expert ids (the routing)

    def abi_values(self) -> tuple:
        f = self.fin
        if f is None:  # never read (but the direct ids): tensors of the ABI's dtypes and ranks
            tail = (self.x, self.x, self.x, self.rows if self.ids is None else self.ids, self.alpha, self.rows)
        else:
            tail = (f.out, f.shared, f.residual, f.y_rows, f.weights, f.flags)
        return (self.x, self.rows, self.tiles, self.weight, self.scale, self.alpha, self.out, self.work,
                self.count) + tail


@dataclass
class FinalizeArgs:
    """The finalize GEMM2 runs (``config.finalize``): its output and inputs in ABI order."""

    out: torch.Tensor  # [M, H] activation dtype
    shared: torch.Tensor  # [M, H] or ``out`` (absent)
    residual: torch.Tensor  # [M, H] or ``out`` (absent)
    y_rows: torch.Tensor  # int32 [M * K]: row of y per pair, -1 = empty slot
    weights: torch.Tensor  # fp32 [M * K]
    flags: torch.Tensor  # int32 [2]: (shared given, residual given)


_FLAGS: dict = {}


def finalize_flags(has_shared: bool, has_residual: bool, device) -> torch.Tensor:
    """int32 ``[has_shared, has_residual]`` from a per-device memo (no launch per call; made by device fills, no
    host-to-device copy, so a first call under CUDA-graph capture records them instead of failing)."""
    memo = device_memo(_FLAGS)
    key = (str(device), bool(has_shared), bool(has_residual))
    t = memo.get(key)
    if t is None:
        t = torch.zeros(2, dtype=torch.int32, device=device)
        t[0], t[1] = int(has_shared), int(has_residual)
        memo[key] = t
    return t


def finalize_args(wl: MoeWorkList, weights: torch.Tensor, shared_out, residual, out_dtype,
                  hidden: int) -> FinalizeArgs:
    """The fused finalize's arguments (:func:`~.config.fused_finalize_ok` holds): ``y_rows`` from the prep."""
    m = wl.pos.shape[0]
    dev = wl.pos.device
    out = torch.empty((m, hidden), dtype=out_dtype, device=dev)
    w = weights if weights.dtype == torch.float32 and weights.is_contiguous() else weights.float().contiguous()
    return FinalizeArgs(out, shared_out if shared_out is not None else out, residual if residual is not None else out,
                        wl.y_rows.reshape(-1), w.reshape(-1), finalize_flags(shared_out is not None,
                                                                             residual is not None, dev))


def gemm_epilogue(alpha_kind: str, activation: str, out_dtype: torch.dtype) -> EpilogueSpec:
    """One grouped GEMM's epilogue (part of its kernel's key): alpha per expert ("scalar") or per row ("vector")."""
    return EpilogueSpec(alpha=alpha_kind, activation=activation, out_dtype=out_dtype)


def gemm2_config(config: Sm90MoeConfig, fuse: bool, direct: bool = False) -> Sm90MoeConfig:
    """GEMM2's config as a call runs it: the finalize fused or not (``direct`` only with it), early weight
    loads with PDL."""
    if fuse:
        return replace(config, finalize=True, direct=direct, early_weights=config.pdl)
    return replace(config, finalize=False, early_weights=config.pdl)


def call_kernels(m: int, top_k: int, config13: Sm90MoeConfig, config2: Sm90MoeConfig, x_dtype: torch.dtype,
                 activation: str = "silu_mul", out_dtype: Optional[torch.dtype] = None, alpha13: str = "scalar",
                 expert_map: bool = False, shared_out=None, residual=None) -> tuple:
    """``((config, epilogue) of GEMM1, (config, epilogue) of GEMM2)``: the two kernels :func:`moe_forward`
    launches for ``m`` tokens routed by int32 contiguous ids (as the serving plugins pass them), with or
    without an expert map."""
    out_dtype = out_dtype or x_dtype
    ids = torch.empty((m, top_k), dtype=torch.int32, device="meta")
    emap = torch.empty((1,), dtype=torch.int32, device="meta") if expert_map else None
    direct = direct_ok(ids, emap, x_dtype, out_dtype, shared_out, residual)
    fuse = fused_finalize_ok(m, x_dtype, out_dtype, shared_out, residual)
    return ((replace(config13, direct=direct), gemm_epilogue(alpha13, activation, x_dtype)),
            (gemm2_config(config2, fuse, direct), gemm_epilogue("scalar", "none", torch.float32)))


def gemm_args(config: Sm90MoeConfig, x: torch.Tensor, rows: torch.Tensor, wl: MoeWorkList, stack: MoeStack,
              alpha: torch.Tensor, activation: str, out_dtype: torch.dtype, ws: Optional[Sm90Workspace] = None,
              stream_id: int = 0, fin: Optional[FinalizeArgs] = None) -> MoeGemmArgs:
    """Arguments of one grouped GEMM (output ``[P, rows or rows/2]``); raises naming the problem.
    Split-K partials go to ``ws`` when given, else to the shared per-(device, stream) pool
    (:data:`nvgemm.templates.common.workspace.WORKSPACES`). ``fin``: the finalize this GEMM2 runs
    (``config.finalize``); its row blocks' counters follow the split-K counters."""
    validate_moe_config(config).raise_if_failed("sm90 moe config")
    gated = activation == "silu_mul"
    if why := moe_shape_problem(config, stack.rows, stack.k, gated):
        raise ValueError(f"nvgemm sm90 moe: {config.name()}: {why}")
    if config.tile_m != wl.tile_m:
        raise ValueError(f"nvgemm sm90 moe: config tile_m={config.tile_m} but the work list has tiles of {wl.tile_m}")
    if x.shape[1] != stack.k:
        raise ValueError(f"nvgemm sm90 moe: activations have K={x.shape[1]}, the weights K={stack.k}")
    p = wl.pos.numel()
    n_out = stack.rows // 2 if gated else stack.rows
    spec = gemm_epilogue("vector" if alpha.numel() > stack.num_experts else "scalar", activation, out_dtype)
    out = torch.empty((p, n_out), dtype=out_dtype, device=x.device)
    alpha = alpha.reshape(-1).contiguous()  # [E] or per row [E * rows] (the ABI's 1-D alpha)
    if config.finalize != (fin is not None):
        raise ValueError(f"nvgemm sm90 moe: {config.name()}: finalize arguments "
                         f"{'missing' if config.finalize else 'given to a GEMM without finalize'}")
    if fin is not None and (gated or activation != "none" or out_dtype != torch.float32):
        raise ValueError("nvgemm sm90 moe: the finalize runs in GEMM2 (no activation, fp32 rows)")
    if fin is not None and tuple(fin.out.shape) != (wl.pos.shape[0], n_out):
        raise ValueError(f"nvgemm sm90 moe: the finalize's output is {tuple(fin.out.shape)}, expected "
                         f"{(wl.pos.shape[0], n_out)}")
    work, count = alpha, _int32_dummy(x.device)  # never read without split-K (a 1-D fp32 tensor, as the ABI wants)
    feat = config.tile_n // 2 if gated else config.tile_n
    blocks = -(-n_out // feat)
    if config.split_k > 1 or fin is not None:
        need_w = config.split_k * p * stack.rows if config.split_k > 1 else 1
        need_c = (wl.slots * blocks if config.split_k > 1 else 0) + (blocks if fin is not None else 0)
        if ws is not None:
            ws.ensure(need_w, need_c)
            work, count = ws.work, ws.count
        else:
            work, count = WORKSPACES.get(x.device, need_w, need_c, stream_id)
    return MoeGemmArgs(x, rows, wl.tiles, stack.weight, stack.scale, alpha, out, work, count,
                       spec, config, fin)


# --------------------------------------------------------------------------- finalize


def finalize_ref(y: torch.Tensor, wl: MoeWorkList, weights: torch.Tensor, shared_out, residual,
                 out_dtype: torch.dtype) -> torch.Tensor:
    """Step 5 of the contract in torch ops: fp32, slot order, empty slots skipped, one rounding."""
    m, k = wl.pos.shape
    ys = y[wl.pos.reshape(-1)].reshape(m, k, -1)
    out = torch.zeros(m, y.shape[1], dtype=torch.float32, device=y.device)
    for s in range(k):
        term = weights[:, s:s + 1] * ys[:, s]
        out = torch.where(wl.valid[:, s:s + 1], out + term, out)
    if shared_out is not None:
        out = out + shared_out.float()
    if residual is not None:
        out = out + residual.float()
    return out.to(out_dtype)


def finalize(y, wl, weights, shared_out, residual, out_dtype):
    """The finalize step: one Triton kernel on CUDA (:mod:`.finalize_triton`), torch ops elsewhere."""
    if y.device.type == "cuda":
        # lazy: triton import cost
        from nvgemm.templates.sm90_moe.finalize_triton import finalize_triton

        return finalize_triton(y, wl.pos, wl.valid, weights, shared_out, residual, out_dtype)
    kernel = stand_in("nvgemm.templates.sm90_moe.finalize_triton", "_finalize_kernel", y.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in)
        from nvgemm.templates.sm90_moe.finalize_triton import finalize_triton  # lazy: triton import cost

        return finalize_triton(y, wl.pos, wl.valid, weights, shared_out, residual, out_dtype, kernel=kernel)
    return finalize_ref(y, wl, weights, shared_out, residual, out_dtype)


# --------------------------------------------------------------------------- the layer

Launch = Callable[[MoeGemmArgs], None]


def moe_forward(x, topk_ids, expert_map, topk_weights, w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2, activation,
                router_weight_on_input, shared_out, residual, out_dtype,
                config13: Sm90MoeConfig, config2: Sm90MoeConfig, launch: Launch,
                workspace: Optional[Sm90Workspace] = None, keep: Optional[dict] = None,
                stream_id: int = 0) -> torch.Tensor:
    """One W4A16 ``nvfp4_moe`` call through the grouped kernels (``launch`` runs a GEMM's arguments
    on the right kernel). ``keep`` (a dict) receives the work list and the intermediates (tests)."""
    if config13.tile_m != config2.tile_m:
        raise ValueError(f"nvgemm sm90 moe: GEMM1 and GEMM2 share one work list: tile_m {config13.tile_m} != "
                         f"{config2.tile_m}")
    kind = kind_of(x.dtype)
    dev = x.device
    out_dtype = out_dtype or x.dtype
    ws = workspace
    wts = topk_weights
    xin = x
    if router_weight_on_input:  # contract step 1 (top-1): xin = round(x * w), w := 1
        xin = (x.float() * topk_weights[:, :1]).to(x.dtype)
        wts = torch.ones_like(topk_weights)
    if xin.stride(-1) != 1 or xin.stride(0) % 8 or xin.data_ptr() % 16:
        xin = xin.contiguous().clone()
    direct = direct_ok(topk_ids, expert_map, x.dtype, out_dtype, shared_out, residual)
    if direct:  # one token: the ids are the routing (2 launches)
        wl = direct_work_list(topk_ids, config13.tile_m)
    else:
        wl = work_list(topk_ids, expert_map, w13.shape[0], config13.tile_m)
    s13 = cached_moe_stack(w13, w13_scale, kind)
    s2 = cached_moe_stack(w2, w2_scale, kind)
    a1 = gemm_args(replace(config13, direct=direct), xin, wl.rows, wl, s13, w13_scale_2.float(), activation, x.dtype,
                   ws, stream_id)
    a1.ids = wl.y_rows if direct else None
    # GEMM2's row table before GEMM1's launch: a (first-use) fill of it then precedes GEMM1, whose wait
    # orders it before GEMM2 -- GEMM2 reads it before its own wait (``early_weights``)
    ident = identity_rows(wl.pos.numel(), dev)
    launch(a1)
    if wl.y_rows is not None and fused_finalize_ok(x.shape[0], x.dtype, out_dtype, shared_out, residual):
        # GEMM2 runs the finalize: 3 launches (2 with ``direct``)
        fin = finalize_args(wl, wts, shared_out, residual, out_dtype, x.shape[1])
        a2 = gemm_args(gemm2_config(config2, True, direct), a1.out, ident, wl,
                       s2, w2_scale_2.float(),
                       "none", torch.float32, ws, stream_id, fin=fin)
        launch(a2)
        out = fin.out
    else:
        a2 = gemm_args(gemm2_config(config2, False), a1.out, ident, wl, s2,
                       w2_scale_2.float(), "none",
                       torch.float32, ws, stream_id)
        launch(a2)
        out = finalize(a2.out, wl, wts, shared_out, residual, out_dtype)
    if keep is not None:
        keep.update(work_list=wl, h=a1.out, y=a2.out, args13=a1, args2=a2)
    return out


__all__ = ["call_kernels", "direct_ok", "direct_work_list", "gemm2_config", "gemm_epilogue", "zero_rows", "MoeGemmArgs",
           "MoeStack", "MoeWorkList", "build_work_list", "cached_moe_stack",
           "finalize", "finalize_ref", "gemm_args", "identity_rows", "local_expert_ids", "work_list", "moe_forward", "prepare_moe_stack"]
