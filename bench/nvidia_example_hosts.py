"""Host functions of ours around NVIDIA CuTeDSL example objects, for bench/run_nvidia_examples.py (imported only in
its per-example child process, after CUTE_DSL_ARCH is set; ``cute.jit`` needs importable source).

``export_to_c`` pickles the exported host function's signature; an example whose ``__call__`` has a default
``cuda.CUstream(...)`` argument cannot be exported as it is (the CUstream does not pickle), so it is called from
one of these, with the stream as a plain parameter. They add no logic: the example object does all the work."""

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute


@cute.jit
def call_abc_stream(gemm: cutlass.Constexpr, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, stream: cuda.CUstream):
    gemm(mA, mB, mC, stream=stream)
