"""``nvgemm::`` ops for the fused NVFP4 quantizers (torch-only module; triton loads lazily).

* ``torch.ops.nvgemm.rmsnorm_quantize_nvfp4(x, weight, input_scale, eps=1e-6, swizzle=True)``
  -> (packed uint8 [M, K/2], scales e4m3)
* ``torch.ops.nvgemm.add_rmsnorm_quantize_nvfp4(x, residual, weight, input_scale, eps=1e-6,
  swizzle=True)`` -> (packed, scales, new residual = x + residual)
* ``torch.ops.nvgemm.silu_mul_quantize_nvfp4(x, input_scale, swizzle=True)`` with x = [gate | up]
  [M, 2I] -> (packed uint8 [M, I/2], scales)
* ``torch.ops.nvgemm.rope_kv_write(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads,
  num_kv_heads)`` -> roped q [T, num_heads, D]; writes roped k and v into the static caches [1, Hkv, S, D] at
  ``positions`` (the one op here that mutates: ``k_cache`` and ``v_cache``). See
  :mod:`nvgemm.templates.triton.rope`.

Scales are the 1-D 128x4 swizzled layout when ``swizzle`` (what ``nvfp4_linear``'s W4A4 kernels
read), else linear [M, K/16]. Eager: the Triton kernel on CUDA (sm_80+, Triton importable), on CPU the PTX
emulator's stand-in of it when the emulator is enabled (:mod:`nvgemm.templates.common.triton_stand_in`), the
pure-torch reference (:mod:`nvgemm.templates.triton.reference`) otherwise. Fake impls allocate the
same shapes. The quantizer ops mutate nothing. ``input_scale`` must be finite and > 0 (checked
when it is a host tensor, as for ``quantize_nvfp4``). ``rope_kv_write`` checks its position values (in range
of the tables and the cache, distinct) except while a CUDA graph is captured (the check reads them: a host
sync on CUDA; the warm-up call runs it).
"""

from __future__ import annotations

import functools
import logging

import torch

from nvgemm.core.formats import blocked_numel, check_input_scale_value
from nvgemm.templates.common.triton_stand_in import stand_in

from nvgemm.templates.triton.reference import (
    add_rmsnorm_quantize_ref,
    check_fused_args,
    check_rope_args,
    check_rope_positions,
    quantize_ref,
    rmsnorm_quantize_ref,
    rope_kv_write_ref,
    silu_mul_quantize_ref,
)

log = logging.getLogger("nvgemm_cutedsl")

__all__ = ["rmsnorm_quantize_nvfp4", "add_rmsnorm_quantize_nvfp4", "silu_mul_quantize_nvfp4", "quantize_nvfp4_cuda",
           "rope_kv_write", "triton_unusable"]


@functools.lru_cache(maxsize=None)
def _triton_import_error() -> str | None:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means "no Triton kernels"
        log.info("nvgemm_cutedsl: triton is not usable: %r", e)
        return f"triton cannot be imported ({type(e).__name__}: {e})"
    return None


def triton_unusable(device: torch.device) -> str | None:
    """Why the Triton kernels cannot run on ``device`` (None if they can): CUDA sm_80+, Triton importable."""
    if device.type != "cuda":
        return f"needs a CUDA device, got {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 0):
        return f"needs sm_80 or newer, got sm_{cap[0]}{cap[1]}"
    return _triton_import_error()


def quantize_nvfp4_cuda(x: torch.Tensor, input_scale: torch.Tensor, swizzle: bool = True):
    """The activation quantizer of a CUDA tensor (``nvgemm::quantize_nvfp4``'s CUDA path, and the one the
    W4A4 kernel backends are given): the Triton kernel where it can run (on CPU tensors: the PTX emulator's
    stand-in, when enabled), else the torch reference (same bytes). Arguments as the op's, already checked."""
    if triton_unusable(x.device) is None:
        # lazy: triton import cost (the Triton kernel module is loaded on first use)
        from nvgemm.templates.triton.quantize import quantize_nvfp4_triton

        return quantize_nvfp4_triton(x, input_scale, swizzle)
    kernel = stand_in("nvgemm.templates.triton.quantize", "quantize_nvfp4_kernel", x.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in)
        from nvgemm.templates.triton.quantize import quantize_nvfp4_triton  # lazy: triton import cost

        return quantize_nvfp4_triton(x, input_scale, swizzle, kernel=kernel)
    return quantize_ref(x, input_scale, swizzle)


