"""A tiny CuTeDSL kernel that exercises the whole AOT path (compile -> export -> link -> ctypes).

Template id ``selftest_scale`` (test/tooling only; never proposed by the heuristics):

    out[m, n] = bf16( fp32(a[m, n]) * alpha * scale[0] )

with dynamic M, N and row strides, a ``cutlass.Float32`` scalar, a ``cute.Pointer`` to one fp32
value, and the stream: one argument of every ABI kind. ``nvgemm precompile --selftest`` builds it to
check a machine's toolchain; on a GPU, :func:`run_selftest` launches it through the cutlass-free
loader and compares with torch.
"""

# No `from __future__ import annotations`: CuTeDSL resolves the kernels' annotations at definition
# time, and cute/cutlass are imported locally inside compile().

from dataclasses import dataclass

from nvgemm.aot.abi import (
    CompileSpec,
    PointerArg,
    ScalarArg,
    StreamArg,
    SymDim,
    TensorArg,
    compile_for_target,
    fake_args,
    register_template,
)
from nvgemm.core.status import Status

SELFTEST_TEMPLATE_ID = "selftest_scale"


@dataclass(frozen=True)
class SelftestConfig:
    threads: int = 128  # threads per CTA along N
    rows_per_cta: int = 1

    def name(self) -> str:
        return f"nvgemm_cutedsl_selftest_scale_t{self.threads}_r{self.rows_per_cta}"


class SelftestScaleTemplate:
    template_id = SELFTEST_TEMPLATE_ID
    config_type = SelftestConfig
    archs = ("sm_90a", "sm_100a", "sm_100f", "sm_103a", "sm_110a")

    def can_implement(self, spec: CompileSpec) -> Status:
        c = spec.config
        if c.threads not in (32, 64, 128, 256):
            return Status.fail(f"threads={c.threads} not in (32, 64, 128, 256)")
        if c.rows_per_cta < 1:
            return Status.fail("rows_per_cta must be >= 1")
        if spec.epilogue.out_dtype.__repr__() != "torch.bfloat16":
            return Status.fail("selftest writes bf16 only")
        return Status.success()

    def abi(self, spec: CompileSpec):
        return (
            TensorArg("mA", "BFloat16", shape=(SymDim(), SymDim()), stride=(SymDim(1, 64), 1)),
            TensorArg("mOut", "BFloat16", shape=(SymDim(), SymDim()), stride=(SymDim(1, 64), 1)),
            ScalarArg("alpha", "float32"),
            PointerArg("scale", "Float32", assumed_align=4),
            StreamArg("stream"),
        )

    def compile(self, spec: CompileSpec):
        import cuda.bindings.driver as cuda
        import cutlass
        import cutlass.cute as cute

        threads = spec.config.threads
        rows = spec.config.rows_per_cta

        @cute.kernel
        def scale_kernel(mA: cute.Tensor, mOut: cute.Tensor, alpha: cutlass.Float32, scale: cute.Pointer):
            tidx, _, _ = cute.arch.thread_idx()
            bx, by, _ = cute.arch.block_idx()
            m_dim = cute.size(mA, mode=[0])
            n_dim = cute.size(mA, mode=[1])
            s = cute.make_tensor(scale, cute.make_layout(1))
            f = alpha * s[0]
            n = bx * threads + tidx
            for r in cutlass.range_constexpr(rows):
                m = by * rows + r
                if m < m_dim and n < n_dim:
                    mOut[m, n] = (mA[m, n].to(cutlass.Float32) * f).to(cutlass.BFloat16)

        @cute.jit
        def scale_host(
            mA: cute.Tensor, mOut: cute.Tensor, alpha: cutlass.Float32, scale: cute.Pointer, stream: cuda.CUstream
        ):
            m_dim = cute.size(mA, mode=[0])
            n_dim = cute.size(mA, mode=[1])
            scale_kernel(mA, mOut, alpha, scale).launch(
                grid=[(n_dim + threads - 1) // threads, (m_dim + rows - 1) // rows, 1],
                block=[threads, 1, 1],
                stream=stream,
            )

        return compile_for_target(scale_host, fake_args(self.abi(spec)), spec)


TEMPLATE = register_template(SelftestScaleTemplate(), replace=True)


def selftest_ref(a, alpha: float, scale: float):
    """Torch reference: fp32 multiply, one rounding to bf16."""
    import torch

    return (a.float() * (torch.tensor(alpha, dtype=torch.float32) * torch.tensor(scale, dtype=torch.float32))).to(
        torch.bfloat16
    )


def run_selftest(kernel, m: int = 5, n: int = 300) -> float:
    """Launch a loaded selftest kernel on the current GPU; returns max |err| vs :func:`selftest_ref`."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, n, generator=g).to(torch.bfloat16).cuda()
    out = torch.zeros_like(a)
    scale = torch.tensor([0.75], dtype=torch.float32, device="cuda")
    kernel.launch(a, out, 1.5, scale, torch.cuda.current_stream())
    torch.cuda.synchronize()
    ref = selftest_ref(a.cpu(), 1.5, 0.75)
    return (out.cpu().float() - ref.float()).abs().max().item()
