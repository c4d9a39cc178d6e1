"""Host launcher of the sm_100a NVFP4 CuTeDSL GEMM: argument preparation, workspaces, launch.

:func:`prepare_sm100_args` turns one validated ``nvgemm::nvfp4_linear`` call (W4A4; the caller
passes its :class:`~nvgemm.epilogues.EpilogueSpec`) into the kernel's arguments -- it is pure torch
and runs on CPU, where tests check it against the emulated op through :func:`kernel_view_ref` (the
kernel's math expressed on the prepared arguments):

* activations are quantized by the ``quantize`` callable the caller passes (the backend gives the
  Triton quantizer on CUDA; default: the torch reference) -> packed E2M1 [M, K/2] + 128x4-swizzled
  e4m3 scales;
* alpha (:func:`nvgemm.core.validation.alpha_of`) as a device fp32 scalar (shape (1,)) or a per-N
  vector (fused shards with unequal ``weight_scale_2``), derived once per layer (:func:`alpha_vector`)
  and device-resident from then on: a warm call launches the quantizer and the GEMM, nothing else;
* swap-AB: A = weight / weight scales, B = activations / activation scales, MMA problem
  (m, n) = (N, M); the output buffer [M, N] row-major is the kernel's column-major C;
* alpha, bias and the residual are passed 16-byte aligned (copied when a caller's view is not:
  the kernel reads them with 16-byte vector loads);
* split-K: an fp32 workspace of tiles x S x tile_n x 128 values (laid out thread-major by the
  kernel, see :mod:`nvgemm.templates.sm100_w4a4.epilogue`) and int32 per-tile counters that must be
  zero at launch (the kernel resets them), from :class:`SplitKWorkspaces` -- safe under CUDA
  graph capture (see there);
* silu_mul: the kernel needs gate/up rows interleaved (:func:`interleave_gate_up`); the
  interleaved copy of a weight is made once and cached (keyed by the weight's storage, offset and
  version: :mod:`nvgemm.templates.common.derived`), which costs one extra copy of each gate_up weight in device
  memory (a loader that stores gate_up pre-interleaved would avoid that copy; not done); the permuted
  per-N vectors (weight_scale_2, bias) are derived once the same way;
* the fused requant launch writes every byte of its outputs (codes, and the swizzled scales with
  their zero padding), so both are ``torch.empty``.

The problem-level limits are the template's own rule
(:func:`nvgemm.templates.sm100_w4a4.validity.can_implement_problem`); a refused call raises
``ValueError`` with its reason. Backend registration, config selection and the kernel cache live
in :mod:`nvgemm.templates.sm100_w4a4.backend`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from nvgemm.core.epilogue import EpilogueSpec, apply_activation_ref
from nvgemm.core.formats import NVFP4, blocked_numel, dequantize, from_blocked, to_blocked
from nvgemm.core.validation import alpha_of
from nvgemm.templates.common.derived import DerivedCache, device_memo
from nvgemm.templates.common.workspace import WORKSPACES, SplitKWorkspaces, is_capturing as _is_capturing  # noqa: F401
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig
from nvgemm.templates.sm100_w4a4.validity import can_implement_problem
from nvgemm.templates.triton.reference import quantize_ref

CTA_TILE_M = 128


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


@dataclass
class Sm100Args:
    """Everything one launch needs, in the kernel's (MMA) terms."""

    a: torch.Tensor  # uint8 [m, K/2] packed E2M1
    b: torch.Tensor  # uint8 [n, K/2]
    sfa: torch.Tensor  # e4m3 1-D swizzled scales of A (rows = m)
    sfb: torch.Tensor  # e4m3 1-D swizzled scales of B (rows = n)
    out: torch.Tensor  # [tokens, N_out] row-major (the op's result)
    alpha: Optional[torch.Tensor]  # fp32 (1,) or (N,)
    bias: Optional[torch.Tensor]  # out dtype (N,)
    residual: Optional[torch.Tensor]  # out dtype [tokens, N] contiguous
    workspace: Optional[torch.Tensor]  # fp32, split-K only
    counters: Optional[torch.Tensor]  # int32 zeros, split-K only
    m: int
    n: int
    k: int
    spec: EpilogueSpec
    config: Sm100Nvfp4GemmConfig

    def kernel_c_view(self) -> torch.Tensor:
        """The [m, n] view of ``out`` the kernel writes (transposed for swap-AB)."""
        return self.out.t() if self.config.swap_ab else self.out


