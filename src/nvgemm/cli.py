"""``nvgemm`` command line: one sub-command per module, imported lazily.

Each module in ``COMMANDS`` defines ``add_parser(subparsers) -> argparse.ArgumentParser`` whose
parser sets ``func`` (``args -> int``). Modules import torch/cutlass inside ``func``, so
``nvgemm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (sub-command, module)
COMMANDS: list[tuple[str, str]] = [
    ("demo", "nvgemm.demo"),
    ("plan", "nvgemm.heuristics.plan_cli"),
    ("precompile", "nvgemm.runtime.precompile_cli"),
    ("bench", "nvgemm.bench_cli"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nvgemm",
        description="nvgemm: NVFP4 decode GEMMs (CuTeDSL kernels) for TorchInductor. "
        "Run `nvgemm demo` for the end-to-end example.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _, module in COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
