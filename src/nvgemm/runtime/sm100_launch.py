"""Host side of the sm_100a NVFP4 CuTeDSL GEMM: argument preparation, launch, backend.

:func:`prepare_sm100_args` turns one ``nvgemm::nvfp4_linear`` call (W4A4) into the kernel's
arguments — it is pure torch and runs on CPU, where tests check it against the emulated op
through :func:`kernel_view_ref` (the kernel's math expressed on the prepared arguments):

* activations are quantized with ``torch.ops.nvgemm.quantize_nvfp4(x, input_scale,
  swizzle=True)`` -> packed E2M1 [M, K/2] + 128x4-swizzled e4m3 scales;
* ``alpha = input_scale * weight_scale_2`` as a device fp32 scalar (shape (1,)) or a per-N
  vector (fused shards with unequal ``weight_scale_2``);
* swap-AB: A = weight / weight scales, B = activations / activation scales, MMA problem
  (m, n) = (N, M); the output buffer [M, N] row-major is the kernel's column-major C;
* split-K: an fp32 workspace [tiles, S, tile_n, 128] and int32 per-tile counters that must
  be zero at launch (the kernel resets them), cached per (device, stream);
* silu_mul: the kernel needs gate/up rows interleaved (:func:`interleave_gate_up`); the
  interleaved copy of a weight is made once and cached (keyed by the weight's storage and
  version), which costs one extra copy of each gate_up weight in device memory. A loader
  that stores gate_up pre-interleaved would avoid that copy (not done).

The backend ``cutedsl_sm100`` registers with ``nvgemm.runtime.backends``; its ``supports()``
requires a CUDA device of the sm_100 family (capability 10.x), so on CPU and other GPUs it is
never selected. Kernels come from the kernel cache (``nvgemm.runtime.cache``), compiled for an
explicit arch with explicit hardware numbers.
"""

from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Optional

import torch

from ..epilogues.spec import EpilogueSpec
from ..formats import NVFP4, blocked_numel
from ..templates.sm100_config import Sm100Nvfp4GemmConfig
from .backends import Backend, LinearProblem, register_backend

TEMPLATE_ID = "sm100_nvfp4_gemm"
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


_WS_LOCK = threading.Lock()
_WS_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _splitk_buffers(device: torch.device, m: int, n: int, config: Sm100Nvfp4GemmConfig, stream_id: int):
    """Workspace + zeroed counters, grown on demand and reused per (device, stream): the
    kernel leaves every counter at 0, and launches on one stream are ordered."""
    ws_numel, n_cnt = splitk_workspace_shape(m, n, config)
    key = (str(device), stream_id)
    with _WS_LOCK:
        ws, cnt = _WS_CACHE.get(key, (None, None))
        if ws is None or ws.numel() < ws_numel:
            ws = torch.empty(ws_numel, dtype=torch.float32, device=device)
        if cnt is None or cnt.numel() < n_cnt:
            cnt = torch.zeros(n_cnt, dtype=torch.int32, device=device)
        _WS_CACHE[key] = (ws, cnt)
    return ws, cnt


def gate_up_permutation(n: int, device=None) -> torch.Tensor:
    """GEMM row order of an interleaved gate_up weight: row 2j = gate j, row 2j+1 = up j."""
    if n % 2:
        raise ValueError(f"silu_mul needs an even number of GEMM rows, got N={n}")
    h = n // 2
    idx = torch.arange(h, device=device)
    return torch.stack([idx, idx + h], dim=1).reshape(-1)


_GATED_LOCK = threading.Lock()
_GATED_CACHE: dict[tuple, tuple] = {}


def interleave_gate_up(weight, weight_scale, weight_scale_2, bias):
    """(weight, swizzled weight_scale, weight_scale_2, bias) with gate/up rows interleaved.

    The packed weight and its (re-swizzled) scales are cached per weight storage + version;
    per-N vectors (weight_scale_2, bias) are permuted per call (they are small)."""
    from ..formats import from_blocked, to_blocked

    n, kb = weight.shape[0], weight.shape[1] * 2 // NVFP4.block_size
    perm = gate_up_permutation(n, weight.device)
    key = (id(weight), weight._version, id(weight_scale), weight_scale._version)
    with _GATED_LOCK:
        hit = _GATED_CACHE.get(key)
    # the entry must belong to these very tensor objects (ids are reused after a tensor dies)
    if hit is None or hit[0]() is not weight or hit[1]() is not weight_scale:
        w_i = weight[perm].contiguous()
        s_i = to_blocked(from_blocked(weight_scale, n, kb)[perm].contiguous())
        hit = (weakref.ref(weight), weakref.ref(weight_scale), w_i, s_i)
        with _GATED_LOCK:
            _GATED_CACHE[key] = hit
        weakref.finalize(weight, _GATED_CACHE.pop, key, None)  # drop the copy with its source
    w2 = weight_scale_2[perm] if weight_scale_2.dim() == 1 else weight_scale_2
    b = bias[perm] if bias is not None else None
    return hit[2], hit[3], w2, b


