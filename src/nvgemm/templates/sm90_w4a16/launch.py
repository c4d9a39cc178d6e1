"""Host launcher of the sm_90a W4A16 kernels: prepared weights, workspaces, arguments, launch, and
the torch view of the kernels' arithmetic. Pure torch (no cutlass), no heuristics / runtime import
at module level; :mod:`nvgemm.templates.sm90_w4a16.backend` picks the config and fetches the compiled
kernel, this module does the rest.

Per call (``prepare_sm90_args``) the host allocates nothing but the output (and, for W4A4, the
quantize-dequantized activations) and launches nothing but the GEMM (and the W4A4 qdq kernel):

* weights are prepared once per (weight, activation dtype) (:func:`cached_sm90_weight`, keyed by
  storage, offset, shape and version counter -- a per-call view of a weight hits --, re-prepared
  into the same buffers after an in-place update, dropped when the weight is freed; see
  :mod:`nvgemm.templates.common.derived`);
* absent bias / residual / split-K buffers are compile-time variants of the kernel, which never
  reads them: the ABI slots get tensors the call already has (alpha, the output);
* bias in another dtype than fp32 and W4A4's alpha (:func:`nvgemm.core.validation.alpha_of`) are
  derived once and cached like the weights;
* split-K partials and tile counters come from the shared pool, one pair per (device, stream)
  (:data:`nvgemm.templates.common.workspace.WORKSPACES`: allocated with the counters zeroed, grown by
  retiring -- never freeing -- the old pair, bounded under CUDA-graph capture), or from an explicit
  :class:`Sm90Workspace`; the kernel leaves every counter at zero, so a captured call replays
  without any fill.

W4A4 checkpoints on Hopper (``input_scale`` given): no FP4 tensor cores, so the kernel runs on
``x' = E2M1[q_x] * s_x`` (exact in bf16 / fp16), quantized with the same convention as the
emulated op and the Blackwell kernels (:mod:`nvgemm.core.formats`), in one Triton kernel
(:func:`nvgemm.templates.triton.quantize.qdq_nvfp4_triton`; the torch reference on CPU), and
``alpha = input_scale * weight_scale_2`` (:func:`nvgemm.core.validation.alpha_of`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from nvgemm.core.validation import alpha_of
from nvgemm.core.epilogue import EpilogueSpec, epilogue_ref

from nvgemm.templates.common.derived import DerivedCache, device_memo, refill_tensors
from nvgemm.templates.common.workspace import WORKSPACES
from nvgemm.templates.sm90_w4a16.config import DECODE_UNSCALE, Sm90W4A16Config, shape_problem, validate_config
from nvgemm.templates.sm90_w4a16.operand import Sm90Weight, decode_ref, kind_of, prepare_sm90_weight
from nvgemm.core.formats import dequantize, quantize_activation
from nvgemm.templates.common.triton_stand_in import stand_in

# --------------------------------------------------------------------------- caches of derived tensors

DERIVED = DerivedCache()


def _memo(tag: str, anchor: torch.Tensor, inputs: tuple, make):
    """``make()`` memoized per (tag, anchor tensor's storage/offset/shape), re-derived into the same
    buffers when an input changes in place (:mod:`nvgemm.templates.common.derived`)."""
    return DERIVED.get(tag, anchor, inputs, make, capturing=lambda: capturing(anchor.device))


def cached_sm90_weight(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                       kind: str = "bf16") -> Sm90Weight:
    """:func:`~.operand.prepare_sm90_weight`, memoized per weight tensor and activation kind.

    A fresh preparation on CUDA ends with a stream synchronisation (once per weight, outside
    CUDA-graph capture): the PDL kernels start streaming weights *before* ``griddepcontrol.wait``,
    which is only safe for bytes no still-running predecessor kernel is writing."""

    def settle() -> None:
        if weight.device.type == "cuda":
            torch.cuda.current_stream(weight.device).synchronize()

    def make() -> Sm90Weight:
        p = prepare_sm90_weight(weight, weight_scale, weight_scale_2, kind)
        if not capturing(weight.device):
            settle()
        return p

    def refill(old: Sm90Weight, new: Sm90Weight) -> bool:
        done = refill_tensors(old, new)
        if done:
            settle()
        return done

    return DERIVED.get(f"weight:{kind}", weight, (weight, weight_scale, weight_scale_2, kind), make,
                       capturing=lambda: capturing(weight.device), refill=refill)


def _fp32_on(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    if t.dtype == torch.float32 and t.device == dev and t.is_contiguous():
        return t.reshape(-1)
    return _memo(f"fp32:{dev}", t, (t,), lambda: t.to(device=dev, dtype=torch.float32).reshape(-1).contiguous())


def _alpha(prepared: Sm90Weight, input_scale: Optional[torch.Tensor], dev: torch.device) -> torch.Tensor:
    ws2 = prepared.weight_scale_2
    if input_scale is None:
        return _fp32_on(ws2, dev)
    return _memo(f"alpha:{dev}", ws2, (ws2, input_scale), lambda: alpha_of(ws2, input_scale, dev).contiguous())


# --------------------------------------------------------------------------- workspace


class Sm90Workspace:
    """An explicit split-K workspace (fp32 partials, int32 tile counters) for one stream's calls.

    Valid for the life of any CUDA graph that captured a call using it: it is only ever grown
    (never freed or moved while referenced by ``self``), and growing raises during capture. Calls
    on concurrent streams must not share one workspace (give each stream its own)."""

    MIN_WORK = 1 << 20  # fp32 elements (4 MB)
    MIN_COUNT = 1 << 16

    def __init__(self, device: torch.device):
        self.device = device
        self.work = torch.empty(self.MIN_WORK, dtype=torch.float32, device=device)
        self.count = torch.zeros(self.MIN_COUNT, dtype=torch.int32, device=device)

    def ensure(self, work_numel: int, count_numel: int) -> None:
        if work_numel <= self.work.numel() and count_numel <= self.count.numel():
            return
        if capturing(self.device):
            raise RuntimeError(
                f"nvgemm_cutedsl sm90: the split-K workspace ({self.work.numel()} fp32, {self.count.numel()} counters) "
                f"is too small for this call ({work_numel}, {count_numel}) and cannot grow during CUDA-graph capture; "
                "run the call once before capturing (warm-up) or reserve with Sm90Workspace.ensure")
        if work_numel > self.work.numel():
            self.work = torch.empty(max(work_numel, 2 * self.work.numel()), dtype=torch.float32, device=self.device)
        if count_numel > self.count.numel():
            self.count = torch.zeros(max(count_numel, 2 * self.count.numel()), dtype=torch.int32, device=self.device)


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def split_k_needs(config: Sm90W4A16Config, m: int, prepared: Sm90Weight, n_out: int, gated: bool) -> tuple[int, int]:
    """(fp32 workspace elements, tile counters) one call of ``config`` needs (0, 0 without split-K)."""
    if config.split_k <= 1:
        return 0, 0
    feat = config.tile_n // 2 if gated else config.tile_n
    grid_n = -(-n_out // feat)
    grid_m = -(-m // config.tile_m)
    return config.split_k * m * prepared.n_pad, grid_n * grid_m


# --------------------------------------------------------------------------- activations (W4A4 qdq)


def qdq_activation(x2: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """``E2M1[q_x] * s_x`` in x's dtype (exact), quantized with ``nvgemm.core.formats``' convention: one
    Triton kernel on CUDA (or the PTX emulator's stand-in on CPU when installed), the torch reference elsewhere."""
    if x2.device.type == "cuda":
        # lazy: triton import cost
        from nvgemm.templates.triton.quantize import qdq_nvfp4_triton

        return qdq_nvfp4_triton(x2, input_scale.to(device=x2.device, dtype=torch.float32))
    kernel = stand_in("nvgemm.templates.triton.quantize", "qdq_nvfp4_kernel", x2.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in): the same kernel, its PTX run on the CPU
        from nvgemm.templates.triton.quantize import qdq_nvfp4_triton  # lazy: triton import cost

        return qdq_nvfp4_triton(x2, input_scale.to(dtype=torch.float32), kernel=kernel)
    q, s = quantize_activation(x2, input_scale.to(x2.device))
    return dequantize(q, s).to(x2.dtype)


# --------------------------------------------------------------------------- arguments


@dataclass
class Sm90Args:
    """The kernels' arguments, in ABI order (:class:`~.common.Sm90TemplateBase` ``abi``)."""

    x: torch.Tensor  # [M, K] bf16/fp16, row stride % 8 == 0, 16-byte aligned
    weight: torch.Tensor
    scale: torch.Tensor
    alpha: torch.Tensor  # fp32 (1,) | (N,)
    bias: torch.Tensor  # fp32 (N,), or a tensor the kernel never reads
    residual: torch.Tensor  # [M, N_out] out dtype, or a tensor the kernel never reads
    out: torch.Tensor  # [M, N_out]
    work: torch.Tensor  # fp32 split-K partials, or a tensor the kernel never reads
    count: torch.Tensor  # int32 tile counters, or a tensor the kernel never reads
    spec: EpilogueSpec
    prepared: Sm90Weight

    def abi_values(self) -> tuple:
        return (self.x, self.weight, self.scale, self.alpha, self.bias, self.residual, self.out, self.work,
                self.count)


def _aligned_rows(x2: torch.Tensor) -> torch.Tensor:
    if x2.stride(-1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16:
        x2 = x2.contiguous()
        if x2.data_ptr() % 16:
            x2 = x2.clone()
    return x2


def prepare_sm90_args(
    x: torch.Tensor,
    prepared: Sm90Weight,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    activation: str,
    out_dtype: Optional[torch.dtype],
    config: Sm90W4A16Config,
    *,
    workspace: Optional[Sm90Workspace] = None,
    out: Optional[torch.Tensor] = None,
    stream_id: int = 0,
) -> Sm90Args:
    """One ``nvfp4_linear`` call -> kernel arguments (pure torch; works on CPU for tests).

    Raises ValueError / TypeError naming the problem (config, shape, dtype, layout). The config and shape
    rules are evaluated once per (config, M, N, K, gated) (:func:`_shape_reason`)."""
    _config_status(config).raise_if_failed("sm90 config")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"nvgemm_cutedsl sm90: x must be bfloat16 or float16, got {x.dtype}")
    if kind_of(x.dtype) != prepared.kind:
        raise ValueError(f"nvgemm_cutedsl sm90: the weight was prepared for {prepared.kind} activations, x is {x.dtype}")
    n, k = prepared.n, prepared.k
    if x.shape[-1] != k:
        raise ValueError(f"nvgemm_cutedsl sm90: x has K={x.shape[-1]}, the weight has K={k}")
    gated = activation == "silu_mul"
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    m = x2.shape[0]
    if why := _shape_reason(config, m, n, k, gated):
        raise ValueError(f"nvgemm_cutedsl sm90: {config.name()}: {why}")
    dev = x.device
    if input_scale is not None:
        x2 = qdq_activation(x2, input_scale)
    x2 = _aligned_rows(x2)
    alpha = _alpha(prepared, input_scale, dev)
    spec = _spec("vector" if alpha.numel() > 1 else "scalar", bias is not None, activation, residual is not None,
                 out_dtype or x.dtype)
    n_out = spec.out_features(n)
    if out is None:
        out = torch.empty((m, n_out), device=dev, dtype=spec.out_dtype)
    elif out.shape != (m, n_out) or out.dtype != spec.out_dtype or out.stride(-1) != 1:
        raise ValueError(f"nvgemm_cutedsl sm90: out must be {spec.out_dtype} {(m, n_out)} with unit stride")
    b = _fp32_on(bias, dev) if bias is not None else alpha
    if residual is not None:
        if residual.dtype != spec.out_dtype:
            raise TypeError(f"nvgemm_cutedsl sm90: residual must be {spec.out_dtype}, got {residual.dtype}")
        r = residual.reshape(m, n_out)
        if r.stride(-1) != 1:
            r = r.contiguous()
    else:
        r = out
    work, count = alpha, None
    need_w, need_c = split_k_needs(config, m, prepared, n_out, gated)
    if need_w and workspace is not None:
        workspace.ensure(need_w, need_c)
        work, count = workspace.work, workspace.count
    elif need_w:  # the shared pool: one pair per (device, stream), see nvgemm.templates.common.workspace
        work, count = WORKSPACES.get(dev, need_w, need_c, stream_id)
    if count is None:
        count = workspace.count if workspace is not None else _int32_dummy(dev)
    return Sm90Args(x2, prepared.weight, prepared.scale, alpha, b, r, out, work, count, spec, prepared)


@functools.lru_cache(maxsize=256)
def _config_status(config: Sm90W4A16Config):
    return validate_config(config)


@functools.lru_cache(maxsize=4096)
def _shape_reason(config: Sm90W4A16Config, m: int, n: int, k: int, gated: bool) -> Optional[str]:
    return shape_problem(config, m, n, k, gated)


@functools.lru_cache(maxsize=256)
def _spec(alpha: str, bias: bool, activation: str, residual: bool, out_dtype: torch.dtype) -> EpilogueSpec:
    return EpilogueSpec(alpha=alpha, bias=bias, activation=activation, residual=residual, out_dtype=out_dtype)


_DUMMY_I32: dict[str, torch.Tensor] = {}


def _int32_dummy(dev: torch.device) -> torch.Tensor:
    """One int32 per device for the counter slot of calls without split-K (never read)."""
    memo = device_memo(_DUMMY_I32)
    t = memo.get(str(dev))
    if t is None:
        t = memo.setdefault(str(dev), torch.zeros(1, dtype=torch.int32, device=dev))
    return t


def kernel_view_ref(args: Sm90Args, config: Sm90W4A16Config) -> torch.Tensor:
    """The kernels' arithmetic on the prepared arguments, in torch (fp64 sums) on any device.

    Decodes the prepared weight the kernel's way (:func:`~.operand.decode_ref`: rotations, masked XORs,
    re-encoded scales, the packed multiply -> ``E2M1 * s * 2**-7``), multiplies with the
    activations, restores 2**7 and runs the epilogue -- what the kernel computes up to fp32
    summation order (``config`` is validated; every family computes the same function)."""
    validate_config(config).raise_if_failed("sm90 config")
    p = args.prepared
    w = decode_ref(p)[: p.n, : p.k].double()  # E2M1 * s * 2**-7
    acc = (args.x.double() @ w.t()) * DECODE_UNSCALE
    res = args.residual if args.spec.residual else None
    alpha = args.alpha if args.alpha.numel() > 1 else args.alpha.reshape(())
    return epilogue_ref(acc.float(), args.spec, alpha, args.bias if args.spec.bias else None, res)


def launch_sm90(args: Sm90Args, kernel, stream) -> torch.Tensor:
    """Launch a loaded kernel (an ``AotKernel`` from the cache) on ``stream``; returns ``args.out``."""
    kernel.launch(*args.abi_values(), stream)
    return args.out


__all__ = [
    "Sm90Args",
    "Sm90Weight",
    "Sm90Workspace",
    "cached_sm90_weight",
    "kernel_view_ref",
    "launch_sm90",
    "prepare_sm90_args",
    "qdq_activation",
    "split_k_needs",
]
