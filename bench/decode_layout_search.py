"""Exhaustive searches for the cheapest integer decode of one sm90 weight word.

    python bench/decode_layout_search.py [--kind bf16|fp16|both] [--budget 8] [--skip-permutation]

The sm90 W4A16 kernels decode each prepared 32-bit weight word (8 E2M1 codes) into four packed
bf16x2 / f16x2 registers whose set bits may only sit at the 8 "field" positions F of the format
(bf16: bits 6, 7, 8, 15 of each half; fp16: 9, 10, 11, 15; :mod:`nvgemm.templates.sm90_w4a16.operand`).
The word is re-encoded offline, so what costs instructions is moving bits at run time: a rotation
``SHF.R.W`` (1 instruction) and one ``LOP3`` per output (the output must be zero outside F, so
its last instruction masks with an immediate).

1. **Permutation layouts** (the word is a bit permutation of the codes; nvgemm's scheme until
   2026-12-01): outputs are a mask ``v & F`` of one rotation, or a select ``(v & S) | (c & ~S)``
   with a "clean" register ``c = rot(w, r) & A`` (1 ``LOP3`` plus its rotation). The search covers
   every rotation set (one of them 0 without loss of generality: the offline layout absorbs a
   common shift), one to two clean registers and every output assignment; a scheme is feasible
   iff the 32 (output, field bit) slots draw 32 distinct word bits. Result: **9** instructions is
   the minimum (4 rotations + clean + 4 selects); none of 8 exists.

2. **Linear layouts** (the word is any GF(2)-linear invertible encoding of the codes; shipped):
   each output is one ``LOP3`` ``(rot(w, a) ^ rot(w, b)) & F`` or ``rot(w, a) & F``. Output bit p
   is then word bit p + a, or the XOR of word bits p + a and p + b: one equation per slot. Read
   each equation as an edge between its two word bits (a single bit: an edge to a ground node);
   the 32 equations are independent -- the encoding exists and is unique -- iff the 32 edges form
   a spanning tree of the 32 word bits plus ground. At least one output must be a single rotation
   (else no edge reaches ground and 32 edges on 32 nodes close a cycle); by the common-shift
   argument it is rotation 0. The search enumerates every set of up to 3 nonzero rotations with
   every assignment of the other three outputs (no scheme: **7 is impossible**), then the sets of
   4 nonzero rotations in order until the first spanning tree (**8 instructions**: 4 rotations +
   4 ``LOP3``), and checks that nvgemm's shipped scheme is a spanning tree.

Other instructions -- byte permutes, funnel shifts across two words, selects mixed with XORs --
are not searched. Runtime: ~1-2 minutes per format for part 1, seconds for part 2, one CPU core
(`bench/results/decode_layout_search.md`).
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


#: nvgemm's permutation scheme before 2026-12-01 (rotations of the outputs, clean rotation):
#: the 9-instruction minimum of part 1, kept to check that the permutation search admits it.
PERMUTATION_SCHEMES = {"bf16": ((0, 2, 6, 8), 12), "fp16": ((0, 2, 5, 9), 12)}


def is_spanning_tree(P: list[int], outs) -> bool:
    """Do the equations of outputs ``outs`` (each a tuple of 1-2 right rotations, XORed then masked
    to the field positions ``P``) determine the word uniquely? (Union-find over word bits + ground.)"""
    parent = list(range(33))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    n = 0
    for src in outs:
        for p in P:
            u = (p + src[0]) % 32
            v = (p + src[1]) % 32 if len(src) == 2 else 32
            ru, rv = find(u), find(v)
            if ru == rv:
                return False
            parent[ru] = rv
            n += 1
    return n == 32


def linear_schemes(kind: str, nrot: int, first_only: bool):
    """Linear schemes with ``nrot`` nonzero rotations, output o0 = rotation 0 alone (see part 2)."""
    P = field_positions(kind)
    found = []
    for rots in itertools.combinations(range(1, 32), nrot):
        R = (0, *rots)
        opts = [(r,) for r in R] + list(itertools.combinations(R, 2))
        for rest in itertools.combinations(opts, 3):
            outs = ((0,), *rest)
            if set(rots) - {r for o in outs for r in o}:
                continue  # a rotation nobody uses: counted with fewer rotations
            if is_spanning_tree(P, outs):
                found.append(outs)
                if first_only:
                    return found
    return found


def shipped_scheme(kind: str):
    """nvgemm's scheme for ``kind`` (None when nvgemm / torch cannot be imported)."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
        from nvgemm.templates.sm90_w4a16.operand import SCHEMES
    except ImportError:
        return None
    return SCHEMES[kind]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("bf16", "fp16", "both"), default="both")
    ap.add_argument("--budget", type=int, default=8, help="part 1: largest instruction count searched (default 8)")
    ap.add_argument("--skip-permutation", action="store_true", help="run part 2 (linear layouts) only")
    args = ap.parse_args(argv)
    kinds = ("bf16", "fp16") if args.kind == "both" else (args.kind,)
    for kind in kinds:
        P = field_positions(kind)
        if not args.skip_permutation:
            # the search's model must admit the 9-instruction permutation scheme (else it proves nothing)
            rs, rc = PERMUTATION_SCHEMES[kind]
            ok = feasible(P, rs, (rc,), (None, 0, 0, 0))
            print(f"{kind}: permutation scheme (rotations {rs}, clean rotation {rc}, 9 instructions) "
                  f"{'admitted' if ok else 'NOT admitted'} by the permutation search's model", flush=True)
            if not ok:
                return 1
            t0 = time.time()
            found = search(kind, args.budget)
            verdict = f"feasible: {found}" if found else f"no scheme of <= {args.budget} instructions"
            print(f"{kind}: permutation layouts, field bits {P}: {verdict} ({time.time() - t0:.0f} s)", flush=True)
        t0 = time.time()
        for nrot in (1, 2, 3):
            n = len(linear_schemes(kind, nrot, first_only=True))
            print(f"{kind}: linear layouts with {nrot} nonzero rotations ({nrot + 4} instructions): "
                  f"{'FOUND' if n else 'none'}", flush=True)
        first = linear_schemes(kind, 4, first_only=True)
        print(f"{kind}: linear layouts with 4 nonzero rotations (8 instructions): first {first[0] if first else None} "
              f"({time.time() - t0:.0f} s)", flush=True)
        sch = shipped_scheme(kind)
        if sch is not None:
            ok = is_spanning_tree(P, sch.sources)
            print(f"{kind}: shipped scheme {sch.sources} ({sch.instructions()} instructions): "
                  f"{'a spanning tree' if ok else 'NOT invertible'}", flush=True)
            if not ok:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
