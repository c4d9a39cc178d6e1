"""Host functions of ours around NVIDIA CuTeDSL example objects, for bench/run_nvidia_examples.py (imported only in
its per-example child process, after CUTE_DSL_ARCH is set; ``cute.jit`` needs importable source).

``export_to_c`` pickles the exported host function's signature; an example whose ``__call__`` has a default
``cuda.CUstream(...)`` argument cannot be exported as it is (the CUstream does not pickle), so it is called from
one of these, with the stream as a plain parameter. A parameter annotated as a plain ``tuple`` (the Blackwell NVFP4
tutorial's problem size) is specialised to its values in the export while CuTeDSL's call marshalling still packs a
pointer per element (the harness refuses that launch); passing the four sizes as Int32 parameters of a host
function of ours keeps them dynamic on both sides. These add no logic: the example object does all the work."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute


@cute.jit
def call_abc_stream(gemm: cutlass.Constexpr, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
    gemm(mA, mB, mC, stream=stream)


@cute.jit
def call_ptrs_mnkl_stream(gemm: cutlass.Constexpr, a: cute.Pointer, b: cute.Pointer, sfa: cute.Pointer, sfb: cute.Pointer,
                          c: cute.Pointer, m: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32, l: cutlass.Int32,
                          stream: cuda.CUstream):
    gemm(a, b, sfa, sfb, c, (m, n, k, l), stream)