def bind_quantize_nvfp4_cuda(m: int, k: int, dtype: torch.dtype, device: torch.device, input_scale: torch.Tensor):
    """The activation quantizer a bound W4A4 launcher calls per step for x [m, k] of ``dtype`` on ``device`` and the
    bound ``input_scale`` (fp32 scalar on ``device``): the Triton kernel's bound quantizer where it can run
    (:func:`nvgemm.templates.triton.quantize.bind_quantize_nvfp4`: checks, block sizes, grid and the pre-bound
    launch decided once), else :func:`quantize_nvfp4_cuda`. Same signature and bytes as
    :func:`quantize_nvfp4_cuda`."""
    if triton_unusable(device) is None:
        # lazy: triton import cost (the Triton kernel module is loaded on first use)
        from nvgemm.templates.triton.quantize import bind_quantize_nvfp4

        return bind_quantize_nvfp4(m, k, dtype, device, input_scale)
    return quantize_nvfp4_cuda


def _scale_like(x: torch.Tensor, m: int, k: int, swizzle: bool) -> torch.Tensor:
    if swizzle:
        return x.new_empty((blocked_numel(m, k // 16),), dtype=torch.float8_e4m3fn)
    return x.new_empty((m, k // 16), dtype=torch.float8_e4m3fn)


@torch.library.custom_op("nvgemm::rmsnorm_quantize_nvfp4", mutates_args=())
def rmsnorm_quantize_nvfp4(x: torch.Tensor, weight: torch.Tensor, input_scale: torch.Tensor, eps: float = 1e-6,
                           swizzle: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4(weight * RMSNorm(x)) in one launch; bit-exact with the unfused chain."""
    check_fused_args("rmsnorm_quantize_nvfp4", x, input_scale, weight=weight)
    check_input_scale_value(input_scale, "nvgemm.rmsnorm_quantize_nvfp4")
    if triton_unusable(x.device) is None:
        # lazy: triton import cost
        from nvgemm.templates.triton.fused import rmsnorm_quantize_nvfp4_triton

        return rmsnorm_quantize_nvfp4_triton(x, weight, input_scale, eps, swizzle)
    kernel = stand_in("nvgemm.templates.triton.fused", "rmsnorm_quantize_kernel", x.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in)
        from nvgemm.templates.triton.fused import rmsnorm_quantize_nvfp4_triton  # lazy: triton import cost

        return rmsnorm_quantize_nvfp4_triton(x, weight, input_scale, eps, swizzle, kernel=kernel)
    return rmsnorm_quantize_ref(x, weight, input_scale, eps, swizzle)


@rmsnorm_quantize_nvfp4.register_fake
def _(x, weight, input_scale, eps=1e-6, swizzle=True):
    check_fused_args("rmsnorm_quantize_nvfp4", x, input_scale, weight=weight)
    m, k = x.shape
    return x.new_empty((m, k // 2), dtype=torch.uint8), _scale_like(x, m, k, swizzle)


@torch.library.custom_op("nvgemm::add_rmsnorm_quantize_nvfp4", mutates_args=())
def add_rmsnorm_quantize_nvfp4(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                               input_scale: torch.Tensor, eps: float = 1e-6,
                               swizzle: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """r = x + residual; NVFP4(weight * RMSNorm(r)). Returns (packed, scales, r)."""
    check_fused_args("add_rmsnorm_quantize_nvfp4", x, input_scale, weight=weight, residual=residual)
    check_input_scale_value(input_scale, "nvgemm.add_rmsnorm_quantize_nvfp4")
    if triton_unusable(x.device) is None:
        # lazy: triton import cost
        from nvgemm.templates.triton.fused import add_rmsnorm_quantize_nvfp4_triton

        return add_rmsnorm_quantize_nvfp4_triton(x, residual, weight, input_scale, eps, swizzle)
    kernel = stand_in("nvgemm.templates.triton.fused", "rmsnorm_quantize_kernel", x.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in)
        from nvgemm.templates.triton.fused import add_rmsnorm_quantize_nvfp4_triton  # lazy: triton import cost

        return add_rmsnorm_quantize_nvfp4_triton(x, residual, weight, input_scale, eps, swizzle, kernel=kernel)
    return add_rmsnorm_quantize_ref(x, residual, weight, input_scale, eps, swizzle)


@add_rmsnorm_quantize_nvfp4.register_fake
def _(x, residual, weight, input_scale, eps=1e-6, swizzle=True):
    check_fused_args("add_rmsnorm_quantize_nvfp4", x, input_scale, weight=weight, residual=residual)
    m, k = x.shape
    return x.new_empty((m, k // 2), dtype=torch.uint8), _scale_like(x, m, k, swizzle), torch.empty_like(x)


@torch.library.custom_op("nvgemm::silu_mul_quantize_nvfp4", mutates_args=())
def silu_mul_quantize_nvfp4(x: torch.Tensor, input_scale: torch.Tensor,
                            swizzle: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4(silu(x[:, :I]) * x[:, I:]) in one launch; bit-exact with the unfused chain."""
    check_fused_args("silu_mul_quantize_nvfp4", x, input_scale, gated=True)
    check_input_scale_value(input_scale, "nvgemm.silu_mul_quantize_nvfp4")
    if triton_unusable(x.device) is None:
        # lazy: triton import cost
        from nvgemm.templates.triton.fused import silu_mul_quantize_nvfp4_triton

        return silu_mul_quantize_nvfp4_triton(x, input_scale, swizzle)
    kernel = stand_in("nvgemm.templates.triton.fused", "silu_mul_quantize_kernel", x.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in)
        from nvgemm.templates.triton.fused import silu_mul_quantize_nvfp4_triton  # lazy: triton import cost

        return silu_mul_quantize_nvfp4_triton(x, input_scale, swizzle, kernel=kernel)
    return silu_mul_quantize_ref(x, input_scale, swizzle)


@silu_mul_quantize_nvfp4.register_fake
def _(x, input_scale, swizzle=True):
    check_fused_args("silu_mul_quantize_nvfp4", x, input_scale, gated=True)
    m, i = x.shape[0], x.shape[1] // 2
    return x.new_empty((m, i // 2), dtype=torch.uint8), _scale_like(x, m, i, swizzle)


@torch.library.custom_op("nvgemm::rope_kv_write", mutates_args=("k_cache", "v_cache"))
def rope_kv_write(qkv: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, positions: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """RoPE of q and k (cos / sin rows at ``positions``) and the KV-cache write of k and v, in one launch;
    returns q [T, num_heads, D]. Bit-exact with :func:`nvgemm.templates.triton.reference.rope_kv_write_ref`."""
    check_rope_args(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads)
    if not (positions.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        check_rope_positions(positions, cos_cache, k_cache)
    if triton_unusable(qkv.device) is None:
        # lazy: triton import cost
        from nvgemm.templates.triton.rope import rope_kv_write_triton

        return rope_kv_write_triton(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads)
    kernel = stand_in("nvgemm.templates.triton.rope", "rope_kv_write_kernel", qkv.device)
    if kernel is not None:  # the PTX emulator's stand-in (opt-in)
        from nvgemm.templates.triton.rope import rope_kv_write_triton  # lazy: triton import cost

        return rope_kv_write_triton(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads,
                                    num_kv_heads, kernel=kernel)
    return rope_kv_write_ref(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads)


@rope_kv_write.register_fake
def _(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads):
    d = check_rope_args(qkv, cos_cache, sin_cache, positions, k_cache, v_cache, num_heads, num_kv_heads)
    return qkv.new_empty((qkv.shape[0], num_heads, d))
