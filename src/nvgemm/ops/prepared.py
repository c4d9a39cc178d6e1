"""Hopper NVFP4 weights held once, in the sm90 kernels' layout: the op that takes them.

``nvgemm::nvfp4_linear`` takes the checkpoint (ModelOpt) layout and the sm90 backend derives its
own layout from it once (:func:`nvgemm.templates.sm90_w4a16.launch.cached_sm90_weight`), so a Hopper
model holds every weight twice. :func:`nvgemm.nn.linear.NVFP4Linear.prepare_for_sm90` converts a
layer to hold only the prepared layout, served by ``nvgemm::nvfp4_linear_sm90_prepared``:

* the op validates the call as ``nvfp4_linear`` does (:func:`nvgemm.core.validation.check_linear_args` on
  stand-ins with the checkpoint layout's shapes and no memory) and asks the backend registry which
  backend serves the problem (the same selection, self-check and ``NVGEMM_BACKEND`` rules);
* ``cutedsl_sm90`` (and ``cutedsl_mma_w4a16``, the same decode kernel on sm_80 / sm_86 / sm_89 /
  sm_120a / sm_121a) runs the kernel on the prepared weight directly
  (:func:`nvgemm.templates.sm90_w4a16.backend.run_prepared`);
* any other backend (CPU, another GPU, a problem the kernel does not take, activations of the
  other dtype, a residual in another dtype) gets the checkpoint layout rebuilt for that call
  (:func:`nvgemm.templates.sm90_w4a16.operand.to_modelopt`, value-exact) -- correct but slow, warned once.

Policy (both loaders): a layer is held in the sm90 layout when the sm90 kernels will serve it
(:func:`sm90_serve_reason`: ``cutedsl_sm90`` is what the registry selects, first-use check
included, for the token counts the layer will run); ``NVGEMM_SM90_ONE_COPY=0`` (or the loader's
``sm90_one_copy=False``) keeps the checkpoint layout, and the kernels' copy beside it.
"""

from __future__ import annotations

from threading import get_ident
from typing import Iterable, Optional

import torch

from nvgemm import settings
from nvgemm.core.formats import NVFP4, blocked_shape
from nvgemm.core.validation import LinearProblem, call_key, call_meta, check_linear_args, problem_of
from nvgemm.ops.linear import nvfp4_linear
from nvgemm.dispatch.registry import (backends, bind_call, bound_call, call_plan, select_backend, set_selected,
                                      warn_once)
from nvgemm.templates.common.derived import DerivedCache
from nvgemm.templates.sm90_w4a16.config import CHUNK, K_ALIGN, ROW_TILE
from nvgemm.templates.sm90_w4a16.operand import Sm90Weight, kind_of, to_modelopt

#: Token counts whose backend decides whether an ``NVFP4Linear`` is held in the sm90 layout: decode
#: (the mma kernels) and a prefill batch (the wgmma kernels).
DECISION_M = (1, 128)
SM90 = "cutedsl_sm90"
#: The backends that run the kernels of this layout: Hopper's, and the ``mma`` kernel on sm_80 / sm_86 /
#: sm_89 / sm_120a / sm_121a (the same prepared layout)
PREPARED_BACKENDS = (SM90, "cutedsl_mma_w4a16")


def one_copy_wanted(explicit: Optional[bool] = None) -> bool:
    """``explicit`` when given, else ``NVGEMM_SM90_ONE_COPY`` (default 1): ``0`` keeps Hopper layers in the
    checkpoint layout (two copies on the GPU: the checkpoint's and the sm90 kernels' prepared one); ``1``
    holds the layers the sm90 kernels serve once."""
    if explicit is not None:
        return bool(explicit)
    return settings.NVGEMM_SM90_ONE_COPY


def sm90_serve_reason(problems: Iterable[LinearProblem]) -> Optional[str]:
    """None when the registry selects a backend of :data:`PREPARED_BACKENDS` (first-use check included)
    for every problem; otherwise why not. Problems another GPU's backend would take are answered from
    those backends' own ``supports`` first, so no other kernel is checked (compiled) here."""
    problems = list(problems)
    own = {b.name: b for b in backends() if b.name in PREPARED_BACKENDS}
    for p in problems:
        # the mma backend where it takes the device (sm_8x / sm_12x), else Hopper's (whose reasons name the rest)
        mma = own.get(PREPARED_BACKENDS[1])
        b = mma if mma is not None and mma.supports(p) is None else own.get(SM90)
        if b is None:
            return f"the {SM90} backend is not registered"
        why = b.supports(p)
        if why is not None:
            return why
    for p in problems:
        chosen = select_backend(p)
        if chosen.name not in PREPARED_BACKENDS:
            return f"M={p.m} runs on {chosen.name}"
    return None


