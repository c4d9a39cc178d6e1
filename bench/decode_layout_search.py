"""Exhaustive search: is there an integer decode of one sm90 weight word cheaper than 9 instructions?

    python bench/decode_layout_search.py [--kind bf16|fp16|both] [--budget 8]

The sm90 W4A16 kernels decode each prepared 32-bit weight word (8 E2M1 codes) into four packed
bf16x2 / f16x2 registers whose set bits may only sit at the 8 "field" positions F of the format
(bf16: bits 6, 7, 8, 15 of each half; fp16: 9, 10, 11, 15; :mod:`nvgemm.templates.sm90.operand`).
The word is re-laid-out offline, so any bijection of its 32 bits is free; what costs instructions
is moving bits at run time. The kernels use (SASS): a rotation ``SHF.R.W`` (1 instruction), a
mask ``v & F`` (1 ``LOP3``), and a select ``(v & S) | (c & ~S)`` (1 ``LOP3``, ``S`` an immediate)
with a "clean" register ``c = rot(w, r) & A`` (1 ``LOP3``, plus its rotation) that is zero outside
``A``; the shipped scheme is 4 rotations + 5 masks / selects = 9 per word.

This script searches every scheme of that instruction set up to ``--budget`` instructions: a set
of rotations (one of them 0 without loss of generality -- the offline layout absorbs a common
shift -- so it costs one instruction fewer than it has members), one to two clean registers
(each a mask of one of those rotations), and for every output a main rotation plus, optionally,
one clean register supplying some of its field bits (the clean registers' supports are disjoint
per output, as a select requires). A scheme is feasible iff the 32 (output, field bit) slots draw
32 distinct bits of the word. Fewer than 3 distinct rotations can never be feasible (each field
position then has at most 2 candidate sources for 4 outputs), and a scheme with only masks needs
one rotation per output: both are covered by the enumeration below.

Result on 2026-12-01 (also printed by this script): no scheme of 8 or fewer instructions exists
for either format; the shipped 9-instruction scheme is the minimum of this instruction set. (Other
instructions -- byte permutes, funnel shifts across two words -- are not searched.) Runtime: 1-2
minutes per format on one CPU core (`bench/results/decode_layout_search.md`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

FIELDS = {"bf16": (6, 7, 8, 15), "fp16": (9, 10, 11, 15)}


def field_positions(kind: str) -> list[int]:
    return [p + h for h in (0, 16) for p in FIELDS[kind]]


def feasible(P: list[int], rs: tuple, crot: tuple, cown: tuple) -> bool:
    """Do outputs with main rotations ``rs`` and clean registers (rotations ``crot``, output j using
    clean ``cown[j]`` or None) draw 32 distinct word bits? Backtracking over field positions."""
    used = [False] * 32
    owners = [[None] + [j for j in range(4) if cown[j] == k] for k in range(len(crot))]

    def bt(i: int) -> bool:
        if i == len(P):
            return True
        p = P[i]
        for choice in itertools.product(*owners):
            src = []
            for j in range(4):
                k = cown[j]
                r = crot[k] if k is not None and choice[k] == j else rs[j]
                src.append((p + r) % 32)
            if len(set(src)) < 4 or any(used[s] for s in src):
                continue
            for s in src:
                used[s] = True
            if bt(i + 1):
                return True
            for s in src:
                used[s] = False
        return False

    return bt(0)


def search(kind: str, budget: int):
    """The first feasible scheme of at most ``budget`` instructions, or None."""
    P = field_positions(kind)
    for nrot in range(2, 4):  # nonzero rotations; with 0 that is 3 or 4 distinct views
        for rots in itertools.combinations(range(1, 32), nrot):
            R = (0, *rots)
            for ncl in range(0, 3):
                if nrot + 4 + ncl > budget:
                    continue
                for crot in itertools.combinations_with_replacement(R, ncl):
                    # outputs are interchangeable: a multiset of (main rotation, clean index) per output
                    per_out = [(r, k) for r in R for k in [None, *range(ncl)]]
                    for outs in itertools.combinations_with_replacement(per_out, 4):
                        rs = tuple(o[0] for o in outs)
                        cown = tuple(o[1] for o in outs)
                        if set(rots) - set(rs) - set(crot):
                            continue  # a rotation nobody uses: counted by a smaller set
                        if ncl and any(k not in cown for k in range(ncl)):
                            continue
                        if any(cown[j] is not None and crot[cown[j]] == rs[j] for j in range(4)):
                            continue  # a clean of the output's own rotation adds nothing
                        if feasible(P, rs, crot, cown):
                            return {"rotations": R, "outputs": rs, "clean_rotations": crot, "clean_of": cown,
                                    "instructions": nrot + 4 + ncl}
    return None


def shipped_scheme(kind: str):
    """nvgemm's scheme for ``kind`` (None when nvgemm / torch cannot be imported)."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from nvgemm.templates.sm90.operand import SCHEMES
    except ImportError:
        return None
    return SCHEMES[kind]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("bf16", "fp16", "both"), default="both")
    ap.add_argument("--budget", type=int, default=8, help="largest instruction count searched (default 8)")
    args = ap.parse_args(argv)
    kinds = ("bf16", "fp16") if args.kind == "both" else (args.kind,)
    for kind in kinds:
        # the search's model must admit the shipped 9-instruction scheme (else it proves nothing)
        sch = shipped_scheme(kind)
        if sch is not None:
            ok = feasible(field_positions(kind), sch.rot, (sch.rot_clean,), (None, 0, 0, 0))
            print(f"{kind}: shipped scheme (rotations {sch.rot}, clean rotation {sch.rot_clean}, 9 instructions) "
                  f"{'admitted' if ok else 'NOT admitted'} by the search's model", flush=True)
            if not ok:
                return 1
        t0 = time.time()
        found = search(kind, args.budget)
        verdict = f"feasible: {found}" if found else f"no scheme of <= {args.budget} instructions"
        print(f"{kind}: field bits {field_positions(kind)}: {verdict} ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
