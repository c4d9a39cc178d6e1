"""Decode-step benchmark: a thin wrapper of ``nvgemm bench decode-step`` (:mod:`nvgemm.cli.decode_step`).

Counts a preset's batch-1 decode-step kernels from Inductor's generated code (fake device, no GPU needed),
models ms/token, and on a GPU also times the step under a CUDA graph. Arguments are the command's::

    python bench/bench_decode_step.py --model Llama-3.1-8B --gpu B200 --json bench/results/decode_step_b200.json
"""

from __future__ import annotations

import sys

from nvgemm.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "decode-step", *sys.argv[1:]]))