_STANDINS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _standins(n: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint-layout-shaped weight / scale views of one byte each (shapes for validation only;
    never read)."""
    key = (n, k, str(device))
    hit = _STANDINS.get(key)
    if hit is None:
        one = torch.zeros(1, dtype=torch.uint8, device=device)
        hit = _STANDINS.setdefault(key, (one.expand(n, k // 2),
                                         one.view(torch.float8_e4m3fn).expand(blocked_shape(n, k // NVFP4.block_size))))
    return hit


_SCALES = DerivedCache()


def sm90_weight_of(pweight: torch.Tensor, pscale: torch.Tensor, weight_scale_2: torch.Tensor, n: int, k: int,
                   kind: str) -> Sm90Weight:
    """The :class:`Sm90Weight` view of a prepared layer's tensors (no copy of the weight; a ``weight_scale_2``
    held elsewhere than the weight, or not in fp32, is copied once per layer, not per call)."""
    n_pad, k_pad = -(-n // ROW_TILE) * ROW_TILE, -(-k // K_ALIGN) * K_ALIGN
    dev = pweight.device
    if weight_scale_2.device == dev and weight_scale_2.dtype == torch.float32:
        ws2 = weight_scale_2.reshape(-1)
    else:
        ws2 = _SCALES.get(f"fp32:{dev}", weight_scale_2, (weight_scale_2,),
                          lambda: weight_scale_2.to(device=dev, dtype=torch.float32).reshape(-1).clone(),
                          capturing=lambda: dev.type == "cuda" and torch.cuda.is_current_stream_capturing())
    return Sm90Weight(pweight, pscale, ws2, n, k, n_pad, k_pad, kind)


@torch.library.custom_op("nvgemm::nvfp4_linear_sm90_prepared", mutates_args=())
def nvfp4_linear_sm90_prepared(
    x: torch.Tensor,
    pweight: torch.Tensor,
    pscale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
    activation: str,
    out_dtype: Optional[torch.dtype],
    n: int,
    k: int,
    kind: str,
) -> torch.Tensor:
    """``nvfp4_linear`` of a weight held only in the sm90 layout (see the module docstring)."""
    token = settings.forcing_token()
    bkey = ("sm90_prepared", id(pweight), call_meta(x), call_meta(residual), activation, out_dtype, n, k, kind, token,
            get_ident())
    bound = bound_call(bkey, pweight, pscale, weight_scale_2, input_scale, bias)
    if bound is not None:  # the same layer tensors, unchanged, and a call of the same metadata: validated
        set_selected(bound.backend)
        return bound.run(x, residual)
    key = ("sm90_prepared", call_key(x, pweight, pscale, weight_scale_2, input_scale, bias, residual), activation,
           out_dtype, n, k, kind, token)

    def decide():
        w0, s0 = _standins(n, k, x.device)
        spec = check_linear_args(x, w0, s0, weight_scale_2, input_scale, bias, residual, activation, out_dtype)
        n_pad, k_pad = -(-n // ROW_TILE) * ROW_TILE, -(-k // K_ALIGN) * K_ALIGN
        expect = (n_pad // ROW_TILE, k_pad // CHUNK * 512), (n_pad // ROW_TILE, k_pad // CHUNK * 64)
        if (tuple(pweight.shape), tuple(pscale.shape)) != expect or pweight.dtype != torch.uint8 or \
                pscale.dtype != torch.uint8:
            raise ValueError(f"nvgemm.nvfp4_linear_sm90_prepared: prepared weight/scale must be uint8 {expect[0]} "
                             f"/ {expect[1]} for N={n} K={k}, got {pweight.dtype} {tuple(pweight.shape)} / "
                             f"{pscale.dtype} {tuple(pscale.shape)}")
        problem = problem_of(x, w0, s0, weight_scale_2, input_scale, bias, residual, activation, spec)
        return spec, problem, select_backend(problem)

    spec, problem, backend = call_plan(key, decide)
    p = sm90_weight_of(pweight, pscale, weight_scale_2, n, k, kind)
    if backend.name in PREPARED_BACKENDS and x.dtype in (torch.bfloat16, torch.float16) and kind_of(x.dtype) == kind \
            and (residual is None or residual.dtype == spec.out_dtype):
        # lazy: keeps templates.sm90_w4a16.backend out of `import nvgemm`
        from nvgemm.templates.sm90_w4a16 import backend as sm90_backend

        out = sm90_backend.run_prepared(x, p, input_scale, bias, residual, activation, out_dtype)
        call = sm90_backend.bind_prepared(x, p, input_scale, bias, residual, activation, out_dtype)
        if call is not None:
            bind_call(bkey, backend, problem, (pweight, pscale, weight_scale_2, input_scale, bias), (), call)
        return out
    warn_once(f"sm90-prepared-fallback-{backend.name}-{x.dtype}",
              f"nvgemm: a layer held in the sm90 layout ({kind}) runs on {backend.name} for x {x.dtype} on "
              f"{x.device}: its checkpoint layout is rebuilt for every such call (correct, slow)")
    w, s = to_modelopt(p)
    return nvfp4_linear(x, w, s, weight_scale_2, input_scale, bias, residual, activation, out_dtype)


@nvfp4_linear_sm90_prepared.register_fake
def _(x, pweight, pscale, weight_scale_2, input_scale, bias, residual, activation, out_dtype, n, k, kind):
    n_out = n // 2 if activation == "silu_mul" else n
    return x.new_empty((*x.shape[:-1], n_out), dtype=out_dtype or x.dtype)


__all__ = ["DECISION_M", "PREPARED_BACKENDS", "nvfp4_linear_sm90_prepared", "one_copy_wanted", "sm90_serve_reason",
           "sm90_weight_of"]
