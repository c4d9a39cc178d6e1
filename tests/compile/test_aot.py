"""AOT kernel entries built for real on a GPU-less host: compile -> export_to_c -> gcc -shared -> ctypes.

Uses the selftest template (``nvgemm.aot.selftest``, id ``selftest_scale``): one argument
of every ABI kind. Loading is checked in a subprocess where ``import cutlass`` fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile_only
pytest.importorskip("cutlass")

from nvgemm.core.epilogue import EpilogueSpec  # noqa: E402
from nvgemm.aot import artifact as aot  # noqa: E402
from nvgemm.aot import selftest as st  # noqa: E402
from nvgemm.aot.cache import KernelCache  # noqa: E402
from nvgemm.aot.compile_spec import DSL_NON_CODEGEN_ENV, make_spec  # noqa: E402
from nvgemm.aot.abi import ScalarArg, register_template, unregister_template  # noqa: E402

ARCHS = ("sm_90a", "sm_100a")


def _spec(arch: str, threads: int = 128):
    return make_spec(st.SELFTEST_TEMPLATE_ID, st.SelftestConfig(threads=threads), arch,
                     a_format="bf16", b_format="bf16")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    kc = KernelCache(tmp_path_factory.mktemp("kc"))
    res = {arch: kc.ensure(_spec(arch)) for arch in ARCHS}
    return kc, res


@pytest.mark.parametrize("arch", ARCHS)
def test_entry_builds_for_arch_on_cpu(built, arch):
    kc, res = built
    r = res[arch]
    assert r.status == "compiled", r.error
    obj = (r.path / "kernel.o").read_bytes()
    other = ({"sm_90a", "sm_100a"} - {arch}).pop()
    assert arch.encode() in obj and other.encode() not in obj  # the embedded cubin targets `arch`
    so = r.path / "kernel.so"
    assert 4_000 < so.stat().st_size < 1_000_000
    meta = kc.read_entry(r.path, r.key, kc.fid, full=True)
    assert [a["name"] for a in meta["abi"]] == ["mA", "mOut", "alpha", "scale", "stream"]
    assert meta["launcher_symbol"].startswith(f"_mlir_{meta['prefix']}__mlir_ciface_")
    # The library needs only the CUDA runtime (plus libc/libstdc++), never the DSL.
    deps = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
    assert "libcudart.so.13" in deps and "cute_dsl" not in deps and "cutlass" not in deps


def test_second_ensure_is_a_hit(built):
    kc, res = built
    for arch in ARCHS:
        assert kc.ensure(_spec(arch)).status == "cached"


LOADER = textwrap.dedent(
    """
    import json, sys, time
    for m in ("cutlass", "nvidia_cutlass_dsl"):
        sys.modules[m] = None  # `import cutlass` raises ImportError; find_spec says "not installed"
    import torch
    from nvgemm.aot.cache import KernelCache
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.aot.selftest import SELFTEST_TEMPLATE_ID, SelftestConfig, run_selftest
    try:
        import cutlass
        raise SystemExit("cutlass import was not blocked")
    except ImportError:
        pass
    kc = KernelCache({root!r})
    out = {{}}
    for arch in {archs!r}:
        spec = make_spec(SELFTEST_TEMPLATE_ID, SelftestConfig(threads=128), arch, a_format="bf16", b_format="bf16")
        t0 = time.perf_counter()
        k = kc.get(spec, build=False)
        ms = (time.perf_counter() - t0) * 1e3
        syms = [hasattr(k._lib, s) for s in ("nvgemm_aot_abi_version", "nvgemm_aot_load", "nvgemm_aot_launch")]
        a = torch.zeros(3, 40, dtype=torch.bfloat16)
        slots, keep = k.pack(a, a, 1.0, torch.ones(1), 0, check_device=False)
        res = {{"load_ms": ms, "symbols": syms, "packed_shape": list(keep[0].dynamic_shapes)}}
        if torch.cuda.is_available():
            res["gpu_max_err"] = run_selftest(k)
        else:
            try:
                k.ensure_loaded()
                res["load_error"] = None
            except RuntimeError as e:
                res["load_error"] = str(e)
        out[arch] = res
    out["cutlass_modules"] = [m for m, v in sys.modules.items() if "cutlass" in m and v is not None]
    print(json.dumps(out))
    """
)


def test_entries_load_where_cutlass_cannot_be_imported(built):
    kc, _ = built
    r = subprocess.run([sys.executable, "-c", LOADER.format(root=str(kc.root), archs=ARCHS)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cutlass_modules"] == []
    for arch in ARCHS:
        assert out[arch]["symbols"] == [True, True, True]
        assert out[arch]["packed_shape"] == [3, 40]
        if "gpu_max_err" in out[arch]:
            assert out[arch]["gpu_max_err"] == 0.0  # same fp32 ops, one bf16 rounding: bit-exact
        else:  # no GPU: the cubin load fails cleanly with a CUDA error code, no crash
            assert "cudaError" in out[arch]["load_error"]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_real_entry_damage_is_detected_and_rebuilt(tmp_path, damage):
    kc = KernelCache(tmp_path / "kc")
    spec = _spec("sm_100a", threads=64)
    r = kc.ensure(spec)
    so = r.path / "kernel.so"
    good = so.read_bytes()
    data = bytearray(good)
    if damage == "truncate":
        data = data[: len(data) - 1000]
    else:
        data[len(data) // 2] ^= 0x01
    so.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r2 = kc.ensure(spec)
    assert r2.status == "compiled"
    assert sum("corrupt kernel cache entry" in str(x.message) for x in w) == 1
    kc.read_entry(r2.path, r2.key, kc.fid, full=True)  # valid again
    assert hasattr(aot.AotKernel(so, ()) ._lib, "nvgemm_aot_launch")


class _WrongAbi(st.SelftestScaleTemplate):
    template_id = "selftest_wrong_abi"

    def abi(self, spec):
        good = super().abi(spec)
        return good[:2] + (ScalarArg("alpha", "int32"),) + good[3:]  # the kernel takes Float32


def test_abi_that_disagrees_with_the_kernel_fails_to_build(tmp_path):
    register_template(_WrongAbi(), replace=True)
    try:
        spec = dataclasses.replace(_spec("sm_90a"), template_id="selftest_wrong_abi")
        r = KernelCache(tmp_path / "kc").ensure(spec)
    finally:
        unregister_template("selftest_wrong_abi")
    assert r.status == "failed"
    assert "ABI scalar alpha: expected 'int32_t alpha', header has 'float alpha'" in r.error


def test_precompile_cli_selftest_then_warm_rerun_compiles_nothing(tmp_path, capsys):
    from nvgemm.cli import main

    argv = ["precompile", "--selftest", "--arch", "sm_90a", "--jobs", "1", "--quiet",
            "--cache-dir", str(tmp_path / "kc"), "--json", str(tmp_path / "s.json")]
    assert main(argv) == 0
    first = json.loads((tmp_path / "s.json").read_text())
    assert first["counts"] == {"compiled": 2}
    assert main(argv) == 0
    second = json.loads((tmp_path / "s.json").read_text())
    assert second["counts"] == {"cached": 2}
    assert "compiled 0, cached 2, failed 0" in capsys.readouterr().out


def test_non_codegen_env_list_agrees_with_cutlass():
    """Every CUTE_DSL_* switch nvgemm leaves out of the key is one cutlass-dsl itself declares
    `affects_compile=False` (ARCH excepted: nvgemm always passes --gpu-arch, see the slow test)."""
    import inspect

    from cutlass.base_dsl import env_manager as em

    declared = {}
    for cls in vars(em).values():
        if inspect.isclass(cls):
            for v in vars(cls).values():
                if isinstance(v, em.EnvVar) and isinstance(v.source, str):
                    declared[f"CUTE_DSL_{v.source}"] = v.affects_compile
    undeclared_ok = {"CUTE_DSL_LIBS", "CUTE_DSL_KEEP", "CUTE_DSL_KEEP_IR", "CUTE_DSL_KEEP_PTX",
                     "CUTE_DSL_KEEP_CUBIN", "CUTE_DSL_KEEP_SASS"}
    for name in sorted(DSL_NON_CODEGEN_ENV):
        if name == "CUTE_DSL_ARCH":
            continue
        if name in declared:
            assert declared[name] is False, f"{name} changes code generation per cutlass-dsl; it must be keyed"
        else:
            assert name in undeclared_ok, f"{name} is not a cutlass-dsl setting; remove it from DSL_NON_CODEGEN_ENV"
    # Every codegen-affecting declared switch would be captured by the prefix rule.
    assert all(n not in DSL_NON_CODEGEN_ENV for n, affects in declared.items() if affects and n != "CUTE_DSL_ARCH")


CONCURRENT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"  # must not matter: nvgemm passes --gpu-arch spec.arch
    from nvgemm.aot.cache import KernelCache
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.aot.selftest import SELFTEST_TEMPLATE_ID, SelftestConfig
    kc = KernelCache({root!r})
    specs = [make_spec(SELFTEST_TEMPLATE_ID, SelftestConfig(threads=t), a, a_format="bf16", b_format="bf16")
             for a in ("sm_90a", "sm_100a") for t in (64, 128)]
    print(json.dumps([kc.ensure(s).status for s in (specs if {idx} % 2 else specs[::-1])]))
    """
)


def test_four_processes_compile_each_real_kernel_once(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT.format(root=str(tmp_path / "kc"), idx=i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    statuses = [s for o in outs for s in json.loads(o[0].strip().splitlines()[-1])]
    assert statuses.count("compiled") == 4 and statuses.count("cached") == 12
    kc = KernelCache(tmp_path / "kc")
    entries = [d for d in kc.fp_dir().iterdir() if d.is_dir()]
    assert len(entries) == 4
    for d in entries:
        meta = kc.read_entry(d, d.name, kc.fid, full=True)
        obj = (d / "kernel.o").read_bytes()
        assert meta["spec"]["arch"].encode() in obj  # CUTE_DSL_ARCH=sm_90a did not leak into sm_100a builds
        if meta["spec"]["arch"] == "sm_100a":
            assert b"sm_90a" not in obj
