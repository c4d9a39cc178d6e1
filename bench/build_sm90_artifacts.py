"""Build every sm90 W4A16 kernel the H200 check needs, here (no GPU), into a carryable kernel cache.

    python bench/build_sm90_artifacts.py [--out build/sm90_gpu_check]

For each case of ``bench/sm90_suite.py`` (the policy's pick on the Llama-3.1-8B / 3.3-70B layer
shapes at M = 1..256, timed alternatives of both families -- the decode kernel at M <= 32, the
register-A WGMMA kernel at M = 32..256 -- and the numerics cases) it takes the config the runtime
would pick (``pick_config``) or the case's forced config, builds the compile spec exactly as the runtime does (``compile_spec_for``, with an
empty codegen environment), and fills a :class:`nvgemm.aot.cache.KernelCache` rooted at
``--out`` through the AOT path (``export_to_c`` -> object -> ``gcc -shared`` with the DSL's static
runtime and libcudart). ``--out/manifest.json`` maps each case to its config and entry, so
``bench/gpu_check.py`` loads the same ``kernel.so`` files on the H200 without cutlass-dsl. The grouped
MoE kernels of ``bench/sm90_moe_suite.py`` (two per case) are built too and listed under
``moe_entries`` (``--moe-only``: just those).

Rebuild after any change under src/nvgemm/templates or src/nvgemm/epilogues (the cache's source
fingerprint changes, and the device refuses entries built from other sources). The folder is
git-ignored (``build/``); carry it to the device machine (a few MB).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _load_suite():
    spec = importlib.util.spec_from_file_location("sm90_suite", ROOT / "bench" / "sm90_suite.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sm90_suite"] = mod
    spec.loader.exec_module(mod)
    return mod


def case_config(case, suite):
    from nvgemm.templates.sm90_w4a16.backend import pick_config
    from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config

    if case.config is not None:
        return Sm90W4A16Config(**case.config)
    return pick_config(case.m, case.n, case.k, case.torch_x_dtype, case.activation, suite.SM_COUNT)


def case_epilogue(case):
    from nvgemm.core.epilogue import EpilogueSpec

    return EpilogueSpec(
        alpha="vector" if case.vector_alpha else "scalar",
        bias=case.bias,
        activation=case.activation,
        residual=case.residual,
        out_dtype=case.torch_out_dtype,
    )


def case_spec(case, suite, config=None):
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.templates.sm90_w4a16.backend import _X_FORMAT, ARCH, template_id_of
    from nvgemm.aot.abi import HardwareSpec

    config = config or case_config(case, suite)
    return make_spec(template_id_of(config), config, ARCH, epilogue=case_epilogue(case), hw=HardwareSpec(sm_count=suite.SM_COUNT),
                     a_format=_X_FORMAT[case.torch_x_dtype], b_format="nvfp4", environ={})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "sm90_gpu_check"))
    ap.add_argument("--moe-only", action="store_true", help="build only the grouped MoE kernels")
    args = ap.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import torch  # noqa: F401

    from nvgemm.aot.cache import KernelCache

    suite = _load_suite()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = KernelCache(out)
    entries, built = [], {}
    t0 = time.time()
    failed = 0
    uses = []
    for case in ([] if args.moe_only else suite.all_cases()):
        uses.append((case, case_config(case, suite)))
        if case.config is not None and not case.timed:  # the op path (tests/gpu) runs the policy pick
            policy = dataclasses.replace(case, name=case.name + ".policy", config=None)
            uses.append((policy, case_config(policy, suite)))
    for case, cfg in uses:
        spec = case_spec(case, suite, cfg)
        key = cache.key(spec)
        if key not in built:
            r = cache.ensure(spec)
            built[key] = r
            print(f"{r.status:9s} {r.seconds:6.1f}s  {spec.name()}", flush=True)
            if r.status == "failed":
                failed += 1
                print(f"          {r.error}", flush=True)
        r = built[key]
        entries.append({
            "case": case.to_json(),
            "config": dataclasses.asdict(cfg),
            "spec_name": spec.name(),
            "key": key,
            "entry": str(Path(r.path).relative_to(out)) if r.path else None,
            "status": r.status,
        })
    moe_entries = []
    spec_mod = importlib.util.spec_from_file_location("sm90_moe_suite", ROOT / "bench" / "sm90_moe_suite.py")
    moe_suite = importlib.util.module_from_spec(spec_mod)
    sys.modules["sm90_moe_suite"] = moe_suite
    spec_mod.loader.exec_module(moe_suite)
    for case in moe_suite.moe_cases():
        names = []
        for spec in moe_suite.case_specs(case, environ={}):
            key = cache.key(spec)
            if key not in built:
                r = cache.ensure(spec)
                built[key] = r
                print(f"{r.status:9s} {r.seconds:6.1f}s  {spec.name()}", flush=True)
                failed += r.status == "failed"
            r = built[key]
            names.append({"spec_name": spec.name(), "key": key, "status": r.status,
                          "entry": str(Path(r.path).relative_to(out)) if r.path else None})
        moe_entries.append({"case": case.to_json(), "kernels": names})
    import shutil

    for stale in out.iterdir():  # entries of other source/toolchain fingerprints: never used again
        if stale.is_dir() and stale.name != cache.fid:
            shutil.rmtree(stale)
        elif stale.suffix == ".lock" or (stale.is_file() and stale.name not in ("manifest.json",)):
            stale.unlink()
    (out / "manifest.json").write_text(json.dumps({"fingerprint": cache.fid, "entries": entries,
                                                          "moe_entries": moe_entries}, indent=1))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len(built)} kernels for {len(entries)} cases in {time.time() - t0:.0f}s; {size / 2**20:.1f} MiB in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
