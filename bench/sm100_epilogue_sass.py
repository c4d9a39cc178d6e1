"""SASS of the sm100 NVFP4 kernel's epilogue and split-K reduction, counted without a GPU.

Compiles a fixed set of configs for sm_100a (CuTeDSL -> PTX, then ``ptxas`` and ``cuobjdump``
from the Triton wheel), and counts per kernel: global loads/stores by width, shared stores, TMA
stores, shuffles, registers, and the split-K reduction's per-element loops (a backward branch whose
body holds exactly one global load and one FADD: one split of one element per trip). Works on any checkout: run it with that checkout's ``src``
first on PYTHONPATH (the pre-``templates/sm100/`` layout is handled too).

    PYTHONPATH=src python bench/sm100_epilogue_sass.py --label after > after.md
    PYTHONPATH=<old checkout>/src python bench/sm100_epilogue_sass.py --label before > before.md

The modelled reduction latency (labelled MODELLED in the output) is the dependent chain of L2
round trips in the last split's reduction -- before: each element's (S-1) loads run inside a
rolled loop (load -> add -> branch), so the chain is elements x sub-tiles x (S-1); after: all
S x chunk 16-byte loads of a round are in flight together, so the chain is rounds x sub-tiles --
times an assumed L2 round trip of 0.2-0.4 us (B200 L2 hit latency is not measured here).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")
os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="nvgemm_cute_dump_"))

L2_RT_US = (0.2, 0.4)  # assumed L2 round trip (MODELLED)


def _tools():
    import triton

    b = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = os.path.join(b, "ptxas-blackwell")
    return (ptxas if os.path.exists(ptxas) else os.path.join(b, "ptxas")), os.path.join(b, "cuobjdump")


def _cases():
    import torch

    from nvgemm.epilogues import EpilogueSpec

    try:
        from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig as C
    except ImportError:  # before the family folder
        from nvgemm.templates.sm100_config import Sm100Nvfp4GemmConfig as C
    full = EpilogueSpec(alpha="vector", bias=True, activation="none", residual=True)
    gated = EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True)
    scalar = EpilogueSpec(alpha="scalar")
    return [
        ("128x16 swap-AB split-K 4", C(tile_n=16, swap_ab=True, split_k=4), scalar),
        ("128x8 swap-AB split-K 16", C(tile_n=8, swap_ab=True, split_k=16), scalar),
        ("128x8 swap-AB split-K 2", C(tile_n=8, swap_ab=True, split_k=2), scalar),
        ("256x64 c4 swap-AB split-K 2", C(tile_m=256, tile_n=64, cluster_m=4, swap_ab=True, split_k=2), scalar),
        ("128x16 swap-AB alpha-vec+bias+res", C(tile_n=16, swap_ab=True), full),
        ("128x16 swap-AB gated", C(tile_n=16, swap_ab=True), gated),
        ("128x128 alpha-vec+bias+res", C(tile_n=128), full),
        ("128x128 gated", C(tile_n=128), gated),
        ("128x128 scalar alpha", C(tile_n=128), scalar),
        ("128x16 swap-AB fp16 gated", C(tile_n=16, swap_ab=True),
         EpilogueSpec(alpha="vector", bias=True, activation="silu_mul", residual=True, out_dtype=torch.float16)),
    ]


def sass_stats(sass: str) -> dict:
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    st: dict = {"instructions": len(ins), "reduce_loops": 0}
    for addr, txt in ins:
        op = re.sub(r"^@!?U?P\w+\s+", "", txt).split()[0]
        base = op.split(".")[0]
        if base in ("LDG", "STG", "STS", "LDTM"):
            st[op] = st.get(op, 0) + 1
        elif base in ("UTMASTG", "SHFL", "FFMA", "FADD"):
            st[base] = st.get(base, 0) + 1
        if base == "BRA":
            m = re.search(r"0x([0-9a-f]+)", txt)
            if m and int(m.group(1), 16) <= addr:
                body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
                ldg = [t for t in body if re.search(r"(^|\s)LDG\.", t)]
                if len(ldg) == 1 and sum("FADD" in t for t in body) == 1:  # one element, one split per trip
                    st["reduce_loops"] += 1
    return st


def chain(cfg, after: bool) -> int:
    """Dependent L2 round trips in the last split's reduction (see the module docstring)."""
    if cfg.split_k == 1:
        return 0
    epi_n = min(cfg.tile_n, 32)
    subtiles = cfg.tile_n // epi_n
    if not after:
        return epi_n * subtiles * (cfg.split_k - 1) if cfg.split_k > 2 else subtiles
    vecs = epi_n // 4
    chunk = max(1, min(vecs, 16 // cfg.split_k))
    while vecs % chunk:
        chunk -= 1
    return subtiles * (vecs // chunk)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="this tree")
    ap.add_argument("--after", action="store_true", help="model the reduction as the new (all-loads-first) code")
    a = ap.parse_args()
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.aot.abi import get_template

    ptxas, cuobjdump = _tools()
    tpl = get_template("sm100_nvfp4_gemm")
    keys = ["LDG.E", "LDG.E.U16", "LDG.E.128", "STG.E", "STG.E.U16", "STG.E.128", "STS.128", "UTMASTG", "SHFL",
            "reduce_loops"]
    print(f"# sm100 epilogue SASS counts: {a.label}\n")
    print(f"- command: `{' '.join(sys.argv)}`; ptxas: `{ptxas}`; date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"- reduction chain x {L2_RT_US[0]}-{L2_RT_US[1]} us per L2 round trip = MODELLED reduce latency\n")
    print("| kernel | regs | " + " | ".join(keys) + " | reduce chain (round trips) | MODELLED reduce us |")
    print("|---|---" + "|---" * len(keys) + "|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for label, cfg, epi in _cases():
            f = tpl.compile(make_spec("sm100_nvfp4_gemm", cfg, "sm_100a", epilogue=epi), keep_ptx=True)
            ptx = os.path.join(d, "k.ptx")
            open(ptx, "w").write(f.__ptx__)
            cub = os.path.join(d, "k.cubin")
            res = subprocess.run([ptxas, "-arch=sm_100a", "-O3", "-v", ptx, "-o", cub], capture_output=True,
                                 text=True, check=True)
            regs = re.findall(r"Used (\d+) registers", res.stderr)
            spill = sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", res.stderr))
            st = sass_stats(subprocess.run([cuobjdump, "-sass", cub], capture_output=True, text=True).stdout)
            ch = chain(cfg, a.after)
            us = f"{ch * L2_RT_US[0]:.1f}-{ch * L2_RT_US[1]:.1f}" if ch else "-"
            print(f"| {label} | {regs[0] if regs else '?'}{f' (spill {spill} B)' if spill else ''} | " + " | ".join(str(st.get(k, 0)) for k in keys)
                  + f" | {ch} | {us} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
