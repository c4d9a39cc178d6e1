"""``nvgemm`` command line (``nvgemm`` console script, ``python -m nvgemm.cli``): one sub-command per
module of this package, imported lazily.

Each module in ``COMMANDS`` defines ``add_parser(subparsers) -> argparse.ArgumentParser`` whose
parser sets ``func`` (``args -> int``). Modules import torch/cutlass inside ``func``, so
``nvgemm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nvgemm import settings

# (sub-command, module)
COMMANDS: list[tuple[str, str]] = [
    ("demo", "nvgemm.cli.demo"),
    ("plan", "nvgemm.cli.plan"),
    ("precompile", "nvgemm.cli.precompile"),
    ("bench", "nvgemm.cli.bench"),
    ("model", "nvgemm.cli.model"),
    ("env", "nvgemm.cli.env"),
]


def int_list(s: str) -> list[int]:
    """argparse type: a comma-separated list of positive integers (token counts, buckets)."""
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def int_pair(s: str) -> tuple[int, int]:
    """argparse type: two comma-separated positive integers (N,K or LO,HI)."""
    v = int_list(s)
    if len(v) != 2:
        raise argparse.ArgumentTypeError(f"expected two comma-separated integers, got {s!r}")
    return v[0], v[1]


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
    """Run one sub-command. Any error is one line on stderr naming the problem and a nonzero exit
    (2: bad input the command recognised; 1: anything else), never a traceback unless NVGEMM_DEBUG=1."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        debug = settings.NVGEMM_DEBUG
    except settings.SettingError as e:
        print(f"nvgemm {args.command}: error: {e}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"nvgemm {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # the last line of defence: one line, not a traceback
        if debug:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"nvgemm {args.command}: error: {type(e).__name__}{': ' + msg if msg else ''} "
              "(set NVGEMM_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
