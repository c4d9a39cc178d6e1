"""Operands and runs for checking kernels on the emulator against the emulated backend.

* :func:`exact_operands`: data whose every product and fp32 partial sum is exact, so the kernel's
  summation order, tensor-core accumulation and fma contraction cannot change a bit: E2M1 weight
  codes drawn uniformly, block scales ``2**[-2, 2]`` (e4m3), ``weight_scale_2`` and per-column alpha
  powers of two, activations ``k / 8`` with ``|k| <= 16``, bias and residual on a ``2**-3`` grid. With
  K <= 4096 the largest sum is below ``2**18`` in units of ``2**-6`` (< 2**24: exact in fp32); the
  only rounding left is the final store, which both sides round identically (RNE).
* :func:`random_operands`: gaussian data for the tolerance comparisons.
* :func:`run_sm90`: one ``nvfp4_linear`` call through the real sm90 AOT artifact on the emulator,
  with the production host path (:func:`~nvgemm.templates.sm90_w4a16.launch.prepare_sm90_args`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nvgemm.core.formats import pack_e2m1, quantize_weight, to_blocked
from nvgemm.emulator.ptx.machine import ARCH_DEVICES, DEVICES
from nvgemm.emulator.runner import prepare
from nvgemm.ops.linear import nvfp4_linear_emulated
from nvgemm.templates.sm90_w4a16.backend import compile_spec_for
from nvgemm.templates.sm90_w4a16.launch import Sm90Workspace, prepare_sm90_args
from nvgemm.templates.sm90_w4a16.operand import kind_of, prepare_sm90_weight

#: ||emulator - emulated|| / ||emulated|| allowed on random data: both use the same quantized
#: operands, so they differ by fp32 summation order and one output rounding (<= 2**-8 relative per
#: bf16 element); ``silu_mul``'s ``ex2.approx`` is computed in float64 here, exact on hardware only
#: to ~2 ulp, well inside. A wrong kernel is off by O(1).
RANDOM_RTOL = 2.0**-7


@dataclass
class Operands:
    x: torch.Tensor
    weight: torch.Tensor
    weight_scale: torch.Tensor
    weight_scale_2: torch.Tensor
    input_scale: Any
    bias: Any
    residual: Any
    activation: str
    out_dtype: torch.dtype

    def args(self) -> tuple:
        return (self.x, self.weight, self.weight_scale, self.weight_scale_2, self.input_scale, self.bias,
                self.residual, self.activation, self.out_dtype)


def exact_operands(m: int, n: int, k: int, *, x_dtype=torch.bfloat16, alpha: str = "scalar", bias: bool = False,
                   residual: bool = False, activation: str = "none", out_dtype=None, seed: int = 0) -> Operands:
    """Operands whose products and sums are exact in fp32 (see the module docstring)."""
    if k > 4096:
        raise ValueError("exact operands are exact only up to K = 4096")
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    weight = pack_e2m1(codes)
    sexp = torch.randint(-2, 3, (n, k // 16), generator=g).float()
    scale = torch.pow(2.0, sexp).to(torch.float8_e4m3fn)
    ws2 = torch.tensor(2.0 ** int(torch.randint(-2, 1, (1,), generator=g)))
    if alpha == "vector":
        ws2 = ws2 * torch.pow(2.0, torch.randint(-1, 2, (n,), generator=g).float())
    x = (torch.randint(-16, 17, (m, k), generator=g).float() / 8).to(x_dtype)
    n_out = n // 2 if activation == "silu_mul" else n
    out_dtype = out_dtype or x_dtype
    b = (torch.randint(-64, 65, (n,), generator=g).float() / 8) if bias else None
    r = (torch.randint(-64, 65, (m, n_out), generator=g).float() / 8).to(out_dtype) if residual else None
    return Operands(x, weight, to_blocked(scale), ws2, None, b, r, activation, out_dtype)


def random_operands(m: int, n: int, k: int, *, x_dtype=torch.bfloat16, alpha: str = "scalar", bias: bool = False,
                    residual: bool = False, activation: str = "none", out_dtype=None, seed: int = 0) -> Operands:
    g = torch.Generator().manual_seed(seed)
    q = quantize_weight(torch.randn(n, k, generator=g))
    ws2 = q.global_scale.reshape(())
    if alpha == "vector":
        ws2 = ws2 * torch.linspace(0.5, 2.0, n)
    x = torch.randn(m, k, generator=g).to(x_dtype)
    n_out = n // 2 if activation == "silu_mul" else n
    out_dtype = out_dtype or x_dtype
    b = torch.randn(n, generator=g) if bias else None
    r = torch.randn(m, n_out, generator=g).to(out_dtype) if residual else None
    return Operands(x, q.packed, to_blocked(q.scale), ws2, None, b, r, activation, out_dtype)


def reference(ops: Operands) -> torch.Tensor:
    """The emulated backend (``nvgemm.ops.linear.nvfp4_linear_emulated``)."""
    return nvfp4_linear_emulated(*ops.args())


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


@dataclass
class Sm90Run:
    out: torch.Tensor
    launch: Any  # nvgemm.emulator.ptx.machine.Launch
    args: Any  # Sm90Args
    kernel: Any  # EmuKernel


def run_sm90(config, ops: Operands, *, order="forward", workspace=None, device: str | None = None,
             kernel=None, arch: str = "sm_90a") -> Sm90Run:
    """``ops`` through the kernel ``config`` of the sm90_w4a16 folder, its real AOT artifact for ``arch``
    (the ``mma`` kernel also targets sm_80 / sm_86 / sm_89 / sm_120a / sm_121a), on the emulator's
    device profile ``device`` (default: the arch's, ``ARCH_DEVICES``)."""
    if device is None:
        device = ARCH_DEVICES[arch]
    prepared = prepare_sm90_weight(ops.weight, ops.weight_scale, ops.weight_scale_2, kind_of(ops.x.dtype))
    ws = workspace if workspace is not None else Sm90Workspace(torch.device("cpu"))
    args = prepare_sm90_args(ops.x, prepared, ops.input_scale, ops.bias, ops.residual, ops.activation,
                             ops.out_dtype, config, workspace=ws)
    sms = DEVICES[device].sm_count
    k = kernel or prepare(compile_spec_for(config, args.spec, ops.x.dtype, sms, arch), device=device)
    launch = k.launch(*args.abi_values(), 0, order=order)
    return Sm90Run(args.out.reshape(*ops.x.shape[:-1], args.out.shape[-1]), launch, args, k)


__all__ = ["Operands", "RANDOM_RTOL", "Sm90Run", "exact_operands", "random_operands", "reference", "rel_err",
           "run_sm90"]
