"""NVIDIA's published CuTeDSL Blackwell tutorial kernels, run on nvgemm's PTX emulator (issue 21 item 4).

The examples are not part of this repository: fetch NVIDIA/cutlass and pass its ``examples/python/CuTeDSL``
folder. Each example's own host function / kernel class is wrapped, unchanged, in a ``@cute.jit`` entry with
static shapes, compiled AOT for sm_100a through a bench-only kernel template (as tests/emulator/
test_isa_cute_tma_nvfp4.py does for its programs), launched through the emulator's fake CUDA runtime and
compared with torch on exact data (fp16 GEMMs: integers in [-2, 1]; NVFP4: E2M1 codes x power-of-two scales
<= 1, fp16 output of exact fp32 sums; TMA copy / transposes: raw fp16 bit patterns). Prints a markdown table.

    git clone https://github.com/NVIDIA/cutlass  # the run in bench/results/emulator_sweep.md: 7107b0553
    python bench/emulator_nvidia_examples.py --examples cutlass/examples/python/CuTeDSL [--only fp16_gemm_0,...]
"""


import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "emulator"))

import torch  # noqa: E402

# no "from __future__ import annotations": CuTeDSL resolves the entries' annotations when they are defined

TUT = "cute.blackwell.tutorial"
#: example -> (module, kind, problem shape): kind "gemm" (A, B, C fp16; host_function(a, b, c[, clusters])),
#: "nvfp4" (kernel class called with pointers and (M, N, K, 1)), "copy" / "transpose" (src, dst fp16)
EXAMPLES = {
    "fp16_gemm_0": (f"{TUT}.tutorial_gemm.fp16_gemm_0", "gemm", (128, 256, 128)),
    "fp16_gemm_1": (f"{TUT}.tutorial_gemm.fp16_gemm_1", "gemm", (256, 256, 128)),
    "fp16_gemm_2": (f"{TUT}.tutorial_gemm.fp16_gemm_2", "gemm", (256, 256, 128)),
    "fp16_gemm_3": (f"{TUT}.tutorial_gemm.fp16_gemm_3", "gemm_persistent", (512, 512, 128)),
    "fp16_gemm_3_1": (f"{TUT}.tutorial_gemm.fp16_gemm_3_1", "gemm_persistent", (512, 512, 128)),
    "fp16_gemm_5": (f"{TUT}.tutorial_gemm.fp16_gemm_5", "gemm_persistent", (512, 256, 128)),
    "nvfp4_gemm_0": (f"{TUT}.tutorial_gemm.nvfp4_gemm_0", "nvfp4", (128, 256, 512)),
    "nvfp4_gemm_1": (f"{TUT}.tutorial_gemm.nvfp4_gemm_1", "nvfp4", (256, 256, 512)),
    "tma_v0": (f"{TUT}.tutorial_tma.tma_v0", "copy", (256, 384)),
    "tma_v1": (f"{TUT}.tutorial_tma.tma_v1", "transpose", (256, 384)),
    "tma_v2": (f"{TUT}.tutorial_tma.tma_v2", "transpose_persistent", (256, 384)),
}
CLASSES = {"nvfp4": "Sm100BlockScaledDenseGemmKernel", "tma_v0": "Sm100SimpleCopyKernel",
           "tma_v1": "Sm100MatrixTransposeKernelV1", "tma_v2": "Sm100MatrixTransposeKernelV2"}


def entry(name: str):
    """The ``@cute.jit`` entry of one example (pointers + stream, static shapes)."""
    import importlib

    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    mod_name, kind, shape = EXAMPLES[name]
    mod = importlib.import_module(mod_name)

    def mk(p, r, c):
        return cute.make_tensor(p, cute.make_layout((r, c), stride=(c, 1)))

    if kind.startswith("gemm"):
        m, n, k = shape

        @cute.jit
        def run_gemm(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer, stream: cuda.CUstream):
            if cutlass.const_expr(kind == "gemm"):
                mod.host_function(mk(a, m, k), mk(b, n, k), mk(c, m, n))
            else:  # persistent: 2 active clusters, so the tile scheduler loops
                mod.host_function(mk(a, m, k), mk(b, n, k), mk(c, m, n), 2)
        return run_gemm
    if kind == "nvfp4":
        cls = getattr(mod, CLASSES["nvfp4"])

        @cute.jit
        def run_nvfp4(a: cute.Pointer, b: cute.Pointer, sfa: cute.Pointer, sfb: cute.Pointer, c: cute.Pointer,
                      stream: cuda.CUstream):
            cls()(a, b, sfa, sfb, c, (*shape, 1), stream)
        return run_nvfp4
    cls = getattr(mod, CLASSES[name])
    m, n = shape

    @cute.jit
    def run_copy(a: cute.Pointer, b: cute.Pointer, stream: cuda.CUstream):
        if cutlass.const_expr(kind == "copy"):
            cls()(mk(a, m, n), mk(b, m, n))
        elif cutlass.const_expr(kind == "transpose"):
            cls()(mk(a, m, n), mk(b, n, m))
        else:
            cls()(mk(a, m, n), mk(b, n, m), 2)
    return run_copy