def splitk_workspace_shape(m: int, n: int, config: Sm100Nvfp4GemmConfig) -> tuple[int, int]:
    """(workspace fp32 elements, number of per-tile counters) for MMA problem (m, n)."""
    tiles_m = _round_up(_ceil_div(m, CTA_TILE_M), config.cluster_m)
    tiles_n = _round_up(_ceil_div(n, config.tile_n), config.cluster_n)
    tiles = tiles_m * tiles_n
    return tiles * config.split_k * config.tile_n * CTA_TILE_M, tiles


def splitk_buffers(device: torch.device, m: int, n: int, config: Sm100Nvfp4GemmConfig, stream_id: int = 0):
    """Workspace + zeroed counters for MMA problem (m, n) from the process-wide pool."""
    ws_numel, n_cnt = splitk_workspace_shape(m, n, config)
    return WORKSPACES.get(device, ws_numel, n_cnt, stream_id)


_PERMS: dict[tuple[int, str], torch.Tensor] = {}


def gate_up_permutation(n: int, device=None) -> torch.Tensor:
    """GEMM row order of an interleaved gate_up weight: row 2j = gate j, row 2j+1 = up j (built once per
    (N, device) and kept: only the one-time derivations below index with it)."""
    if n % 2:
        raise ValueError(f"silu_mul needs an even number of GEMM rows, got N={n}")
    key = (n, str(torch.device(device) if device is not None else torch.device("cpu")))
    perms = device_memo(_PERMS)
    perm = perms.get(key)
    if perm is None:
        h = n // 2
        idx = torch.arange(h, device=device)
        perm = perms.setdefault(key, torch.stack([idx, idx + h], dim=1).reshape(-1))
    return perm


GATED = DerivedCache()
#: per-call operands derived from the layer's own tensors (alpha, the device copy of a host input_scale,
#: a gate_up bias in GEMM row order, the requant's alpha + next input_scale buffer): derived on the first
#: call, then device-resident (re-derived into the same buffers after an in-place update)
DERIVED = DerivedCache()


