"""Run-time backends behind the fused gated-MLP ops ``nvgemm::nvfp4_linear_requant`` (gate_up GEMM whose
epilogue emits the next layer's NVFP4 input) and ``nvgemm::nvfp4_linear_prequant`` (W4A4 linear on an
already-quantized activation): the same mechanism as ``nvfp4_linear``'s (:mod:`nvgemm.dispatch.registry`).

A backend is a :class:`~nvgemm.core.backend.Backend` registered in the one registry
(:func:`~nvgemm.dispatch.registry.register_backend`) for one of the two op kinds (:data:`REQUANT`,
:data:`PREQUANT`) with a ``supports(LinearProblem)`` predicate and a ``run`` taking the op's arguments in
schema order. The op runs the highest-priority backend that supports the problem;
``emulated`` (registered by :mod:`nvgemm.ops.fused`) supports everything and is last. Before a kernel
backend serves a problem for the first time it runs it once and is compared with the emulated op
(``NVGEMM_SELFCHECK=0`` turns this off):

* requant: **bytes**, no tolerance (the op's contract is bit-exactness with ``quantize_nvfp4`` of the
  rounded SwiGLU output). The check's data keep every fp32 accumulator exact in any summation order and
  every gate above 18 (where ``silu(g) == g`` in fp32 whichever way the exponential is computed), see
  :func:`requant_selfcheck_inputs`, so a correct kernel agrees byte for byte;
* prequant: element-wise within the fp32 summation-order bound of the dense check.

Override: ``NVGEMM_FUSED_BACKEND=<name>`` forces a fused backend (an error if it cannot run the problem);
otherwise ``NVGEMM_BACKEND=<name>`` forces it too when it names a registered fused backend (``emulated``,
``emu_sm100``, ``emu_sm120``, ``cutedsl_sm100``, ``cutedsl_sm120``); an ``NVGEMM_BACKEND`` naming another
(dense-only) backend leaves the fused ops on their non-kernel paths (``unfused`` / ``emulated``), so a forced
dense backend is what runs.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import torch

from nvgemm import settings
from nvgemm.core.backend import PREQUANT, REQUANT, Backend, LinearProblem, warn_once
from nvgemm.core.validation import alpha_of
from nvgemm.dispatch.registry import (
    _OUT_ULP,
    _selfcheck_inputs,
    accumulation_bound,
    backends,
    checked_verdict,
    choose_backend,
    registered,
)
from nvgemm.core.formats import NVFP4, dequantize, from_blocked, pack_e2m1, quantize_activation, to_blocked

FUSED_KINDS = (REQUANT, PREQUANT)
#: backends that run no kernel of their own (the fallbacks a forced dense-only backend keeps)
NON_KERNEL = ("unfused", "emulated")

_CHECKED: dict[tuple, str | None] = {}
_LAST = threading.local()
log = logging.getLogger("nvgemm_cutedsl")


def _fused(kind: str) -> str:
    if kind not in FUSED_KINDS:
        raise ValueError(f"nvgemm fused backends: kind must be {REQUANT!r} or {PREQUANT!r}, got {kind!r}")
    return kind


def remember_fused(kind: str, backend: Backend) -> None:
    """Record ``backend`` as the last one the ``kind`` op ran (a call served from its stored plan)."""
    setattr(_LAST, kind, backend.name)


def last_fused_selected(kind: str) -> str | None:
    """Name of the backend the most recent eager call of the ``kind`` op ran on in this thread."""
    return getattr(_LAST, kind, None)


# ---------------------------------------------------------------------------- first-use check data

_E4M3_ONE, _E4M3_HALF, _E4M3_TWO = 0x38, 0x30, 0x40


def _codes(rows: int, k: int, g: torch.Generator, small: bool) -> torch.Tensor:
    """E2M1 codes: ``small`` = magnitude <= 1 (codes 0..2) with element 0 of every 16-block +6 (code 7),
    else any code; random signs."""
    if small:
        c = torch.randint(0, 3, (rows, k), generator=g, dtype=torch.uint8)
        c |= torch.randint(0, 2, (rows, k), generator=g, dtype=torch.uint8) << 3
        c[:, 0::16] = 7
        return c
    return torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)


def requant_selfcheck_inputs(p: LinearProblem, device: torch.device) -> tuple:
    """Requant op arguments (schema order) for problem ``p`` (``n`` = 2I, gate rows first) on which a
    correct kernel agrees with the emulated op byte for byte:

    * x is NVFP4-exact: per 16-block element 0 is +6, the others are 0 / +-0.5 / +-1, block scale 1
      (input_scale 1): its quantization returns exactly these codes;
    * gate rows of the weight look alike (element 0 +6, others magnitude <= 1, block scale 1), so every
      block adds between 21 and 51 to a gate; up rows hold any code with block scales 0.5 / 1 / 2;
    * alpha = weight_scale_2 is a power of two with every gate in [19, 98] (above 17.4 ``silu(g) == g``
      in fp32, however the exponential is computed), up rows at alpha or alpha/2 for a vector alpha; bias
      values are multiples of 0.5 in [-1, 1]. Every product and partial sum is a multiple of 2^-3 below
      2^21 (times alpha), hence exact in fp32 in any order (K < 2^17), and |h| <= 98 * 481 fits fp16;
    * ``out_input_scale`` puts the 75th percentile of the block amaxes of h at the top of the NVFP4 range:
      a quarter of the blocks saturate the e4m3 scale at 448, the others do not.
    """
    g = torch.Generator(device="cpu").manual_seed(2515)
    i, k, m = p.n // 2, p.k, p.m
    kb = k // 16
    x = _codes(m, k, g, small=True)
    w = torch.cat([_codes(i, k, g, small=True), _codes(i, k, g, small=False)])
    w_sf = torch.full((2 * i, kb), _E4M3_ONE, dtype=torch.uint8)
    choice = torch.tensor([_E4M3_HALF, _E4M3_ONE, _E4M3_TWO], dtype=torch.uint8)
    w_sf[i:] = choice[torch.randint(0, 3, (i, kb), generator=g)]
    x_val = dequantize(pack_e2m1(x), torch.full((m, kb), _E4M3_ONE, dtype=torch.uint8).view(torch.float8_e4m3fn))
    e = 0  # 2^e in [20, 40) / (21 kb): every gate in [19, 98] after a bias of -1 .. 1
    while 21 * kb * 2.0**e >= 40:
        e -= 1
    while 21 * kb * 2.0**e < 20:
        e += 1
    alpha = 2.0**e
    ws2 = torch.tensor(alpha)
    if p.alpha == "vector":
        ws2 = torch.full((2 * i,), alpha)
        ws2[i::2] = alpha / 2
    ins = torch.tensor(1.0)
    bias = None
    if p.bias:
        bias = torch.randint(-2, 3, (2 * i,), generator=g).float() * 0.5
    # the gated output (exact up to its one rounding), for out_input_scale
    # on the check's device (a GPU's fp32 matmul; exact either way): gate_up layers are large
    acc = x_val.to(device) @ dequantize(pack_e2m1(w).to(device), w_sf.view(torch.float8_e4m3fn).to(device)).t()
    acc = (acc * ws2.to(device)).cpu()
    if bias is not None:
        acc = acc + bias
    h = (acc[:, :i] * acc[:, i:]).to(p.out_dtype).float()
    block_amax = h.abs().reshape(m, i // 16, 16).amax(-1).reshape(-1)
    gs = (block_amax.quantile(0.75) / (6.0 * 448.0)).clamp_min(2.0**-30).reshape(())
    xd = p.x_dtype
    w_blocked = to_blocked(w_sf.view(torch.float8_e4m3fn))
    return (x_val.to(device=device, dtype=xd), pack_e2m1(w).to(device), w_blocked.to(device), ws2.float().to(device),
            ins.to(device), None if bias is None else bias.to(device=device, dtype=xd), gs.float().to(device),
            p.out_dtype)


def _flat_bytes(run):
    """A requant ``run`` whose (packed, scales) become one uint8 vector (bytes compared exactly)."""
    def flat(*args):
        packed, scales = run(*args)
        return torch.cat([packed.reshape(-1), scales.view(torch.uint8).reshape(-1)])

    return flat


def prequant_selfcheck_inputs(p: LinearProblem, device: torch.device) -> tuple:
    """Prequant op arguments for ``p``: the dense check's adversarial data (every E2M1 code, zero and
    subnormal-scale blocks, outliers) with the activation quantized by the emulated quantizer."""
    x, w, ws, ws2, ins, bias, res, _act, out_dtype = _selfcheck_inputs(dataclasses.replace(p, weight_only=False),
                                                                        device)
    packed, sx = quantize_activation(x, ins)
    return packed, to_blocked(sx).reshape(-1), w, ws, ws2, ins, bias, res, out_dtype


def prequant_selfcheck_bound(args, want: torch.Tensor) -> torch.Tensor:
    """Element-wise allowance: the fp32 summation-order bound of the dense check (same operands)."""
    packed, scales, weight, weight_scale, ws2, ins, _b, _r, out_dtype = args
    m, k = packed.shape[0], packed.shape[1] * 2
    a = dequantize(packed, from_blocked(scales.view(torch.float8_e4m3fn), m, k // NVFP4.block_size))
    _, err = accumulation_bound(a, weight, weight_scale, alpha_of(ws2, ins))
    return err + 2 * _OUT_ULP[out_dtype] * want.abs() + 2.0**-20


def _selfcheck(kind: str):
    def check(backend: Backend, problem: LinearProblem) -> str | None:
        ref = registered(kind, "emulated")
        if kind == REQUANT:
            return checked_verdict(_CHECKED, dataclasses.replace(backend, name=f"{backend.name}[requant]",
                                                                 run=_flat_bytes(backend.run)),
                                   problem, requant_selfcheck_inputs, _flat_bytes(ref.run),
                                   lambda args, want: torch.zeros_like(want), "fused requant backend")
        return checked_verdict(_CHECKED, dataclasses.replace(backend, name=f"{backend.name}[prequant]"), problem,
                               prequant_selfcheck_inputs, ref.run, prequant_selfcheck_bound, "fused prequant backend")

    return check


def select_fused_backend(kind: str, p: LinearProblem, check: bool = True, no_kernel: str | None = None) -> Backend:
    """The backend the ``kind`` op runs for ``p`` (deterministic; see the module docstring). The first
    non-kernel fallback serving a CUDA problem warns once, naming why each kernel backend was passed over.
    ``no_kernel``: a reason, not in ``p``, why no kernel backend can run this call (e.g. a bias dtype)."""
    all_b = backends(_fused(kind))
    names = {b.name for b in all_b}
    forced, var = settings.NVGEMM_FUSED_BACKEND, "NVGEMM_FUSED_BACKEND"
    dense_forced = settings.NVGEMM_BACKEND
    if not forced and dense_forced:
        if dense_forced in names:
            forced, var = dense_forced, "NVGEMM_BACKEND"
        else:  # a dense-only backend was asked for: no fused kernel runs instead of it
            all_b = [b for b in all_b if b.name in NON_KERNEL]
    reasons: list[str] = []
    if no_kernel is not None:
        if forced and forced not in NON_KERNEL:
            raise RuntimeError(f"{var}={forced} cannot run this nvgemm::nvfp4_linear_{kind} call: {no_kernel}")
        reasons.append(f"kernels: {no_kernel}")
        all_b = [b for b in all_b if b.name in NON_KERNEL]
    for b in all_b:
        if b.name in NON_KERNEL:
            break
        why = b.supports(p)
        reasons.append(f"{b.name}: {why if why is not None else 'first-use check failed'}")

    b = choose_backend(all_b, p, forced, var, _selfcheck(kind) if check else None, f"fused {kind} backend",
                       lambda _reasons: None)  # the warning below names the fused fallback taken
    if b.name in NON_KERNEL and p.device_type == "cuda" and not forced:
        what = ("the gate_up GEMM with silu_mul, then quantize_nvfp4 (two kernels, one activation round trip)"
                if b.name == "unfused" else "the emulated op (dequantize + fp32 matmul), which is correct but slow")
        msg = (f"nvgemm_cutedsl: no fused {kind} kernel for this problem on "
               f"sm_{''.join(map(str, p.capability or ()))} ({'; '.join(reasons) or 'none registered'}); "
               f"nvgemm::nvfp4_linear_{kind} runs {what}")
        if p.capability is not None and p.capability[0] == 10 and no_kernel is None:
            # the hardware has the kernels; this problem is outside them (e.g. prefill M > 128): expected
            log.info(msg)
        else:
            warn_once(f"fused-{kind}-{b.name}-{p.capability}", msg)
    setattr(_LAST, kind, b.name)
    return b


def fused_chain_reason(device: torch.device) -> str | None:
    """None if the fused gate_up -> down chain (requant -> prequant) is worth running on ``device``, else
    why the plain chain (``nvfp4_linear`` twice) is run instead: on a CUDA device other than the sm_100 /
    sm_120 families no kernel takes a pre-quantized activation (the prequant op would be emulated), while the
    dense kernels serve the plain chain. CPU runs the fused ops (emulated, or the emulator when forced)."""
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"no fused requant path on {device.type}"
    try:
        cap = torch.cuda.get_device_capability(device)
    except (RuntimeError, AssertionError) as e:  # no CUDA runtime here (a graph planned for another host)
        return f"cannot query {device}: {e}"
    if cap[0] not in (10, 12):
        return (f"the fused requant epilogue is an sm_100-family / sm_120-family kernel; this GPU is "
                f"sm_{cap[0]}{cap[1]}, where the dense kernels run the unfused chain")
    return None
