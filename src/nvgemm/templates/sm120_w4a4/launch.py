"""Host launcher of the sm_120a / sm_121a NVFP4 W4A4 decode kernel: arguments, workspaces, launch,
and the torch view of the kernel's arithmetic. Pure torch (no cutlass).

Per call (:func:`prepare_sm120_args`) the host quantizes the activations (the ``quantize``
callable the backend passes: the Triton quantizer on CUDA; default the torch reference, the same
convention bit for bit: :mod:`nvgemm.core.formats`) into packed E2M1 [M, K/2] + 128x4-swizzled
e4m3 scales, allocates the output, and launches. The weights are read in place (packed [N, K/2]
and the checkpoint's swizzled scales: no prepared copy). Derived once per layer and kept
device-resident (:data:`nvgemm.templates.sm100_w4a4.launch.DERIVED`): alpha = weight_scale_2 x
input_scale (scalar or per feature), a bias as fp32. Split-K partials and tile counters come from
the shared pool (:data:`nvgemm.templates.common.workspace.WORKSPACES`) or an explicit
:class:`Sm120Workspace`; the kernel leaves every counter at zero (CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from nvgemm.core.epilogue import EpilogueSpec, epilogue_ref
from nvgemm.core.formats import NVFP4, blocked_numel, dequantize, from_blocked
from nvgemm.templates.common.workspace import WORKSPACES
from nvgemm.templates.sm100_w4a4.launch import _aligned16, _derive, alpha_vector, device_scalar
from nvgemm.templates.sm120_w4a4.config import ROW_TILE, Sm120W4A4Config
from nvgemm.templates.sm120_w4a4.validity import can_implement_problem
from nvgemm.templates.triton.reference import quantize_ref


@dataclass
class Sm120Args:
    """The kernel's arguments, in ABI order (:func:`~.kernel.abi_args`)."""

    x: torch.Tensor  # uint8 [M, K/2] packed E2M1 activations
    x_scale: torch.Tensor  # uint8 flat 128x4-swizzled e4m3 scales of x
    weight: torch.Tensor  # uint8 [N, K/2]
    weight_scale: torch.Tensor  # uint8 flat swizzled
    alpha: torch.Tensor  # fp32 (1,) | (N,)
    bias: torch.Tensor  # fp32 (N,), or a tensor the kernel never reads
    residual: torch.Tensor  # [M, N_out] out dtype, or a tensor the kernel never reads
    out: torch.Tensor  # [M, N_out]
    work: torch.Tensor  # fp32 split-K partials, or a tensor the kernel never reads
    count: torch.Tensor  # int32 tile counters, or a tensor the kernel never reads
    spec: EpilogueSpec
    config: Sm120W4A4Config

    def abi_values(self) -> tuple:
        return (self.x, self.x_scale, self.weight, self.weight_scale, self.alpha, self.bias, self.residual, self.out,
                self.work, self.count)

    @property
    def m(self) -> int:
        return self.x.shape[0]

    @property
    def n(self) -> int:
        return self.weight.shape[0]

    @property
    def k(self) -> int:
        return self.weight.shape[1] * 2


class Sm120Workspace:
    """An explicit split-K workspace (fp32 partials, int32 tile counters, zeroed once) for one stream."""

    def __init__(self, device: torch.device, work_numel: int = 1 << 20, count_numel: int = 1 << 12):
        self.device = device
        self.work = torch.empty(work_numel, dtype=torch.float32, device=device)
        self.count = torch.zeros(count_numel, dtype=torch.int32, device=device)

    def get(self, work_numel: int, count_numel: int):
        if work_numel > self.work.numel():
            self.work = torch.empty(work_numel, dtype=torch.float32, device=self.device)
        if count_numel > self.count.numel():
            self.count = torch.zeros(count_numel, dtype=torch.int32, device=self.device)
        return self.work, self.count


