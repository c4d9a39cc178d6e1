"""``nvgemm.enable()`` / ``disable()`` / ``enabled()``: opt-in TorchInductor registration.

Nothing happens at import. :func:`enable` installs, and :func:`disable` removes again:

* the capture pass (:mod:`nvgemm.integrations.inductor.capture`) at the front of
  ``torch._inductor.config.post_grad_custom_pre_pass`` (kept as a list with any user passes);
* the autotuned lowering (:mod:`nvgemm.integrations.inductor.lowering`) in
  ``torch._inductor.lowering.user_lowerings[nvgemm::nvfp4_linear]`` (the ``lowerings`` table on 2.11), and
  the same for ``nvgemm::nvfp4_linear_sm90_prepared`` (Hopper layers held in the sm90 layout, what a loaded
  checkpoint calls there), ``nvgemm::nvfp4_linear_requant`` and ``nvgemm::nvfp4_linear_prequant``;
* the autotuned lowering of ``nvgemm::nvfp4_moe`` (:mod:`nvgemm.integrations.inductor.moe`, same M ranges);
* the PDL chain from each of those GEMMs into its Triton consumer (:mod:`nvgemm.integrations.inductor.pdl`).

With nvgemm disabled, Inductor compiles ``nvgemm::nvfp4_linear`` as an opaque fallback kernel
(the eager op) and ``_scaled_mm * alpha`` is PyTorch's own business.

Which torch releases: :mod:`nvgemm.integrations.inductor.compat` probes every Inductor piece used here.
Missing required pieces (custom-op autotuning with M-range dispatch, the post-grad pre-pass) make
:func:`enable` raise with the piece and the release that has it; missing optional ones (the PDL
hook, the decode benchmark policy) are skipped with one warning each.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterable, Optional

import torch

log = logging.getLogger("nvgemm_cutedsl")

#: nvgemm's other GEMM ops lowered like ``nvfp4_linear`` (autotuned choice ops, PDL producers): the
#: Hopper linear on weights held in the sm90 layout, and the fused gated-MLP chain's two ops
GEMM_OPS = ("nvfp4_linear_sm90_prepared", "nvfp4_linear_requant", "nvfp4_linear_prequant",
            "nvfp4_linear_prequant_requant")

_LOCK = threading.RLock()
_STATE: dict = {}


def check_torch_version() -> dict:
    """Probe the Inductor pieces nvgemm uses; raise naming any missing required one.

    Returns ``{piece: None if usable else reason}`` (see :mod:`nvgemm.integrations.inductor.compat`).
    """
    # lazy: breaks the cycle integrations.inductor.registration <-> integrations.inductor.compat (through a package __init__)
    from nvgemm.integrations.inductor import compat

    return compat.check_required()


def is_enabled() -> bool:
    return bool(_STATE)


def enable(choices: Optional[Iterable[str]] = None, pdl: bool = True,
           claim_scaled_mm: Optional[bool] = None, fuse_requant: bool = True, fuse_layer: bool = True) -> None:
    """Route NVFP4 linears in ``torch.compile`` graphs through nvgemm (idempotent).

    ``choices`` restricts the autotuning candidates by kind (backend names such as
    ``"cutedsl_sm100"``, ``"triton_w4a16"``, ``"emulated"``, or ``"cublaslt"``); the default is the
    policy for the device (``NVGEMM_INDUCTOR_CHOICES`` overrides). ``pdl=False`` leaves Triton
    consumers without programmatic dependent launch. ``claim_scaled_mm`` rewrites hand-written
    NVFP4 ``torch._scaled_mm(...) * alpha (+ bias)`` chains into nvgemm's op; the default (None)
    does so only where PyTorch itself folds that chain (torch >= 2.15), so on older torch such a
    chain keeps its ATen meaning unless you ask. ``fuse_requant`` rewrites W4A4 gated MLPs
    ``down(silu_mul(gate_up(x)))`` into the fused requant chain (:mod:`nvgemm.integrations.inductor.requant`).
    ``fuse_layer`` folds the layer's glue into nvgemm's ops: SwiGLU and residual adds into the GEMM epilogues,
    RMSNorm + NVFP4 quantization as the producer of W4A4 GEMMs (:mod:`nvgemm.integrations.inductor.layer_fusion`).
    """
    # lazy: breaks the cycle integrations.inductor.registration <-> integrations.inductor.compat (through a package __init__)
    from nvgemm.integrations.inductor import compat

    state = check_torch_version()
    unchecked = compat.unchecked_release()
    if unchecked:
        _warn_once(unchecked)
    if pdl and state["pdl_hook"] is not None:
        _warn_once(f"nvgemm_cutedsl: no PDL chain into Triton consumers on torch {torch.__version__} "
                   f"(selective PDL is in torch >= {compat.BY_NAME['pdl_hook'].since}): {state['pdl_hook']}")
        pdl = False
    if state["cudagraph_benchmarking"] is not None and torch.cuda.is_available():
        _warn_once(f"nvgemm_cutedsl: candidates are timed outside CUDA graphs on torch {torch.__version__} "
                   f"(torch >= {compat.BY_NAME['cudagraph_benchmarking'].since} times them in graphs, as decode runs)")
    elif state["decode_benchmark_policy"] is not None and torch.cuda.is_available():
        _warn_once(f"nvgemm_cutedsl: candidates are benchmarked with Inductor's default timing on torch "
                   f"{torch.__version__}, not 16 calls per CUDA graph with cold weights (torch >= "
                   f"{compat.BY_NAME['decode_benchmark_policy'].since}): {state['decode_benchmark_policy']}")
    if claim_scaled_mm is None:
        claim_scaled_mm = state["scaled_mm_fold"] is None
    with _LOCK:
        if _STATE:
            disable()
        from torch._inductor import config
        # lazy: breaks the cycle integrations.inductor.registration <-> integrations.inductor.capture (through a package __init__); breaks the cycle integrations.inductor.registration <-> integrations.inductor.choices (through a package __init__)
        from nvgemm.integrations.inductor import capture, lowering, moe as moe_lowering, pdl as pdl_mod
        from nvgemm.integrations.inductor.choices import EMULATED  # noqa: F401  (registers nvgemm::nvfp4_linear_choice)

        user_lowerings = compat.lowering_table()
        op = torch.ops.nvgemm.nvfp4_linear.default
        allowed = set(choices) if choices is not None else None
        if allowed is not None:
            allowed.add("emulated")
        prev_pass = config.post_grad_custom_pre_pass
        prev_lowering = user_lowerings.get(op)
        the_pass = capture.make_pass(claim_scaled_mm=claim_scaled_mm, fuse_requant=fuse_requant,
                                     fuse_layer=fuse_layer)
        existing = [] if prev_pass is None else list(prev_pass) if isinstance(prev_pass, (list, tuple)) else [prev_pass]
        config.post_grad_custom_pre_pass = [the_pass, *existing] if existing else the_pass
        user_lowerings[op] = lowering.build_lowering(allowed)
        prev_gemm_lowerings = {}
        for name in GEMM_OPS:
            gemm_op = getattr(torch.ops.nvgemm, name).default
            prev_gemm_lowerings[name] = user_lowerings.get(gemm_op)
            user_lowerings[gemm_op] = lowering.build_op_lowering(name, allowed)
        moe_op = torch.ops.nvgemm.nvfp4_moe.default
        prev_moe_lowering = user_lowerings.get(moe_op)
        user_lowerings[moe_op] = moe_lowering.build_lowering(allowed)
        if pdl:
            pdl_mod.install()
        _STATE.update(prev_pass=prev_pass, prev_lowering=prev_lowering, prev_moe_lowering=prev_moe_lowering,
                      prev_gemm_lowerings=prev_gemm_lowerings,
                      the_pass=the_pass, pdl=pdl,
                      claim_scaled_mm=claim_scaled_mm, fuse_requant=fuse_requant, fuse_layer=fuse_layer)
        log.info("nvgemm_cutedsl: enabled (M split points %s, pdl=%s, claim _scaled_mm*alpha=%s)",
                 user_lowerings[op].split_points, pdl, claim_scaled_mm)


_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg in _WARNED:
        return
    _WARNED.add(msg)
    import warnings

    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    log.warning(msg)


def disable() -> None:
    """Undo :func:`enable` (idempotent); PyTorch's own behaviour is restored."""
    with _LOCK:
        if not _STATE:
            return
        from torch._inductor import config

        # lazy: breaks the cycle integrations.inductor.registration <-> integrations.inductor.compat (through a package __init__)
        from nvgemm.integrations.inductor import compat, pdl as pdl_mod

        user_lowerings = compat.lowering_table()
        op = torch.ops.nvgemm.nvfp4_linear.default
        cur = config.post_grad_custom_pre_pass
        the_pass = _STATE["the_pass"]
        if cur is the_pass:
            config.post_grad_custom_pre_pass = _STATE["prev_pass"]
        elif isinstance(cur, (list, tuple)):
            rest = [p for p in cur if p is not the_pass]
            config.post_grad_custom_pre_pass = rest if len(rest) > 1 else (rest[0] if rest else None)
        if _STATE["prev_lowering"] is None:
            user_lowerings.pop(op, None)
        else:
            user_lowerings[op] = _STATE["prev_lowering"]
        for name, prev in _STATE["prev_gemm_lowerings"].items():
            gemm_op = getattr(torch.ops.nvgemm, name).default
            if prev is None:
                user_lowerings.pop(gemm_op, None)
            else:
                user_lowerings[gemm_op] = prev
        moe_op = torch.ops.nvgemm.nvfp4_moe.default
        if _STATE["prev_moe_lowering"] is None:
            user_lowerings.pop(moe_op, None)
        else:
            user_lowerings[moe_op] = _STATE["prev_moe_lowering"]
        pdl_mod.uninstall()
        _STATE.clear()
        log.info("nvgemm_cutedsl: disabled")


@contextlib.contextmanager
def enabled(choices: Optional[Iterable[str]] = None, pdl: bool = True, claim_scaled_mm: Optional[bool] = None,
            fuse_requant: bool = True, fuse_layer: bool = True):
    """``with nvgemm.enabled(): torch.compile(...)(...)`` -- enable for the block, then restore."""
    was = dict(_STATE)
    enable(choices=choices, pdl=pdl, claim_scaled_mm=claim_scaled_mm, fuse_requant=fuse_requant, fuse_layer=fuse_layer)
    try:
        yield
    finally:
        disable()
        if was:
            enable(pdl=was["pdl"], claim_scaled_mm=was["claim_scaled_mm"], fuse_requant=was["fuse_requant"],
                   fuse_layer=was.get("fuse_layer", True))
