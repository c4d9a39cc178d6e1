"""nvgemm's SGLang plugin: serve ModelOpt NVFP4 checkpoints with ``torch.ops.nvgemm.nvfp4_linear``.

Installed with ``pip install "nvgemm[sglang]"`` and found by SGLang through the ``sglang.srt.plugins``
entry point ``nvgemm = nvgemm.integrations.sglang:register``, which SGLang calls in every process it
starts (the launcher before it parses the server arguments, the scheduler of each tensor-parallel
rank, the detokenizer). It does nothing unless the user opts in:

* ``NVGEMM_SGLANG=1`` enables it (``NVGEMM_SGLANG=0`` disables it whatever else is set), or
* ``SGLANG_PLUGINS`` names ``nvgemm`` (SGLang's plugin allow-list).

When enabled it checks the SGLang version (:mod:`._compat`; an untested SGLang stops startup, never a
guess) and replaces SGLang's ``modelopt_fp4`` / ``modelopt_mixed`` quantization configs in place: the
linear layers of ModelOpt ``NVFP4`` (W4A4), ``W4A16_NVFP4`` and ``MIXED_PRECISION`` checkpoints then
run through nvgemm (:mod:`.method`), and their routed MoE experts through ``torch.ops.nvgemm.nvfp4_moe``
(:mod:`.moe`); everything else (router, shared experts, attention, ...) is SGLang's.

SGLang logs and swallows any ``Exception`` a plugin raises, which would leave an opted-in user on
SGLang's own kernels without noticing. So when the user opted in and the plugin cannot install itself
(untested SGLang, a missing SGLang name, an import error), :func:`register` raises ``SystemExit`` with
the reason: SGLang does not catch it, and startup stops with the message.
"""

from __future__ import annotations

import logging
import os

from nvgemm import settings
from nvgemm.integrations.sglang import _compat

log = logging.getLogger("nvgemm_cutedsl.sglang")

PLUGIN_NAME = "nvgemm"
ENV = "NVGEMM_SGLANG"

_REGISTERED = False


class PluginStartupError(SystemExit):
    """nvgemm was asked for (``NVGEMM_SGLANG=1`` / ``SGLANG_PLUGINS``) but cannot serve: stop startup.

    A ``SystemExit`` (not an ``Exception``) so that SGLang's plugin loader, which logs and swallows
    exceptions, lets it through; its code is the message, which Python prints when it ends the process."""


def opted_in(environ=None) -> bool:
    """True when the user asked for the plugin (see the module docstring). A value of ``NVGEMM_SGLANG`` that
    does not parse stops startup (:class:`PluginStartupError`): the user meant something."""
    env = os.environ if environ is None else environ
    try:
        flag = settings.get(ENV, env)
    except settings.SettingError as e:
        raise PluginStartupError(f"nvgemm: {e}") from None
    if flag is not None:
        return flag
    allowed = env.get("SGLANG_PLUGINS")
    return allowed is not None and PLUGIN_NAME in [p.strip() for p in allowed.split(",")]


def status(environ=None) -> str:
    """One line for ``nvgemm env``: the installed SGLang, whether it is tested, whether the plugin is opted in."""
    version = _compat.installed_version()
    if version == "not installed":
        return "SGLang not installed (plugin inactive)"
    tested = _compat._release(version) in _compat.TESTED_VERSIONS
    try:
        on = opted_in(environ)
    except PluginStartupError as e:
        return f"SGLang {version}: {e.code}"
    return (f"SGLang {version} ({'tested' if tested else 'untested: the plugin would stop startup'}), plugin "
            f"{'opted in' if on else f'off (opt in with {ENV}=1 or SGLANG_PLUGINS=nvgemm)'}")


def _show_logs() -> None:
    """Print nvgemm's INFO lines (the per-layer kernel choice) unless the application configured the
    ``nvgemm_cutedsl`` logger itself."""
    import sys

    root = logging.getLogger("nvgemm_cutedsl")
    if root.handlers:
        return
    h = logging.StreamHandler(sys.stdout)
    h.setFormatter(logging.Formatter("(pid=%(process)d) %(levelname)s %(asctime)s [nvgemm] %(message)s",
                                     "%m-%d %H:%M:%S"))
    root.addHandler(h)
    root.setLevel(settings.NVGEMM_SGLANG_LOG_LEVEL)
    root.propagate = False


def _install() -> str:
    version = _compat.check_version()
    # lazy: sglang import cost (the method module imports SGLang; the entry point stays light when not opted in)
    from nvgemm.integrations.sglang.method import register_configs

    register_configs()
    return version


def register() -> None:
    """The ``sglang.srt.plugins`` entry point (idempotent; called in every SGLang process)."""
    global _REGISTERED
    if _REGISTERED or not opted_in():
        return
    try:
        version = _install()
    except Exception as e:  # noqa: BLE001 -- every failure must stop startup, not only the expected ones
        raise PluginStartupError(
            f"nvgemm: the SGLang plugin was enabled ({ENV}=1 or SGLANG_PLUGINS names nvgemm) but could not install "
            f"itself, so SGLang would silently serve with its own kernels; stopping. Cause: {type(e).__name__}: {e}"
        ) from e
    _show_logs()
    _REGISTERED = True
    log.info("nvgemm_cutedsl: SGLang %s plugin enabled in process %d: ModelOpt NVFP4 / W4A16_NVFP4 / "
             "MIXED_PRECISION linear layers run on torch.ops.nvgemm.nvfp4_linear, their routed MoE experts on "
             "torch.ops.nvgemm.nvfp4_moe",
             version, os.getpid())