@dataclass(frozen=True)
class ExampleConfig:
    example: str
    source_sha: str  # of the example's file: an updated checkout is rebuilt, not served from the kernel cache

    def name(self) -> str:
        return f"nvidia_example_{self.example}_{self.source_sha}"


class ExampleTemplate:
    """Bench-only template around one NVIDIA example entry (never proposed by nvgemm's heuristics)."""

    template_id = "nvidia_cutedsl_example"
    config_type = ExampleConfig
    archs = ("sm_100a",)

    def can_implement(self, spec):
        from nvgemm.templates.status import Status

        return Status.success()

    def abi(self, spec):
        from nvgemm.templates.registry import PointerArg, StreamArg

        kind = EXAMPLES[spec.config.example][1]
        if kind == "nvfp4":
            return (PointerArg("a", "Float4E2M1FN"), PointerArg("b", "Float4E2M1FN"), PointerArg("sfa", "Float8E4M3FN"),
                    PointerArg("sfb", "Float8E4M3FN"), PointerArg("c", "Float16"), StreamArg())
        if kind.startswith("gemm"):
            return (PointerArg("a", "Float16"), PointerArg("b", "Float16"), PointerArg("c", "Float16"), StreamArg())
        return (PointerArg("a", "Float16"), PointerArg("b", "Float16"), StreamArg())  # source, destination

    def compile(self, spec, *, keep_ptx: bool = False):
        from nvgemm.templates.registry import compile_for_target, fake_args

        return compile_for_target(entry(spec.config.example), fake_args(self.abi(spec)), spec,
                                  "--keep-ptx" if keep_ptx else "")


def run(name: str) -> tuple[str, float, int]:
    """(verdict, seconds, warp-instructions) of one example on the emulator."""
    from test_isa_cute_tma_nvfp4 import blocked_sf, e2m1_values

    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.emulator.runner import prepare

    import hashlib
    import importlib.util

    mod_name, kind, shape = EXAMPLES[name]
    sha = hashlib.sha256(Path(importlib.util.find_spec(mod_name).origin).read_bytes()).hexdigest()[:16]
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    k = prepare(make_spec(ExampleTemplate.template_id, ExampleConfig(name, sha), "sm_100a"))
    if kind.startswith("gemm"):
        m, n, kk = shape
        a = torch.randint(-2, 2, (m, kk), generator=g).half()
        b = torch.randint(-2, 2, (n, kk), generator=g).half()
        out = torch.full((m, n), float("nan")).half()
        launch = k.launch(a, b, out, 0)
        ref = (a.double() @ b.double().T).half()
    elif kind == "nvfp4":
        m, n, kk = shape
        pw = torch.tensor([0x28, 0x30, 0x38], dtype=torch.uint8)  # 0.25, 0.5, 1: sums stay below fp16's max
        a = torch.randint(0, 256, (m, kk // 2), generator=g, dtype=torch.uint8)
        b = torch.randint(0, 256, (n, kk // 2), generator=g, dtype=torch.uint8)
        sfa = pw[torch.randint(0, 3, (m, kk // 16), generator=g)].view(torch.float8_e4m3fn)
        sfb = pw[torch.randint(0, 3, (n, kk // 16), generator=g)].view(torch.float8_e4m3fn)
        out = torch.full((m, n), float("nan")).half()
        launch = k.launch(a, b, blocked_sf(sfa), blocked_sf(sfb), out, 0)
        av = e2m1_values(a) * sfa.double().repeat_interleave(16, dim=1)
        bv = e2m1_values(b) * sfb.double().repeat_interleave(16, dim=1)
        ref = (av @ bv.T).float().half()
    else:
        m, n = shape
        a = torch.randint(-30000, 30000, (m, n), generator=g, dtype=torch.int16).view(torch.float16)
        a[a.isnan()] = 1.0
        out = torch.zeros((m, n) if kind == "copy" else (n, m), dtype=torch.float16)
        launch = k.launch(a, out, 0)
        ref = a if kind == "copy" else a.T.contiguous()
    same = torch.equal(out.view(torch.int16), ref.view(torch.int16))
    return ("bit-exact" if same else "MISMATCH"), time.perf_counter() - t0, launch.stats.get("warp_instructions", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", required=True, help="NVIDIA/cutlass examples/python/CuTeDSL folder")
    ap.add_argument("--only", default="", help="comma-separated example names (default: all)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.examples).resolve()))
    from nvgemm.templates.registry import register_template

    register_template(ExampleTemplate(), replace=True)
    names = [n for n in (args.only.split(",") if args.only else EXAMPLES)]
    print("| example | problem | result | s | warp-instr |\n|---|---|---|---:|---:|")
    for name in names:
        try:
            verdict, s, wi = run(name)
        except Exception as e:  # an unmodelled instruction stops the launch by name: report it
            verdict, s, wi = f"stopped: {type(e).__name__}: {str(e).splitlines()[0][:160]}", 0.0, 0
            traceback.print_exc(file=sys.stderr)
        print(f"| {name} | {EXAMPLES[name][2]} | {verdict} | {s:.1f} | {wi} |", flush=True)


if __name__ == "__main__":
    main()
