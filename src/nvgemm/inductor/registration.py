"""``nvgemm.enable()`` / ``disable()`` / ``enabled()``: opt-in TorchInductor registration.

Nothing happens at import. :func:`enable` installs, and :func:`disable` removes again:

* the capture pass (:mod:`nvgemm.inductor.capture`) at the front of
  ``torch._inductor.config.post_grad_custom_pre_pass`` (kept as a list with any user passes);
* the autotuned lowering (:mod:`nvgemm.inductor.lowering`) in
  ``torch._inductor.lowering.user_lowerings[nvgemm::nvfp4_linear]``;
* the PDL chain into Triton consumers (:mod:`nvgemm.inductor.pdl`).

With nvgemm disabled, Inductor compiles ``nvgemm::nvfp4_linear`` as an opaque fallback kernel
(the eager op) and ``_scaled_mm * alpha`` is PyTorch's own business.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterable, Optional

import torch

log = logging.getLogger("nvgemm_cutedsl")

MIN_TORCH = (2, 15)
_LOCK = threading.RLock()
_STATE: dict = {}


def _torch_release() -> tuple[int, ...]:
    from packaging.version import Version

    return Version(torch.__version__.split("+")[0]).release


def check_torch_version() -> None:
    rel = _torch_release()
    if rel[:2] < MIN_TORCH:
        raise RuntimeError(
            f"nvgemm_cutedsl: the TorchInductor integration needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} "
            f"(register_custom_op_autotuning with range dispatch, post_grad_custom_pre_pass ordering, "
            f"selective PDL); this is torch {torch.__version__}"
        )


def is_enabled() -> bool:
    return bool(_STATE)


def enable(choices: Optional[Iterable[str]] = None, pdl: bool = True) -> None:
    """Route NVFP4 linears in ``torch.compile`` graphs through nvgemm (idempotent).

    ``choices`` restricts the autotuning candidates by kind (backend names such as
    ``"cutedsl_sm100"``, ``"triton_w4a16"``, ``"emulated"``, or ``"cublaslt"``); the default is the
    policy for the device (``NVGEMM_INDUCTOR_CHOICES`` overrides). ``pdl=False`` leaves Triton
    consumers without programmatic dependent launch.
    """
    check_torch_version()
    with _LOCK:
        if _STATE:
            disable()
        from torch._inductor import config
        from torch._inductor.lowering import user_lowerings

        from . import capture, lowering, pdl as pdl_mod
        from .choices import EMULATED  # noqa: F401  (registers nvgemm::nvfp4_linear_choice)

        op = torch.ops.nvgemm.nvfp4_linear.default
        allowed = set(choices) if choices is not None else None
        if allowed is not None:
            allowed.add("emulated")
        prev_pass = config.post_grad_custom_pre_pass
        prev_lowering = user_lowerings.get(op)
        the_pass = capture.make_pass()
        existing = [] if prev_pass is None else list(prev_pass) if isinstance(prev_pass, (list, tuple)) else [prev_pass]
        config.post_grad_custom_pre_pass = [the_pass, *existing] if existing else the_pass
        user_lowerings[op] = lowering.build_lowering(allowed)
        if pdl:
            pdl_mod.install()
        _STATE.update(prev_pass=prev_pass, prev_lowering=prev_lowering, the_pass=the_pass, pdl=pdl)
        log.info("nvgemm_cutedsl: enabled (M split points %s, pdl=%s)", user_lowerings[op].split_points, pdl)


def disable() -> None:
    """Undo :func:`enable` (idempotent); PyTorch's own behaviour is restored."""
    with _LOCK:
        if not _STATE:
            return
        from torch._inductor import config
        from torch._inductor.lowering import user_lowerings

        from . import pdl as pdl_mod

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
        pdl_mod.uninstall()
        _STATE.clear()
        log.info("nvgemm_cutedsl: disabled")


@contextlib.contextmanager
def enabled(choices: Optional[Iterable[str]] = None, pdl: bool = True):
    """``with nvgemm.enabled(): torch.compile(...)(...)`` -- enable for the block, then restore."""
    was = dict(_STATE)
    enable(choices=choices, pdl=pdl)
    try:
        yield
    finally:
        disable()
        if was:
            enable(pdl=was["pdl"])
