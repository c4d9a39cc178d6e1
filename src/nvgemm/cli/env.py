"""``nvgemm env``: what this installation has -- versions, the GPU, settings, and the Inductor pieces per torch.

Prints the versions nvgemm depends on, whether each is inside the supported range, the CUDA
device (if any) and which nvgemm kernel family serves it, every ``NVGEMM_*`` setting with its value,
source (default / environment) and tag (codegen / runtime; :mod:`nvgemm.settings`), whether the SGLang plugin
is installed with a tested SGLang and opted in, and the table of TorchInductor pieces the ``nvgemm.enable()``
integration uses on the running torch (:mod:`nvgemm.integrations.inductor.compat`). Exit status 0 when every
dependency is inside the supported range and every setting parses, 1 otherwise. ``--markdown`` prints
docs/env.md instead.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
from typing import Mapping, Optional

from nvgemm import settings
from nvgemm.integrations.sglang import status as sglang_status

#: (distribution, lowest supported version, why the floor is there)
SUPPORTED = (
    ("torch", "2.11", "lowest release checked (CPU suite); the first with custom-op autotuning by M range"),
    ("nvidia-cutlass-dsl", "4.8.0", "every policy config compiles with 4.8.0 (vLLM 0.33's pin) and 4.8.1"),
    ("nvidia-modelopt", "0.47", "checkpoint layout and quantizer recipe checked byte-exact against 0.47"),
    ("transformers", "4.57", "lowest release ModelOpt 0.47 supports"),
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("env", help="versions, GPU and the TorchInductor pieces available on this install",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--markdown", action="store_true",
                   help="print the settings reference (docs/env.md is this output) and exit")
    p.set_defaults(func=run)
    return p


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def check_versions() -> list[tuple[str, str | None, str, bool]]:
    """``(distribution, installed or None, floor, inside the range)`` for every dependency above."""
    from packaging.version import Version

    rows = []
    for dist, floor, _why in SUPPORTED:
        have = _version(dist)
        ok = have is not None and Version(have.split("+")[0]) >= Version(floor)
        rows.append((dist, have, floor, ok))
    return rows


def settings_report(environ: Optional[Mapping[str, str]] = None) -> tuple[list[str], bool]:
    """The lines ``nvgemm env`` prints about the settings, and whether every value parses."""
    rows = settings.report(environ)
    width = max(len(r.setting.name) for r in rows)
    lines = ["Settings (NVGEMM_*; docs/env.md):"]
    for r in rows:
        line = f"  {r.setting.name:<{width}}  {r.value or '(unset)':<16} {r.source:<11}  {r.setting.tag}"
        lines.append(line + (f"   <-- {r.error}" if r.error else ""))
    unknown = settings.unknown(environ)
    if unknown:
        lines.append(f"  not nvgemm settings, ignored: {', '.join(unknown)}")
    return lines, all(r.error is None for r in rows)


def kernel_backends(capability: tuple[int, int]) -> str:
    """The registered kernel backends that take a decode-sized linear (M = 1, 4096 x 4096, bf16) on a device
    of ``capability``, per layer kind: e.g. ``cutedsl_mma_w4a16, triton_w4a16 (W4A16)`` for (12, 0);
    ``emulated`` where none does. Read from the backends' own ``supports`` rules (forced-only tools such as
    the PTX emulator's backends are not listed)."""
    import torch

    # lazy: the registry registers every kernel family on import
    from nvgemm.core.backend import LINEAR
    from nvgemm.dispatch.registry import LinearProblem, backends

    parts = []
    for label, weight_only in (("W4A4", False), ("W4A16", True)):
        p = LinearProblem(m=1, n=4096, k=4096, device_type="cuda", capability=tuple(capability),
                          weight_only=weight_only, x_dtype=torch.bfloat16, out_dtype=torch.bfloat16, alpha="scalar",
                          bias=False, activation="none", residual=False)
        names = [b.name for b in backends(LINEAR) if b.name != "emulated" and b.autotune and b.supports(p) is None]
        if names:
            parts.append(f"{', '.join(names)} ({label})")
    return "; ".join(parts) or "emulated"


def run(args) -> int:
    if args.markdown:
        sys.stdout.write(settings.markdown())
        return 0
    import torch

    rows = check_versions()
    print("nvgemm", _version("nvgemm") or "(not installed)")
    for dist, have, floor, ok in rows:
        print(f"  {dist:<20} {have or 'missing':<16} supported >= {floor}{'' if ok else '   <-- outside the range'}")
    for dist in ("triton", "nvidia-matmul-heuristics"):
        print(f"  {dist:<20} {_version(dist) or 'missing'}")
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        print(f"GPU: {torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]}): nvgemm kernels {kernel_backends(cap)}")
    else:
        print("GPU: none (every linear runs on the emulated backend; kernels can still be compiled "
              "ahead of time with `nvgemm precompile --arch ...`)")
    lines, settings_ok = settings_report()
    print("\n".join(lines))
    print(f"SGLang plugin (nvgemm.integrations.sglang): {sglang_status()}")
    # lazy: nvgemm env reports on installs where the Inductor integration does not import
    from nvgemm.integrations.inductor import compat

    print("TorchInductor integration (nvgemm.enable()):")
    print(compat.report())
    return 0 if all(ok for *_, ok in rows) and settings_ok else 1
