"""Kernel cache on CPU without cutlass: key sensitivity, fingerprint, ABI packing, atomic/corrupt entries.

Builds here use a pure-Python stand-in for ``aot.build_artifacts`` (random bytes as the "library"),
so the cache's locking, publishing and checksum logic is tested in milliseconds; the real
compile -> export -> link path is tested in tests/compile/test_aot.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import torch

from nvgemm.core.epilogue import EpilogueSpec
from nvgemm.aot import artifact as aot, cache as cache_mod
from nvgemm.aot.compile_spec import (
    capture_codegen_env,
    compile_key,
    kernel_source_hash,
    make_spec,
)
from nvgemm.aot.abi import (
    CompileSpec,
    HardwareSpec,
    PointerArg,
    ScalarArg,
    StreamArg,
    SymDim,
    TensorArg,
    abi_from_json,
    abi_to_json,
)
from nvgemm.templates.sm90_w4a16.config import Sm90W4A16Config
from nvgemm.templates.sm100_w4a4.config import Sm100Nvfp4GemmConfig

FID = "f" * 16  # fixed fingerprint id so key tests do not depend on the checkout


def _spec(**kw) -> CompileSpec:
    base = dict(
        template_id="sm100_nvfp4_gemm",
        config=Sm100Nvfp4GemmConfig(),
        epilogue=EpilogueSpec(),
        arch="sm_100a",
        hw=HardwareSpec(sm_count=148, max_active_clusters=0),
        codegen_env=(),
    )
    base.update(kw)
    return CompileSpec(**base)


# ---- key sensitivity ------------------------------------------------------------------------

KEY_CHANGES = {
    "template_id": dict(template_id="sm100_nvfp4_gemm_v2"),
    "config.tile_n": dict(config=Sm100Nvfp4GemmConfig(tile_n=64)),
    "config.swap_ab": dict(config=Sm100Nvfp4GemmConfig(swap_ab=True)),
    "config.split_k": dict(config=Sm100Nvfp4GemmConfig(split_k=2)),
    "config.pdl": dict(config=Sm100Nvfp4GemmConfig(pdl=False)),
    "config.type": dict(config=Sm90W4A16Config()),
    "epilogue.alpha": dict(epilogue=EpilogueSpec(alpha="vector")),
    "epilogue.bias": dict(epilogue=EpilogueSpec(bias=True)),
    "epilogue.activation": dict(epilogue=EpilogueSpec(activation="silu_mul")),
    "epilogue.residual": dict(epilogue=EpilogueSpec(residual=True)),
    "epilogue.out_dtype": dict(epilogue=EpilogueSpec(out_dtype=torch.float16)),
    "arch": dict(arch="sm_103a"),
    "hw.sm_count": dict(hw=HardwareSpec(sm_count=132)),
    "hw.max_active_clusters": dict(hw=HardwareSpec(sm_count=148, max_active_clusters=74)),
    "a_format": dict(a_format="bf16"),
    "b_format": dict(b_format="fp8_e4m3"),
    "a_major": dict(a_major="m"),
    "b_major": dict(b_major="n"),
    "codegen_env": dict(codegen_env=(("NVGEMM_SM100_EPI_TILE", "32"),)),
}


def test_key_is_deterministic_and_hex():
    k1, k2 = compile_key(_spec(), FID), compile_key(_spec(), FID)
    assert k1 == k2 and len(k1) == 64 and int(k1, 16) >= 0


@pytest.mark.parametrize("field", sorted(KEY_CHANGES))
def test_each_key_field_changes_the_key(field):
    assert compile_key(_spec(**KEY_CHANGES[field]), FID) != compile_key(_spec(), FID)


def test_all_key_changes_are_distinct():
    keys = {compile_key(_spec(**kw), FID) for kw in KEY_CHANGES.values()}
    assert len(keys) == len(KEY_CHANGES)


def test_fingerprint_id_changes_the_key():
    assert compile_key(_spec(), "0" * 16) != compile_key(_spec(), FID)


def test_unrelated_things_do_not_change_the_key(monkeypatch):
    k = compile_key(_spec(), FID)
    # An equal spec built separately (field order, fresh objects) keys the same.
    assert compile_key(_spec(config=Sm100Nvfp4GemmConfig(tile_n=128), epilogue=EpilogueSpec()), FID) == k
    # Non-codegen env switches are not captured ...
    env = {"NVGEMM_CACHE_DIR": "/x", "CUTE_DSL_LOG_LEVEL": "10", "CUTE_DSL_ARCH": "sm_90a", "HOME": "/h", "PATH": "/b"}
    assert capture_codegen_env(env) == ()
    # ... so a spec made under them keys like one made under a clean env.
    clean = make_spec("sm100_nvfp4_gemm", Sm100Nvfp4GemmConfig(), "sm_100a", environ={})
    noisy = make_spec("sm100_nvfp4_gemm", Sm100Nvfp4GemmConfig(), "sm_100a", environ=env)
    assert compile_key(clean, FID) == compile_key(noisy, FID)


def test_codegen_env_capture():
    """cutlass-dsl switches by prefix (an unknown one is keyed); nvgemm's only the settings tagged codegen
    (tests/cpu/test_settings.py): an undeclared NVGEMM_* name is read by nothing, so it is not keyed."""
    env = {"NVGEMM_NEW_SWITCH": "1", "CUTE_DSL_LINEINFO": "1", "CUTE_DSL_NEW_SWITCH": "1", "CUTE_DSL_LOG_LEVEL": "20",
           "NVGEMM_CACHE_DIR": "/x", "OTHER": "x"}
    assert capture_codegen_env(env) == (("CUTE_DSL_LINEINFO", "1"), ("CUTE_DSL_NEW_SWITCH", "1"))
    a = make_spec("t", Sm100Nvfp4GemmConfig(), "sm_100a", environ=env)
    b = make_spec("t", Sm100Nvfp4GemmConfig(), "sm_100a", environ={**env, "CUTE_DSL_LINEINFO": "0"})
    assert compile_key(a, FID) != compile_key(b, FID)
    keyed = _spec(codegen_env=(("NVGEMM_SM100_EPI_TILE", "32"),))
    assert keyed.env("NVGEMM_SM100_EPI_TILE") == "32" and keyed.env("NVGEMM_MISSING", "d") == "d"


def test_spec_rejects_bad_fields():
    with pytest.raises(ValueError, match="arch"):
        _spec(arch="sm_75")  # Turing: no nvgemm kernel targets it
    with pytest.raises(TypeError, match="frozen dataclass"):
        _spec(config={"tile_n": 8})
    with pytest.raises(ValueError, match="a_format"):
        _spec(a_format="int4")
    with pytest.raises(ValueError, match="sorted"):
        _spec(codegen_env=(("B", "1"), ("A", "1")))
    with pytest.raises(ValueError, match="sm_count"):
        HardwareSpec(sm_count=0)


def test_kernel_source_hash_walks_the_tree(tmp_path):
    pkg = tmp_path / "nvgemm"
    for d in ("templates", "epilogues", "aot", "core", "dispatch"):
        (pkg / d).mkdir(parents=True)
    (pkg / "templates" / "a.py").write_text("x = 1\n")
    (pkg / "core" / "epilogue.py").write_text("spec = 1\n")
    (pkg / "epilogues" / "b.py").write_text("y = 2\n")
    (pkg / "aot" / "artifact.py").write_text("# shim\n")
    (pkg / "aot" / "selftest.py").write_text("# toy\n")
    h0 = kernel_source_hash.__wrapped__(pkg)
    (pkg / "templates" / "new_kernel.py").write_text("z = 3\n")  # a new file, never hand-listed
    h1 = kernel_source_hash.__wrapped__(pkg)
    (pkg / "epilogues" / "b.py").write_text("y = 3\n")
    h2 = kernel_source_hash.__wrapped__(pkg)
    (pkg / "dispatch" / "unrelated.py").write_text("w = 0\n")  # not a kernel source
    h3 = kernel_source_hash.__wrapped__(pkg)
    (pkg / "core" / "epilogue.py").write_text("spec = 2\n")  # the epilogue spec the kernels read
    h4 = kernel_source_hash.__wrapped__(pkg)
    assert len({h0, h1, h2, h4}) == 4 and h3 == h2


# ---- ABI declarations, header check, argument packing ----------------------------------------

ABI = (
    TensorArg("mA", "Float4E2M1FN", shape=(SymDim(), SymDim(32)), stride=(SymDim(32, 64), 1)),
    TensorArg("mOut", "BFloat16", shape=(SymDim(), 4096), stride=(SymDim(8, 64), 1)),
    ScalarArg("alpha", "float32"),
    ScalarArg("m", "int64"),
    PointerArg("scale", "Float32", assumed_align=4),
    StreamArg("stream"),
)

HEADER = """
typedef struct {
    void *data;
    int32_t dynamic_shapes[2];
    int64_t dynamic_strides[1];
} P_Tensor_mA_t;

