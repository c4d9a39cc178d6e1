"""nvgemm's vLLM plugin: serve ModelOpt NVFP4 checkpoints with ``torch.ops.nvgemm.nvfp4_linear``.

Installed with ``pip install "nvgemm[vllm]"`` and found by vLLM through the ``vllm.general_plugins``
entry point ``nvgemm = nvgemm.integrations.vllm:register``, which vLLM calls in every process (API server,
engine core, each tensor-parallel worker). It does nothing unless the user opts in:

* ``NVGEMM_VLLM=1`` enables it (``NVGEMM_VLLM=0`` disables it whatever else is set), or
* ``VLLM_PLUGINS`` names ``nvgemm`` explicitly (vLLM's plugin allow-list).

When enabled it checks the vLLM version (:mod:`nvgemm.integrations.vllm._compat`; an untested vLLM is a clear
error, never a guess) and registers nvgemm's ``modelopt_fp4`` / ``modelopt_mixed`` quantization
configs: the linear layers of ModelOpt ``NVFP4`` (W4A4), ``W4A16_NVFP4`` and ``MIXED_PRECISION``
checkpoints then run through nvgemm (:mod:`nvgemm.integrations.vllm.method`), and so do their routed experts
(:mod:`nvgemm.integrations.vllm.moe`, ``nvgemm::nvfp4_moe``); everything else is vLLM's.
"""

from __future__ import annotations

import logging
import os

from nvgemm import settings
from nvgemm.integrations.vllm import _compat

log = logging.getLogger("nvgemm_cutedsl.vllm")

PLUGIN_NAME = "nvgemm"

_REGISTERED = False


def opted_in(environ=None) -> bool:
    """True when the user asked for the plugin (see the module docstring)."""
    env = os.environ if environ is None else environ
    flag = settings.get("NVGEMM_VLLM", env)
    if flag is not None:
        return flag
    allowed = env.get("VLLM_PLUGINS")
    return allowed is not None and PLUGIN_NAME in [p.strip() for p in allowed.split(",")]


def _show_logs() -> None:
    """vLLM configures only its own loggers; print nvgemm's INFO lines (the per-layer kernel choice)
    the same way unless the application configured the ``nvgemm_cutedsl`` logger itself."""
    import sys

    root = logging.getLogger("nvgemm_cutedsl")
    if root.handlers:
        return
    h = logging.StreamHandler(sys.stdout)
    h.setFormatter(logging.Formatter("(pid=%(process)d) %(levelname)s %(asctime)s [nvgemm] %(message)s", "%m-%d %H:%M:%S"))
    root.addHandler(h)
    root.setLevel(settings.NVGEMM_VLLM_LOG_LEVEL)
    root.propagate = False


def register() -> None:
    """The ``vllm.general_plugins`` entry point (idempotent; called once per vLLM process)."""
    global _REGISTERED
    if _REGISTERED or not opted_in():
        return

    version = _compat.check_version()
    # lazy: vllm import cost
    from nvgemm.integrations.vllm.method import register_configs

    register_configs()
    _show_logs()
    _REGISTERED = True
    log.info("nvgemm_cutedsl: vLLM %s plugin enabled in process %d: ModelOpt NVFP4 / W4A16_NVFP4 / "
             "MIXED_PRECISION linear layers run on torch.ops.nvgemm.nvfp4_linear, routed experts %s", version,
             os.getpid(), "on torch.ops.nvgemm.nvfp4_moe" if _compat.moe_supported(version) else "stay vLLM's")