def split_k_needs(config: Sm120W4A4Config, m: int, n: int, n_out: int, gated: bool) -> tuple[int, int]:
    """(fp32 workspace elements ``[split][M][n_pad]``, tile counters) of one call (0, 0 without split-K)."""
    if config.split_k <= 1:
        return 0, 0
    feat = config.tile_n // 2 if gated else config.tile_n
    n_pad = -(-n // ROW_TILE) * ROW_TILE
    return config.split_k * m * n_pad, -(-n_out // feat) * -(-m // config.tile_m)


def check_problem(config: Sm120W4A4Config, tokens: int, n: int, k: int, spec: EpilogueSpec) -> None:
    """The template's problem rule for one call (ValueError with the reason when ``config`` cannot run it)."""
    st = can_implement_problem(config, m=tokens, n=n, k=k, activation=spec.activation)
    if not st:
        raise ValueError(f"nvgemm_cutedsl sm120: {config.name()} cannot run this call: {st.reason}")


def _fp32_bias(bias: torch.Tensor, dev: torch.device) -> torch.Tensor:
    if bias.dtype == torch.float32 and bias.device == dev and bias.is_contiguous():
        return bias
    return _derive(f"sm120:bias:{dev}", bias, (bias,), lambda: bias.to(device=dev, dtype=torch.float32).contiguous())


def prepare_sm120_args(
    x: Optional[torch.Tensor],
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    spec: EpilogueSpec,
    config: Sm120W4A4Config,
    *,
    stream_id: int = 0,
    quantize: Optional[Callable] = None,
    quantized: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    workspace: Optional[Sm120Workspace] = None,
    checked: bool = False,
) -> Sm120Args:
    """The kernel's arguments for one validated ``nvfp4_linear`` call (W4A4). ``quantize(x [M, K],
    input_scale, swizzle=True) -> (packed, flat swizzled scales)`` (default: the torch reference);
    ``quantized`` = (packed [M, K/2], swizzled scales): the activation arrives quantized, ``x`` unused.
    Raises ValueError naming the problem when the template cannot implement the call."""
    if input_scale is None:
        raise ValueError("nvgemm_cutedsl sm120: the W4A4 kernel needs input_scale (W4A16 is not this kernel)")
    n, k = weight.shape[0], weight.shape[1] * 2
    if quantized is None:
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        dev, tokens = x2.device, x2.shape[0]
    else:
        dev, tokens = quantized[0].device, quantized[0].shape[0]
    if not checked:
        check_problem(config, tokens, n, k, spec)
    n_out = spec.out_features(n)
    if quantized is None:
        xq, xs = (quantize or quantize_ref)(x2.contiguous(), device_scalar(input_scale, dev), True)
    else:
        xq, xs = quantized
    xq = _aligned16(xq)
    xs = _aligned16(xs.reshape(-1).view(torch.uint8))
    if xs.numel() != blocked_numel(tokens, k // NVFP4.block_size):
        raise ValueError("nvgemm_cutedsl sm120: activation scales are not the 128x4-swizzled [M, K/16] layout")
    ws_ = weight_scale.reshape(-1).view(torch.uint8) if weight_scale.element_size() == 1 else None
    if ws_ is None or ws_.numel() != blocked_numel(n, k // NVFP4.block_size):
        raise ValueError("nvgemm_cutedsl sm120: weight_scale must be the 128x4-swizzled e4m3 [N, K/16] scales")
    alpha = alpha_vector(weight_scale_2, input_scale, dev)
    out = torch.empty((tokens, n_out), dtype=spec.out_dtype, device=dev)
    bias_k = _fp32_bias(bias, dev) if bias is not None else alpha
    res_k = out
    if residual is not None:
        if residual.dtype != spec.out_dtype:
            raise ValueError(f"nvgemm_cutedsl sm120: residual dtype {residual.dtype} must equal the output dtype "
                             f"{spec.out_dtype}")
        res_k = residual.reshape(tokens, n_out)
        if res_k.stride(-1) != 1:
            res_k = res_k.contiguous()
    work, count = alpha, _count_stand_in(dev)  # never read without split-K
    if config.split_k > 1:
        wn, cn = split_k_needs(config, tokens, n, n_out, spec.gated)
        work, count = workspace.get(wn, cn) if workspace is not None else WORKSPACES.get(dev, wn, cn, stream_id)
    return Sm120Args(xq, xs, _aligned16(weight), _aligned16(ws_), alpha, bias_k, res_k, out, work, count, spec,
                     config)


def prepare_sm120_requant_args(
    x: Optional[torch.Tensor],
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    spec: EpilogueSpec,
    config: Sm120W4A4Config,
    *,
    stream_id: int = 0,
    quantize: Optional[Callable] = None,
    quantized: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    workspace: Optional[Sm120Workspace] = None,
    checked: bool = False,
) -> Sm120Args:
    """Arguments of the fused SwiGLU + NVFP4 requant launch (``spec.out_quant``; gate_up weight in the
    checkpoint order [gate; up]): those of the gated GEMM, with ``out`` = packed codes [tokens, I/2]
    (``torch.empty``: the kernel writes every byte), ``residual`` = the 128x4-swizzled scale bytes of the
    [tokens, I/16] matrix (``torch.zeros``: the kernel writes the real entries, the layout's padding stays
    zero) and ``alpha`` = the alpha values followed by the next layer's input_scale."""
    if not spec.out_quant:
        raise ValueError("prepare_sm120_requant_args: the epilogue spec must have out_quant=True")
    n = weight.shape[0]
    if n % 2 or (n // 2) % NVFP4.block_size:
        raise ValueError(f"nvgemm_cutedsl sm120: fused requant needs N = 2I with I % 16 == 0, got N={n}")
    if out_input_scale.dtype != torch.float32 or out_input_scale.numel() != 1:
        raise ValueError(f"nvgemm_cutedsl sm120: out_input_scale must be a float32 scalar, got "
                         f"{out_input_scale.dtype} {tuple(out_input_scale.shape)}")
    args = prepare_sm120_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, spec, config,
                              stream_id=stream_id, quantize=quantize, quantized=quantized, workspace=workspace,
                              checked=checked)
    dev, tokens, i = args.out.device, args.m, n // 2
    args.alpha = alpha_vector(weight_scale_2, input_scale, dev, next_input_scale=out_input_scale)
    args.out = torch.empty((tokens, i // 2), dtype=torch.uint8, device=dev)
    args.residual = torch.zeros(blocked_numel(tokens, i // NVFP4.block_size), dtype=torch.uint8, device=dev)
    return args


_COUNT_STAND_IN: dict = {}


def _count_stand_in(dev: torch.device) -> torch.Tensor:
    """An int32 tensor for the counter slot of a kernel without split-K (never read), one per device."""
    t = _COUNT_STAND_IN.get(str(dev))
    if t is None:
        t = _COUNT_STAND_IN.setdefault(str(dev), torch.zeros(1, dtype=torch.int32, device=dev))
    return t


def kernel_view_ref(args: Sm120Args) -> torch.Tensor:
    """The kernel's math on the prepared arguments in torch fp32 (CPU-testable): both operands decoded
    with their own block scales, ``X @ W^T`` in fp32, then nvgemm's epilogue (alpha -> bias ->
    activation -> residual -> one rounding)."""
    kb = args.k // NVFP4.block_size
    xs = from_blocked(args.x_scale.view(torch.float8_e4m3fn), args.m, kb)
    ws = from_blocked(args.weight_scale.view(torch.float8_e4m3fn), args.n, kb)
    acc = dequantize(args.x, xs) @ dequantize(args.weight, ws).t()
    alpha = args.alpha.reshape(()) if args.spec.alpha == "scalar" else args.alpha
    return epilogue_ref(acc, args.spec, alpha, args.bias if args.spec.bias else None,
                        args.residual if args.spec.residual else None)


def launch_sm120(args: Sm120Args, kernel, stream) -> torch.Tensor:
    """Launch a loaded kernel (``AotKernel`` from the cache) on ``stream``; returns ``args.out``."""
    kernel.launch(*args.abi_values(), stream)
    return args.out


__all__ = ["Sm120Args", "Sm120Workspace", "check_problem", "kernel_view_ref", "launch_sm120", "prepare_sm120_args",
           "prepare_sm120_requant_args", "split_k_needs"]