def _derive(tag: str, anchor: torch.Tensor, inputs: tuple, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    return DERIVED.get(tag, anchor, inputs, make, capturing=_is_capturing)


def device_scalar(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """``t`` as an fp32 0-d tensor on ``dev``: ``t`` itself when it already is one, else a copy made once
    (a host ``input_scale`` is not copied to the GPU per call)."""
    if t.device == dev and t.dtype == torch.float32 and t.dim() == 0:
        return t
    return _derive(f"scalar:{dev}", t, (t,), lambda: t.to(device=dev, dtype=torch.float32).reshape(()).clone())


def interleave_gate_up(weight, weight_scale, weight_scale_2, bias):
    """(weight, swizzled weight_scale, weight_scale_2, bias) with gate/up rows interleaved.

    Each is derived once per source storage and version (:mod:`nvgemm.templates.common.derived`: a
    per-call view such as ``weight_scale.view(e4m3)`` of a uint8 scale hits; an in-place update
    re-derives into the same buffers); a scalar weight_scale_2 is returned as is."""
    n, kb = weight.shape[0], weight.shape[1] * 2 // NVFP4.block_size
    dev = weight.device

    def make():
        perm = gate_up_permutation(n, dev)
        return weight[perm].contiguous(), to_blocked(from_blocked(weight_scale, n, kb)[perm].contiguous())

    w_i, s_i = GATED.get("gate_up", weight, (weight, weight_scale), make, capturing=_is_capturing)
    w2 = weight_scale_2
    if weight_scale_2.dim() == 1:
        w2 = _derive("gate_up:ws2", weight_scale_2, (weight_scale_2,),
                     lambda: weight_scale_2[gate_up_permutation(n, weight_scale_2.device)].contiguous())
    b = None
    if bias is not None:
        b = _derive("gate_up:bias", bias, (bias,), lambda: bias[gate_up_permutation(n, bias.device)].contiguous())
    return w_i, s_i, w2, b


def alpha_vector(weight_scale_2: torch.Tensor, input_scale: torch.Tensor, dev: torch.device, *,
                 gated: bool = False, next_input_scale: Optional[torch.Tensor] = None,
                 with_alpha: bool = True) -> torch.Tensor:
    """The kernel's 16-byte aligned fp32 alpha operand (:func:`~nvgemm.core.validation.alpha_of`: shape (1,)
    or (N,); gate/up interleaved when ``gated``; followed by ``next_input_scale`` for the fused requant
    ABI), derived once per (weight_scale_2, input_scale[, next_input_scale]) and kept on ``dev``."""
    n = weight_scale_2.numel()

    def make():
        w2 = weight_scale_2
        if gated and w2.dim() == 1:
            w2 = w2[gate_up_permutation(n, w2.device)]
        a = alpha_of(w2, input_scale, dev).reshape(-1) if with_alpha else torch.zeros(0, device=dev)
        if next_input_scale is not None:
            a = torch.cat([a, next_input_scale.to(device=dev, dtype=torch.float32).reshape(1)])
        return _aligned16(a)

    inputs = (weight_scale_2, input_scale) if next_input_scale is None else (weight_scale_2, input_scale,
                                                                            next_input_scale)
    tag = (f"alpha:{dev}:{'gated' if gated else 'plain'}:{'requant' if next_input_scale is not None else 'gemm'}"
           f"{'' if with_alpha else ':no-alpha'}")
    return _derive(tag, weight_scale_2, inputs, make)


def check_problem(config: Sm100Nvfp4GemmConfig, tokens: int, n: int, k: int, spec: EpilogueSpec) -> None:
    """The template's problem rule for one call (ValueError with the reason when ``config`` cannot run it)."""
    st = can_implement_problem(config, m=tokens, n=n, k=k, out_bytes=spec.out_dtype.itemsize,
                               activation=spec.activation)
    if not st:
        raise ValueError(f"nvgemm_cutedsl sm100: {config.name()} cannot run this call: {st.reason}")


def _aligned16(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a 16-byte aligned base (the kernel reads it with 16-byte vectors)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def prepare_sm100_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    spec: EpilogueSpec,
    config: Sm100Nvfp4GemmConfig,
    *,
    stream_id: int = 0,
    quantized: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    quantize: Optional[Callable] = None,
    next_input_scale: Optional[torch.Tensor] = None,
    checked: bool = False,
) -> Sm100Args:
    """The kernel's arguments for one call; ``spec`` is the call's validated epilogue
    (``nvgemm.core.validation.check_linear_args``). Raises ValueError naming the problem when the template
    cannot implement it. ``quantize(x [M, K], input_scale, swizzle=True) -> (packed, flat swizzled
    scales)`` quantizes the activation (default: the torch reference,
    :func:`nvgemm.templates.triton.reference.quantize_ref`). ``quantized`` = (packed codes [M, K/2],
    flat swizzled e4m3 scales): the activation arrives quantized (``nvgemm::nvfp4_linear_prequant``);
    ``x`` is then unused (None) and nothing is re-quantized. ``next_input_scale``: the fused requant
    launch's alpha operand (alpha values, then that scale; :func:`prepare_sm100_requant_args`).
    ``checked``: the caller's per-problem plan has already run :func:`check_problem` for this
    (config, M, N, K, epilogue).

    Per call this allocates the output (``torch.empty``: the kernel writes every element) and runs no
    device work but the activation quantizer: alpha, a host input_scale's device copy and the gate/up
    interleaved operands are derived once (:data:`DERIVED`, :data:`GATED`); split-K buffers come from
    the shared pool with counters the kernel leaves at zero."""
    if input_scale is None:
        raise ValueError("nvgemm_cutedsl sm100: the W4A4 kernel needs input_scale (W4A16 is not this kernel)")
    n, k = weight.shape[0], weight.shape[1] * 2
    if quantized is None:
        dev = x.device
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        tokens = x2.shape[0]
    else:
        dev = quantized[0].device
        tokens = quantized[0].shape[0]
    if not checked:
        check_problem(config, tokens, n, k, spec)
    n_out = spec.out_features(n)

    if quantized is None:
        xq, xs = (quantize or quantize_ref)(x2.contiguous(), device_scalar(input_scale, dev), True)
    else:
        xq, xs = quantized[0].contiguous(), quantized[1].contiguous()
    wq = weight.contiguous()
    ws_ = weight_scale.view(torch.float8_e4m3fn) if weight_scale.dtype == torch.uint8 else weight_scale
    xs = xs.view(torch.float8_e4m3fn) if xs.dtype == torch.uint8 else xs
    if xs.numel() != blocked_numel(tokens, k // NVFP4.block_size):
        raise ValueError("nvgemm_cutedsl sm100: activation quantizer returned unswizzled/misshapen scales")

    if spec.gated:
        wq, ws_, _w2, bias = interleave_gate_up(wq, ws_, weight_scale_2, bias)
    alpha = None
    if spec.alpha != "none" or next_input_scale is not None:
        alpha = alpha_vector(weight_scale_2, input_scale, dev, gated=spec.gated, next_input_scale=next_input_scale,
                             with_alpha=spec.alpha != "none")
    out = torch.empty((tokens, n_out), dtype=spec.out_dtype, device=dev)
    bias_k = None
    if bias is not None:
        if bias.dtype != spec.out_dtype:
            raise ValueError(f"nvgemm_cutedsl sm100: bias dtype {bias.dtype} must equal the output dtype {spec.out_dtype}")
        bias_k = _aligned16(bias)
    res_k = None
    if residual is not None:
        if residual.dtype != spec.out_dtype:
            raise ValueError(
                f"nvgemm_cutedsl sm100: residual dtype {residual.dtype} must equal the output dtype {spec.out_dtype}"
            )
        res_k = _aligned16(residual.reshape(tokens, n_out))

    ws_ = ws_.reshape(-1)  # the kernel reads the flat 128x4 bytes
    if config.swap_ab:
        a, sfa, b, sfb, m_k, n_k = wq, ws_, xq, xs, n, tokens
    else:
        a, sfa, b, sfb, m_k, n_k = xq, xs, wq, ws_, tokens, n
    ws = cnt = None
    if config.split_k > 1:
        ws, cnt = splitk_buffers(dev, m_k, n_k, config, stream_id)
    return Sm100Args(a, b, sfa, sfb, out, alpha, bias_k, res_k, ws, cnt, m_k, n_k, k, spec, config)


def prepare_sm100_requant_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_input_scale: torch.Tensor,
    spec: EpilogueSpec,
    config: Sm100Nvfp4GemmConfig,
    quantize: Optional[Callable] = None,
    checked: bool = False,
    quantized: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> Sm100Args:
    """Arguments of the fused SwiGLU + NVFP4 requant launch (``spec.out_quant``): those of the gated
    GEMM (``quantized``: the activation arrives quantized, ``x`` is None, as in :func:`prepare_sm100_args`),
    with ``out`` = packed codes [tokens, I/2] (uint8), ``residual`` = the 128x4-swizzled scale bytes
    of the [tokens, I/16] matrix (both ``torch.empty``: the kernel writes every byte, the layout's padding
    rows and K blocks as zeros) and ``alpha`` = the alpha values followed by the next layer's input_scale
    (the kernel's ABI; derived once, see :func:`alpha_vector`)."""
    if not spec.out_quant:
        raise ValueError("prepare_sm100_requant_args: the epilogue spec must have out_quant=True")
    if not (config.swap_ab and config.tile_m == 128):
        raise ValueError(f"nvgemm_cutedsl sm100: the fused requant epilogue needs a 1-CTA swap-AB config, "
                         f"got {config.name()}")
    i = weight.shape[0] // 2
    if weight.shape[0] % 2 or i % NVFP4.block_size:
        raise ValueError(f"nvgemm_cutedsl sm100: fused requant needs N = 2I with I % 16 == 0, got N={weight.shape[0]}")
    if out_input_scale.dtype != torch.float32 or out_input_scale.numel() != 1:
        raise ValueError(f"nvgemm_cutedsl sm100: out_input_scale must be a float32 scalar, got "
                         f"{out_input_scale.dtype} {tuple(out_input_scale.shape)}")
    args = prepare_sm100_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, None, without_quant(spec),
                              config, quantize=quantize, next_input_scale=out_input_scale, checked=checked,
                              quantized=quantized)
    tokens, dev = args.n, weight.device
    # every byte is written by the kernel: the codes of every (token, feature pair), and the whole
    # 128x4-swizzled scale tile of each 64-feature column group, padding rows / K blocks as zeros
    codes = torch.empty((tokens, i // 2), dtype=torch.uint8, device=dev)
    scales = torch.empty(blocked_numel(tokens, i // NVFP4.block_size), dtype=torch.uint8, device=dev)
    args.out, args.residual, args.spec = codes, scales, spec
    return args


@functools.lru_cache(maxsize=256)
def without_quant(spec: EpilogueSpec) -> EpilogueSpec:
    """The gated GEMM's spec under a fused requant spec."""
    return dataclasses.replace(spec, out_quant=False)



#: swap-AB token tiles of the fused requant launch (smallest holding every token; the kernel needs 1-CTA swap-AB)
REQUANT_TILE_N = (8, 16, 32, 64, 128)


def requant_config(m: int) -> Optional[Sm100Nvfp4GemmConfig]:
    """The fused requant launch's config for ``m`` tokens: the smallest 1-CTA swap-AB tile holding every token
    in one N tile; None above 128 tokens (decode sizes only: larger M runs the unfused chain)."""
    tile_n = next((t for t in REQUANT_TILE_N if t >= m), None)
    return None if tile_n is None else Sm100Nvfp4GemmConfig(tile_n=tile_n, swap_ab=True)


def kernel_view_ref(args: Sm100Args) -> torch.Tensor:
    """The kernel's math on the prepared arguments, in torch fp32 (CPU-testable): decode A/B
    with their own scales, C = A @ B^T in the MMA's (m, n) frame, the epilogue with per-feature
    vectors indexed along the MMA row when swap-AB, written through ``kernel_c_view()``."""
    kb = args.k // NVFP4.block_size
    A = dequantize(args.a, from_blocked(args.sfa, args.m, kb))
    B = dequantize(args.b, from_blocked(args.sfb, args.n, kb))
    C = A @ B.t()  # [m, n] fp32
    feat_dim = 0 if args.config.swap_ab else 1
    shape = (-1, 1) if feat_dim == 0 else (1, -1)
    y = C
    if args.spec.alpha == "scalar":
        y = y * args.alpha.reshape(())
    elif args.spec.alpha == "vector":
        y = y * args.alpha.reshape(shape)
    if args.spec.bias:
        y = y + args.bias.float().reshape(shape)
    if args.spec.gated:
        # interleaved features: 2j = gate j, 2j+1 = up j (along the MMA rows when swap-AB)
        g, u = (y[0::2], y[1::2]) if args.config.swap_ab else (y[:, 0::2], y[:, 1::2])
        y = g * torch.sigmoid(g) * u
    else:
        y = apply_activation_ref(y, args.spec.activation)
    if args.spec.residual:
        r = args.residual.float()
        y = y + (r.t() if args.config.swap_ab else r)
    out = torch.full_like(args.out, float("nan"))
    view = out.t() if args.config.swap_ab else out
    view.copy_(y.to(args.spec.out_dtype))
    return out


# --------------------------------------------------------------------------- launch


def launch_sm100(args: Sm100Args, kernel, stream) -> torch.Tensor:
    """Launch a loaded kernel (``AotKernel`` from the cache) on ``stream``; returns ``args.out``."""
    kernel.launch(
        args.a, args.b, args.sfa, args.sfb, args.out,
        args.alpha if args.alpha is not None else 0,
        args.bias if args.bias is not None else 0,
        args.residual if args.residual is not None else 0,
        args.workspace if args.workspace is not None else 0,
        args.counters if args.counters is not None else 0,
        args.m, args.n, args.k, stream,
    )
    return args.out
