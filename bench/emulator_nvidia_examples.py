"""NVIDIA's published CuTeDSL Blackwell tutorial kernels, run on nvgemm's PTX emulator (issue 21 item 4).

The examples are not part of this repository: fetch NVIDIA/cutlass and pass its ``examples/python/CuTeDSL``
folder. Each example's own host function / kernel class is wrapped, unchanged, in a ``@cute.jit`` entry with
static shapes, compiled AOT for sm_100a through a bench-only kernel template (as tests/emulator/
test_isa_cute_tma_nvfp4.py does for its programs), launched through the emulator's fake CUDA runtime and
compared with torch on exact data (fp16 GEMMs: integers in [-2, 1]; NVFP4: E2M1 codes x power-of-two scales
<= 1, fp16 output of exact fp32 sums; TMA copy / transposes: raw fp16 bit patterns). Each example runs under
three cluster schedules (:data:`SCHEDULES`), all of which must match: serial in launch order (a cluster launch
control kernel's first cluster steals every other one), two clusters resident in reverse order, and the whole
grid resident in a shuffled order (every try_cancel fails); a launch with a preferred cluster shape (fp16_gemm_4)
runs all preferred, mixed, and all fallback. Prints a markdown table.

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
    "fp16_gemm_4": (f"{TUT}.tutorial_gemm.fp16_gemm_4", "gemm_preferred", (512, 1024, 128)),
    "fp16_gemm_5": (f"{TUT}.tutorial_gemm.fp16_gemm_5", "gemm_persistent", (512, 256, 128)),
    "fp16_gemm_6": (f"{TUT}.tutorial_gemm.fp16_gemm_6", "gemm_dequant", (512, 256, 128)),
    "nvfp4_gemm_0": (f"{TUT}.tutorial_gemm.nvfp4_gemm_0", "nvfp4", (128, 256, 512)),
    "nvfp4_gemm_1": (f"{TUT}.tutorial_gemm.nvfp4_gemm_1", "nvfp4", (256, 256, 512)),
    "tma_v0": (f"{TUT}.tutorial_tma.tma_v0", "copy", (256, 384)),
    "tma_v1": (f"{TUT}.tutorial_tma.tma_v1", "transpose", (256, 384)),
    "tma_v2": (f"{TUT}.tutorial_tma.tma_v2", "transpose_persistent", (256, 384)),
}
DEQUANT_SCALE = 0.5  # fp16_gemm_6: B = int8 codes x 0.5, exact in fp16
#: (queue order, resident clusters (None: the whole grid), preferred-cluster regions: all / none / mixed by a seed)
SCHEDULES = (("forward", 1, "all"), ("reverse", 2, 3), (7, None, "none"))
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

    if kind.startswith("gemm") and kind != "gemm_dequant":
        m, n, k = shape

        @cute.jit
        def run_gemm(a: cute.Pointer, b: cute.Pointer, c: cute.Pointer, stream: cuda.CUstream):
            if cutlass.const_expr(kind == "gemm"):
                mod.host_function(mk(a, m, k), mk(b, n, k), mk(c, m, n))
            elif cutlass.const_expr(kind == "gemm_preferred"):  # 2 active clusters of each shape
                mod.host_function(mk(a, m, k), mk(b, n, k), mk(c, m, n), 2, 2)
            else:  # persistent: 2 active clusters, so the tile scheduler loops
                mod.host_function(mk(a, m, k), mk(b, n, k), mk(c, m, n), 2)
        return run_gemm
    if kind == "gemm_dequant":
        m, n, k = shape

        @cute.jit
        def run_dequant(a: cute.Pointer, bq: cute.Pointer, b: cute.Pointer, c: cute.Pointer, stream: cuda.CUstream):
            mod.host_function(mk(a, m, k), mk(bq, n, k), mk(b, n, k), mk(c, m, n), DEQUANT_SCALE, 2, stream)
        return run_dequant
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
        if kind == "gemm_dequant":
            return (PointerArg("a", "Float16"), PointerArg("bq", "Int8"), PointerArg("b", "Float16"),
                    PointerArg("c", "Float16"), StreamArg())
        if kind.startswith("gemm"):
            return (PointerArg("a", "Float16"), PointerArg("b", "Float16"), PointerArg("c", "Float16"), StreamArg())
        return (PointerArg("a", "Float16"), PointerArg("b", "Float16"), StreamArg())  # source, destination

    def compile(self, spec, *, keep_ptx: bool = False):
        from nvgemm.templates.registry import compile_for_target, fake_args

        return compile_for_target(entry(spec.config.example), fake_args(self.abi(spec)), spec,
                                  "--keep-ptx" if keep_ptx else "")


def _problem(kind: str, shape, g) -> tuple[list, torch.Tensor, torch.Tensor]:
    """(launch arguments before the stream, output tensor, reference) of one example on exact data."""
    from test_isa_cute_tma_nvfp4 import blocked_sf, e2m1_values

    if kind.startswith("gemm"):
        m, n, kk = shape
        a = torch.randint(-2, 2, (m, kk), generator=g).half()
        out = torch.full((m, n), float("nan")).half()
        if kind == "gemm_dequant":  # the first kernel writes b = bq * scale, the GEMM reads it (PDL)
            bq = torch.randint(-2, 2, (n, kk), generator=g, dtype=torch.int8)
            b = torch.full((n, kk), float("nan")).half()
            return [a, bq, b, out], out, (a.double() @ (bq.double() * DEQUANT_SCALE).T).half()
        b = torch.randint(-2, 2, (n, kk), generator=g).half()
        return [a, b, out], out, (a.double() @ b.double().T).half()
    if kind == "nvfp4":
        m, n, kk = shape
        pw = torch.tensor([0x28, 0x30, 0x38], dtype=torch.uint8)  # 0.25, 0.5, 1: sums stay below fp16's max
        a = torch.randint(0, 256, (m, kk // 2), generator=g, dtype=torch.uint8)
        b = torch.randint(0, 256, (n, kk // 2), generator=g, dtype=torch.uint8)
        sfa = pw[torch.randint(0, 3, (m, kk // 16), generator=g)].view(torch.float8_e4m3fn)
        sfb = pw[torch.randint(0, 3, (n, kk // 16), generator=g)].view(torch.float8_e4m3fn)
        out = torch.full((m, n), float("nan")).half()
        av = e2m1_values(a) * sfa.double().repeat_interleave(16, dim=1)
        bv = e2m1_values(b) * sfb.double().repeat_interleave(16, dim=1)
        return [a, b, blocked_sf(sfa), blocked_sf(sfb), out], out, (av @ bv.T).float().half()
    m, n = shape
    a = torch.randint(-30000, 30000, (m, n), generator=g, dtype=torch.int16).view(torch.float16)
    a[a.isnan()] = 1.0
    out = torch.zeros((m, n) if kind == "copy" else (n, m), dtype=torch.float16)
    return [a, out], out, (a if kind == "copy" else a.T.contiguous())


def run(name: str) -> tuple[str, str, float, int]:
    """(verdict, clusters canceled per schedule, seconds, warp-instructions of the first) of one example."""
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.emulator.ptx.schedule import Schedule
    from nvgemm.emulator.runner import prepare

    import hashlib
    import importlib.util

    mod_name, kind, shape = EXAMPLES[name]
    sha = hashlib.sha256(Path(importlib.util.find_spec(mod_name).origin).read_bytes()).hexdigest()[:16]
    t0 = time.perf_counter()
    k = prepare(make_spec(ExampleTemplate.template_id, ExampleConfig(name, sha), "sm_100a"))
    verdicts, canceled, wi = [], [], 0
    for order, resident, preferred in SCHEDULES:
        args, out, ref = _problem(kind, shape, torch.Generator().manual_seed(0))
        launch = k.launch(*args, 0, order=Schedule(order, resident or 1 << 20, preferred))
        wi = wi or launch.stats.get("warp_instructions", 0)
        canceled.append(str(launch.stats.get("clusters_canceled", 0)))
        if not torch.equal(out.view(torch.int16), ref.view(torch.int16)):
            verdicts.append(f"MISMATCH ({order}, {resident or 'all'} resident)")
    return (verdicts[0] if verdicts else "bit-exact"), " / ".join(canceled), time.perf_counter() - t0, wi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", required=True, help="NVIDIA/cutlass examples/python/CuTeDSL folder")
    ap.add_argument("--only", default="", help="comma-separated example names (default: all)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.examples).resolve()))
    from nvgemm.templates.registry import register_template

    register_template(ExampleTemplate(), replace=True)
    names = [n for n in (args.only.split(",") if args.only else EXAMPLES)]
    print("| example | problem | result | clusters canceled (serial / 2 resident / all resident) | s | warp-instr |\n"
          "|---|---|---|---|---:|---:|")
    for name in names:
        try:
            verdict, canceled, s, wi = run(name)
        except Exception as e:  # an unmodelled instruction stops the launch by name: report it
            verdict, canceled, s, wi = f"stopped: {type(e).__name__}: {str(e).splitlines()[0][:160]}", "-", 0.0, 0
            traceback.print_exc(file=sys.stderr)
        print(f"| {name} | {EXAMPLES[name][2]} | {verdict} | {canceled} | {s:.1f} | {wi} |", flush=True)


if __name__ == "__main__":
    main()
