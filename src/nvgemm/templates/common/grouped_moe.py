"""What the grouped W4A4 MoE launchers (sm100, sm120) check and derive before their work list."""

from __future__ import annotations

import torch

from nvgemm.core.status import Status


def w4a4_moe_prelude(family: str, x: torch.Tensor, topk_weights: torch.Tensor, activation: str, w13_input_scale,
                     w2_input_scale, config13, config2, router_weight_on_input: bool, out_dtype):
    """The grouped kernels' call contract, checked with errors naming ``family``: ``silu_mul`` (the fused requant),
    both input scales (W4A4), one work list for both GEMMs (equal ``tile_n``). Returns ``(xin, weights,
    out_dtype)``: with ``router_weight_on_input`` (top-1) the input is ``round(x * w)`` and the weights become 1
    (contract step 1)."""
    if activation != "silu_mul":
        raise ValueError(f"nvgemm {family} moe: the grouped kernel implements silu_mul (fused requant), not "
                         f"{activation!r}")
    if w13_input_scale is None or w2_input_scale is None:
        raise ValueError(f"nvgemm {family} moe: the grouped kernel is W4A4 (both input scales are needed)")
    if config13.tile_n != config2.tile_n:
        raise ValueError(f"nvgemm {family} moe: GEMM1 and GEMM2 share one work list: tile_n {config13.tile_n} != "
                         f"{config2.tile_n}")
    if router_weight_on_input:
        return (x.float() * topk_weights[:, :1]).to(x.dtype), torch.ones_like(topk_weights), out_dtype or x.dtype
    return x, topk_weights, out_dtype or x.dtype


def w4a4_moe_problem_reason(p, row_bytes: str) -> str | None:
    """Why a grouped W4A4 kernel cannot serve the MoE problem ``p`` (device and arch aside), or ``None``: W4A4
    (both input scales), ``silu_mul``, bf16 / fp16 activations, H and I multiples of 32 (``row_bytes`` names what
    the family's 16-byte rows of packed FP4 feed), at least one token."""
    if p.weight_only:
        return "W4A16 MoE is not this kernel (W4A4 only: both input scales are needed)"
    if p.activation != "silu_mul":
        return f"activation {p.activation!r}: the grouped kernel implements silu_mul (fused NVFP4 requant) only"
    return grouped_moe_shape_reason(p, row_bytes)


def grouped_moe_shape_reason(p, row_bytes: str = "rows") -> str | None:
    """The activation dtype and shape rules every grouped MoE kernel shares, or ``None``: bf16 / fp16 activations,
    H and I multiples of 32 (``row_bytes`` names what the family's 16-byte rows of packed FP4 feed), at least one
    token."""
    if p.x_dtype not in (torch.bfloat16, torch.float16):
        return f"x must be bfloat16 or float16, got {p.x_dtype}"
    if p.hidden % 32 or p.intermediate % 32:
        return f"H={p.hidden} and I={p.intermediate} must be multiples of 32 (16-byte {row_bytes} of packed FP4)"
    if p.m < 1:
        return "empty input (M = 0)"
    return None


def w4a4_moe_spec_status(family: str, spec, archs) -> Status:
    """A grouped W4A4 MoE kernel's rules that do not depend on the family's tiles: its arch, K-major NVFP4 x NVFP4
    operands, a per-expert (scalar) or per-row (vector) alpha, no bias / residual (the finalize adds them)."""
    if spec.arch not in archs:
        return Status.fail(f"the {family} grouped MoE kernel targets {archs}, not {spec.arch}")
    if spec.a_format != "nvfp4" or spec.b_format != "nvfp4" or spec.a_major != "k" or spec.b_major != "k":
        return Status.fail(f"the {family} grouped MoE kernel needs K-major nvfp4 x nvfp4 operands")
    epi = spec.epilogue
    if epi.alpha not in ("scalar", "vector"):
        return Status.fail("the grouped kernel needs a per-expert alpha (scalar) or per-row alpha (vector)")
    if epi.bias or epi.residual:
        return Status.fail("the grouped kernel has no bias / residual (the finalize adds shared_out and residual)")
    return Status.success()


def problem_call_args(p) -> dict:
    """The call facts of a ``MoeProblem`` that pick a grouped family's kernel variants (``call_kernels`` of its
    launcher): the GEMM1 alpha kind, and ``shared_out`` / ``residual`` as meta tensors of the activations'
    dtype and shape (callers pass them contiguous in that dtype) or None."""

    def meta(present: bool):
        return torch.empty((p.m, p.hidden), dtype=p.x_dtype, device="meta") if present else None

    return {"alpha13": "vector" if p.alpha13 == "row" else "scalar", "shared_out": meta(p.shared_out),
            "residual": meta(p.residual)}