typedef struct {
    void *data;
    int32_t dynamic_shapes[1];
    int64_t dynamic_strides[1];
} P_Tensor_mOut_t;

#ifdef __cplusplus
extern "C"
#endif
void _mlir_P__mlir_ciface_cutlass_host_Fake(void **args, int32_t num_args);

static inline int32_t cute_dsl_P_wrapper(P_Kernel_Module_t *module, P_Tensor_mA_t *mA, P_Tensor_mOut_t *mOut, float alpha, int64_t m, void *scale, cudaStream_t stream) {
"""


def test_abi_json_roundtrip():
    assert abi_from_json(json.loads(json.dumps(abi_to_json(ABI)))) == ABI


def test_header_check_accepts_matching_abi():
    parsed = aot.parse_header(HEADER, "P")
    assert parsed["ciface"] == "_mlir_P__mlir_ciface_cutlass_host_Fake"
    aot.check_header_abi(parsed, ABI, "P")


@pytest.mark.parametrize(
    "bad, match",
    [
        (ABI[:-1], "declared ABI has 5 arguments"),
        ((ABI[0], ABI[1], ScalarArg("alpha", "int32")) + ABI[3:], "ABI scalar alpha"),
        ((TensorArg("mA", "Float4E2M1FN", shape=(SymDim(), 64), stride=(SymDim(1, 64), 1)),) + ABI[1:], "ABI tensor mA"),
        ((ABI[1], ABI[0]) + ABI[2:], "expected tensor parameter"),
    ],
    ids=["missing-arg", "scalar-type", "dyn-shape-count", "order"],
)
def test_header_check_rejects_mismatch(bad, match):
    with pytest.raises(aot.AotBuildError, match=match):
        aot.check_header_abi(aot.parse_header(HEADER, "P"), bad, "P")


def test_tensor_struct_layout_matches_c():
    """ctypes twin of {void *data; int32 shapes[2]; int64 strides[1]}: C puts strides at offset 16."""
    s = aot.tensor_struct_type(ABI[0])
    assert ctypes.sizeof(s) == 24 and s.dynamic_shapes.offset == 8 and s.dynamic_strides.offset == 16
    s64 = aot.tensor_struct_type(TensorArg("x", "BFloat16", (SymDim(bits=64),), (1,)))
    assert ctypes.sizeof(s64) == 16 and s64.dynamic_shapes.offset == 8


def test_packed_fp4_binding_doubles_inner_mode():
    w = torch.zeros(6, 64, dtype=torch.uint8)  # N=6 rows of K/2=64 packed bytes -> K=128 FP4
    shape, stride = aot.tensor_layout(ABI[0], w)
    assert shape == [6, 128] and stride == [128, 1]
    with pytest.raises(ValueError, match="divisible by 32"):
        aot.tensor_layout(ABI[0], torch.zeros(6, 8, dtype=torch.uint8))  # K=16 not /32
    with pytest.raises(ValueError, match="mode 1 must be 4096"):
        aot.tensor_layout(ABI[1], torch.zeros(8, 2048, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="2-D"):
        aot.tensor_layout(ABI[1], torch.zeros(4096, dtype=torch.bfloat16))


def test_pack_fills_slots_per_calling_convention():
    k = aot.AotKernel.packer(ABI, "t")  # packing only; no library needed
    a = torch.zeros(3, 64, dtype=torch.uint8)
    out = torch.zeros(16, 4096, dtype=torch.bfloat16)[:5]
    scale = torch.ones(1)
    slots, keep = k.pack(a, out, 0.5, 7, scale, 0xABC0, check_device=False)
    assert len(slots) == len(ABI) + 1
    sa = ctypes.cast(slots[0], ctypes.POINTER(k._structs["mA"])).contents
    assert (sa.data, list(sa.dynamic_shapes), list(sa.dynamic_strides)) == (a.data_ptr(), [3, 128], [128])
    so = ctypes.cast(slots[1], ctypes.POINTER(k._structs["mOut"])).contents
    assert (so.data, list(so.dynamic_shapes), list(so.dynamic_strides)) == (out.data_ptr(), [5], [4096])
    assert ctypes.cast(slots[2], ctypes.POINTER(ctypes.c_float)).contents.value == 0.5
    assert ctypes.cast(slots[3], ctypes.POINTER(ctypes.c_int64)).contents.value == 7
    assert ctypes.cast(slots[4], ctypes.POINTER(ctypes.c_void_p)).contents.value == scale.data_ptr()
    assert ctypes.cast(slots[5], ctypes.POINTER(ctypes.c_void_p)).contents.value == 0xABC0
    assert ctypes.cast(slots[6], ctypes.POINTER(ctypes.c_int32)).contents.value == 0
    # Refilled in place per call; another thread packs into its own buffers.
    slots2, _ = k.pack(a[:2], out, 2.0, 9, None, 0x10, check_device=False)
    assert ctypes.addressof(slots2) == ctypes.addressof(slots)
    assert ctypes.cast(slots[0], ctypes.POINTER(k._structs["mA"])).contents.dynamic_shapes[0] == 2
    assert ctypes.cast(slots[3], ctypes.POINTER(ctypes.c_int64)).contents.value == 9
    assert ctypes.cast(slots[4], ctypes.POINTER(ctypes.c_void_p)).contents.value is None  # NULL pointer
    other = []
    t = threading.Thread(target=lambda: other.append(k.pack(a, out, 0.5, 7, scale, 0, check_device=False)[0]))
    t.start()
    t.join()
    assert ctypes.addressof(other[0]) != ctypes.addressof(slots)
    assert ctypes.cast(slots[3], ctypes.POINTER(ctypes.c_int64)).contents.value == 9  # untouched by the thread
    with pytest.raises(ValueError, match="CUDA tensor"):
        k.pack(a, out, 0.5, 7, scale, 0)
    with pytest.raises(TypeError, match="takes 6 arguments"):
        k.pack(a, out, check_device=False)


def test_pack_rebinds_a_descriptor_only_when_its_tensor_changed():
    """The same tensor object at the same pointer / shape / strides keeps its descriptor (no refill); the same
    object re-pointed or reshaped in place, or another tensor, is bound anew and checked again."""
    k = aot.AotKernel.packer(ABI, "t")
    a = torch.zeros(3, 64, dtype=torch.uint8)
    out = torch.zeros(16, 4096, dtype=torch.bfloat16)
    slots, _ = k.pack(a, out, 0.5, 7, None, 0, check_device=False)
    mA = ctypes.cast(slots[0], ctypes.POINTER(k._structs["mA"])).contents
    mA.dynamic_shapes[0] = 999  # a refill would overwrite this
    k.pack(a, out, 0.5, 7, None, 0, check_device=False)
    assert mA.dynamic_shapes[0] == 999  # same tensor, unchanged: not refilled
    a.set_(torch.zeros(5, 64, dtype=torch.uint8).untyped_storage(), 0, (5, 64), (64, 1))  # re-pointed in place
    k.pack(a, out, 0.5, 7, None, 0, check_device=False)
    assert (mA.data, mA.dynamic_shapes[0]) == (a.data_ptr(), 5)
    b = torch.zeros(2, 64, dtype=torch.uint8)
    k.pack(b, out, 0.5, 7, None, 0, check_device=False)
    assert (mA.data, mA.dynamic_shapes[0]) == (b.data_ptr(), 2)
    with pytest.raises(ValueError, match="CUDA tensor"):  # the check is not skipped for a bound tensor
        k.pack(b, out, 0.5, 7, None, 0)


# ---- cache entries with a stand-in builder -----------------------------------------------------


def fake_build(spec, out_dir, key):
    """Stand-in for aot.build_artifacts: deterministic bytes per key, records who built what."""
    out_dir = Path(out_dir)
    payload = key.encode() * 2000
    for name in cache_mod.ENTRY_FILES:
        (out_dir / name).write_bytes(name.encode() + payload)
    log = os.environ.get("NVGEMM_TEST_BUILD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {key}\n")
    return {"abi_version": aot.AOT_ABI_VERSION, "abi": abi_to_json(ABI), "prefix": "p", "launcher_symbol": "s",
            "kernel_name": spec.name(), "timings_s": {"compile": 0.0, "export": 0.0, "link": 0.0}}


@pytest.fixture
def kc(tmp_path, monkeypatch):
    monkeypatch.setattr(aot, "build_artifacts", fake_build)
    monkeypatch.setattr(cache_mod, "_dsl_available", lambda: True)
    return cache_mod.KernelCache(tmp_path / "kc")


def test_cache_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("NVGEMM_CACHE_DIR", str(tmp_path / "x"))
    assert cache_mod.default_cache_dir() == tmp_path / "x"
    monkeypatch.delenv("NVGEMM_CACHE_DIR")
    repo = Path(cache_mod.__file__).resolve().parents[3]
    want = repo / "kernels_cache" if (repo / "kernels_cache").is_dir() else None
    got = cache_mod.default_cache_dir()
    assert got == want if want else got.parts[-2:] == ("nvgemm", "kernels")


def test_ensure_compiles_once_then_hits(kc):
    s = _spec()
    r1, r2 = kc.ensure(s), kc.ensure(s)
    assert (r1.status, r2.status) == ("compiled", "cached") and r1.key == r2.key
    d = kc.fp_dir() / r1.key
    assert sorted(p.name for p in d.iterdir()) == sorted((*cache_mod.ENTRY_FILES, "meta.json"))
    assert json.loads((kc.fp_dir() / "fingerprint.json").read_text())["kernel_sources"] == kc.fingerprint_info["kernel_sources"]
    assert not [p for p in kc.fp_dir().iterdir() if p.name.startswith((".build", ".trash"))]
    assert kc.stats["compiled"] == 1


def _corrupt_truncate(p: Path):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _corrupt_flip(p: Path):
    data = bytearray(p.read_bytes())
    data[len(data) // 3] ^= 0x10
    p.write_bytes(bytes(data))


def _corrupt_meta_value(p: Path):
    doc = json.loads(p.read_text())
    doc["payload"]["prefix"] = "q"  # still valid JSON, wrong content
    p.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "file, damage",
    [("kernel.so", _corrupt_truncate), ("kernel.so", _corrupt_flip), ("meta.json", _corrupt_flip),
     ("meta.json", _corrupt_meta_value), ("meta.json", _corrupt_truncate)],
    ids=["so-truncated", "so-flipped", "meta-flipped", "meta-edited", "meta-truncated"],
)
def test_corrupt_entry_is_detected_reported_once_and_rebuilt(kc, file, damage):
    s = _spec()
    r = kc.ensure(s)
    d = kc.fp_dir() / r.key
    good = (d / "kernel.so").read_bytes()
    damage(d / file)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r2 = kc.ensure(s)
        damage(d / file)  # damaged again: rebuilt again, but not reported a second time
        r3 = kc.ensure(s)
    assert (r2.status, r3.status) == ("compiled", "compiled")
    msgs = [str(x.message) for x in w if "corrupt kernel cache entry" in str(x.message)]
    assert len(msgs) == 1, msgs
    assert kc.stats["corrupt"] == 2
    assert (d / "kernel.so").read_bytes() == good
    assert kc.read_entry(d, r.key, kc.fid, full=True)["key"] == r.key


def test_version_mismatch_is_a_miss_not_a_crash(kc):
    s = _spec()
    r = kc.ensure(s)
    mp = kc.fp_dir() / r.key / "meta.json"
    doc = json.loads(mp.read_text())
    doc["payload"]["abi_version"] = 999
    doc["sha256"] = cache_mod._meta_digest(doc["payload"])  # a consistent entry from a future nvgemm
    mp.write_text(json.dumps(doc))
    assert kc.lookup(s) is None
    # Another fingerprint (other cutlass-dsl/CUDA/Python or kernel sources) is another directory.
    other = cache_mod.KernelCache(kc.root)
    other.fid = "0" * 16
    assert other.lookup(s) is None


def test_load_only_mode_accepts_other_toolchain_with_same_sources(kc, monkeypatch):
    s = _spec()
    kc.ensure(s)
    serving = cache_mod.KernelCache(kc.root)
    serving.fid = "1" * 16  # this box's id differs (no cutlass-dsl -> version None)
    serving.fingerprint_info = {**kc.fingerprint_info, "cutlass_dsl": None}
    assert serving.lookup(s) is not None
    serving.fingerprint_info = {**serving.fingerprint_info, "kernel_sources": "other"}
    assert serving.lookup(s) is None
    monkeypatch.setattr(cache_mod, "_dsl_available", lambda: False)
    r = serving.ensure(_spec(arch="sm_103a"))
    assert r.status == "failed" and "nvgemm precompile" in r.error


def test_build_failure_is_reported_not_raised(kc, monkeypatch):
    def boom(spec, out_dir, key):
        raise aot.AotBuildError("link failed: no gcc")

    monkeypatch.setattr(aot, "build_artifacts", boom)
    r = kc.ensure(_spec())
    assert r.status == "failed" and "no gcc" in r.error
    assert not [p for p in kc.fp_dir().iterdir() if p.is_dir()]


CONCURRENT = textwrap.dedent(
    """
    import sys, json
    from nvgemm.aot import artifact as aot, cache
    sys.path.insert(0, {testdir!r})
    from test_cache import fake_build, _spec, KEY_CHANGES
    import time
    def slow_build(spec, out_dir, key):
        time.sleep(0.05)  # widen the race window
        return fake_build(spec, out_dir, key)
    aot.build_artifacts = slow_build
    cache._dsl_available = lambda: True
    kc = cache.KernelCache({root!r})
    specs = [_spec(**KEY_CHANGES[f]) for f in sorted(KEY_CHANGES)[:6]] + [_spec()]
    out = [kc.ensure(s).status for s in (specs if {idx} % 2 else specs[::-1])]
    print(json.dumps(out))
    """
)


def test_four_processes_fill_the_same_keys_once(tmp_path):
    log = tmp_path / "builds.log"
    env = {**os.environ, "NVGEMM_TEST_BUILD_LOG": str(log)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT.format(testdir=str(Path(__file__).parent), root=str(tmp_path / "kc"), idx=i)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    statuses = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    built = [line.split()[1] for line in log.read_text().splitlines()]
    assert len(built) == 7 == len(set(built)), built  # every key compiled exactly once
    assert sum(s.count("compiled") for s in statuses) == 7
    assert all(st in ("compiled", "cached") for s in statuses for st in s)
    kc = cache_mod.KernelCache(tmp_path / "kc")
    fps = [p.parent for p in (tmp_path / "kc").glob("*/fingerprint.json")]
    assert len(fps) == 1  # all four processes computed one fingerprint
    fp = fps[0]
    entries = [d for d in fp.iterdir() if d.is_dir()]
    assert len(entries) == 7
    for d in entries:
        assert kc.read_entry(d, d.name, fp.name, full=True)["key"] == d.name
    assert not [p for p in fp.iterdir() if p.name.startswith((".build", ".trash", ".fingerprint"))]


def test_get_loads_once_and_respects_build_false(kc, monkeypatch):
    made = []

    class FakeKernel:
        def __init__(self, path, abi, name="", image=None):
            made.append((Path(path).name, abi, name))
            assert image == (Path(path)).read_bytes()  # the verified bytes are handed over

    monkeypatch.setattr(aot, "AotKernel", FakeKernel)
    s = _spec()
    with pytest.raises(cache_mod.CacheMiss):
        kc.get(s, build=False)
    k1 = kc.get(s)
    k2 = kc.get(_spec())  # an equal spec object
    assert k1 is k2 and len(made) == 1
    assert made[0] == ("kernel.so", ABI, s.name()) and kc.stats["compiled"] == 1
    fresh = cache_mod.KernelCache(kc.root)  # another process: loads from disk, compiles nothing
    fresh.get(s, build=False)
    assert fresh.stats == {"compiled": 0, "loaded": 1, "corrupt": 0, "miss": 0}


def test_build_refuses_spec_captured_under_other_dsl_switches(monkeypatch):
    monkeypatch.delenv("CUTE_DSL_LINEINFO", raising=False)
    spec = _spec(codegen_env=(("CUTE_DSL_LINEINFO", "1"),))
    with pytest.raises(aot.AotBuildError, match="CUTE_DSL_LINEINFO"):
        aot.build_artifacts(spec, Path("/nonexistent"), "0" * 64)