def prepare_sm100_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    activation: str,
    out_dtype: Optional[torch.dtype],
    config: Sm100Nvfp4GemmConfig,
    *,
    stream_id: int = 0,
) -> Sm100Args:
    from ..ops import check_linear_args

    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    if input_scale is None:
        raise ValueError("nvgemm_cutedsl sm100: the W4A4 kernel needs input_scale (W4A16 is not this kernel)")
    n, k = weight.shape[0], weight.shape[1] * 2
    if k % 32:
        raise ValueError(f"nvgemm_cutedsl sm100: K={k} must be a multiple of 32 (16-byte TMA rows of packed FP4)")
    ob = torch.empty((), dtype=spec.out_dtype).element_size()
    n_out = spec.out_features(n)
    if (n_out * ob) % 16:
        raise ValueError(
            f"nvgemm_cutedsl sm100: output rows of {n_out} {spec.out_dtype} values are not a multiple of 16 bytes "
            f"(the output width must be a multiple of {16 // ob})"
        )
    dev = x.device
    x2 = x.reshape(-1, k)
    tokens = x2.shape[0]
    if tokens == 0:
        raise ValueError("nvgemm_cutedsl sm100: empty input (M=0)")
    k_tiles = _ceil_div(k, 256)
    if config.split_k > k_tiles:
        raise ValueError(f"nvgemm_cutedsl sm100: split_k={config.split_k} exceeds the {k_tiles} K tiles (K={k})")

    xq, xs = torch.ops.nvgemm.quantize_nvfp4(x2.contiguous(), input_scale.to(dev).reshape(()), True)
    wq = weight.contiguous()
    ws_ = weight_scale.view(torch.float8_e4m3fn) if weight_scale.dtype == torch.uint8 else weight_scale
    xs = xs.view(torch.float8_e4m3fn) if xs.dtype == torch.uint8 else xs
    if xs.numel() != blocked_numel(tokens, k // NVFP4.block_size):
        raise ValueError("nvgemm_cutedsl sm100: activation quantizer returned unswizzled/misshapen scales")

    alpha = (input_scale.float().reshape(()).to(dev) * weight_scale_2.float().to(dev)).reshape(-1).contiguous()

    if spec.gated:
        wq, ws_, w2, bias = interleave_gate_up(wq, ws_, weight_scale_2, bias)
        alpha = (input_scale.float().reshape(()).to(dev) * w2.float().to(dev)).reshape(-1).contiguous()
    out = torch.empty((tokens, n_out), dtype=spec.out_dtype, device=dev)
    bias_k = None
    if bias is not None:
        if bias.dtype != spec.out_dtype:
            raise ValueError(f"nvgemm_cutedsl sm100: bias dtype {bias.dtype} must equal the output dtype {spec.out_dtype}")
        bias_k = bias.contiguous()
    res_k = None
    if residual is not None:
        if residual.dtype != spec.out_dtype:
            raise ValueError(
                f"nvgemm_cutedsl sm100: residual dtype {residual.dtype} must equal the output dtype {spec.out_dtype}"
            )
        res_k = residual.reshape(tokens, n_out).contiguous()

    if config.swap_ab:
        a, sfa, b, sfb, m_k, n_k = wq, ws_, xq, xs, n, tokens
    else:
        a, sfa, b, sfb, m_k, n_k = xq, xs, wq, ws_, tokens, n
    if config.tile_n < 64 and n_k > config.tile_n:
        raise ValueError(
            f"nvgemm_cutedsl sm100: narrow tile_n={config.tile_n} needs the kernel-N extent ({n_k}) <= tile_n"
        )
    ws = cnt = None
    if config.split_k > 1:
        ws, cnt = _splitk_buffers(dev, m_k, n_k, config, stream_id)
    return Sm100Args(a, b, sfa, sfb, out, alpha if spec.alpha != "none" else None, bias_k, res_k, ws, cnt,
                     m_k, n_k, k, spec, config)


def kernel_view_ref(args: Sm100Args) -> torch.Tensor:
    """The kernel's math on the prepared arguments, in torch fp32 (CPU-testable): decode A/B
    with their own scales, C = A @ B^T in the MMA's (m, n) frame, the epilogue with per-feature
    vectors indexed along the MMA row when swap-AB, written through ``kernel_c_view()``."""
    from ..epilogues.spec import apply_activation_ref
    from ..formats import dequantize, from_blocked

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


# --------------------------------------------------------------------------- launch / backend


def compile_spec_for(config: Sm100Nvfp4GemmConfig, spec: EpilogueSpec, arch: str, sm_count: int):
    from ..templates.registry import HardwareSpec
    from .compile_spec import make_spec

    return make_spec(TEMPLATE_ID, config, arch, epilogue=spec, hw=HardwareSpec(sm_count=sm_count))


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


def arch_of(capability: tuple[int, int]) -> str:
    major, minor = capability
    if major != 10:
        raise ValueError(f"nvgemm_cutedsl sm100: capability {major}.{minor} is not the sm_100 family")
    return {0: "sm_100a", 3: "sm_103a"}.get(minor, "sm_100f")


def supports(p: LinearProblem) -> Optional[str]:
    if p.device_type != "cuda":
        return f"needs a CUDA device (got {p.device_type})"
    if p.capability is None or p.capability[0] != 10:
        return f"needs an sm_100-family GPU (capability 10.x), got {p.capability}"
    if p.weight_only:
        return "W4A16 (no input_scale) is not the sm100 W4A4 kernel"
    if p.k % 32:
        return f"K={p.k} is not a multiple of 32"
    ob = torch.empty((), dtype=p.out_dtype).element_size()
    n_out = p.n // 2 if p.activation == "silu_mul" else p.n
    if (n_out * ob) % 16:
        return f"output width {n_out}: output rows must be a multiple of 16 bytes"
    if p.bias and p.x_dtype != p.out_dtype:
        return "bias/residual must be in the output dtype"
    # the same predicate the policy uses (sm_count only ranks candidates; 148 = B200)
    if _policy_config(p.m, p.n, p.k, p.out_dtype, p.activation, arch_of(p.capability), 148) is None:
        return f"the sm100 candidate policy has no implementable config (M={p.m} N={p.n} K={p.k} {p.activation})"
    return None


_OUT_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@functools.lru_cache(maxsize=4096)
def _policy_config(m, n, k, out_dtype, activation, arch, sm_count) -> Optional[Sm100Nvfp4GemmConfig]:
    """The policy's first candidate (deterministic; nvMatmulHeuristics off on the eager path)."""
    from ..heuristics import candidates
    from ..heuristics.problem import GemmProblem, Target

    prob = GemmProblem(n=n, k=k, m=m, out_dtype=_OUT_NAMES[out_dtype], epilogue=activation,
                       target=Target(arch=arch, sm_count=sm_count))
    cands = candidates(prob, use_nvmmh=False)
    return cands[0].config if cands else None


def _pick_config(x, weight, spec: EpilogueSpec, sm_count: int, capability) -> Sm100Nvfp4GemmConfig:
    m = x.numel() // x.shape[-1]
    cfg = _policy_config(m, weight.shape[0], weight.shape[1] * 2, spec.out_dtype, spec.activation,
                         arch_of(capability), sm_count)
    if cfg is None:
        raise RuntimeError(f"nvgemm_cutedsl sm100: no implementable config for M={m} N={weight.shape[0]}")
    return cfg


def run_sm100(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype,
              config=None):
    """Eager implementation for the ``cutedsl_sm100`` backend (CUDA, sm_100 family only).

    ``config`` (a config or its name; autotuned code passes one) overrides the policy's first pick.
    """
    from ..ops import check_linear_args
    from .cache import default_cache

    spec = check_linear_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
    dev = x.device
    props = torch.cuda.get_device_properties(dev)
    cap = (props.major, props.minor)
    if config is None:
        config = _pick_config(x, weight, spec, props.multi_processor_count, cap)
    elif isinstance(config, str):
        from ..templates.sm100_config import config_from_name

        config = config_from_name(config)
    stream = torch.cuda.current_stream(dev)
    args = prepare_sm100_args(x, weight, weight_scale, weight_scale_2, input_scale, bias, residual, activation,
                              out_dtype, config, stream_id=stream.cuda_stream)
    cspec = compile_spec_for(config, spec, arch_of(cap), props.multi_processor_count)
    kernel = default_cache().get(cspec)
    launch_sm100(args, kernel, stream)
    return args.out.reshape(*x.shape[:-1], args.out.shape[-1])


BACKEND = Backend(name="cutedsl_sm100", priority=100, supports=supports, run=run_sm100)
register_backend(BACKEND)
