"""Helpers of the sm120 grouped-MoE emulator tests: one ``nvfp4_moe`` call through the real AOT
artifacts of the grouped sm120 kernel on the PTX emulator (the RTX 5090 / GB10 profiles), with the
production host path (:func:`nvgemm.templates.sm120_moe.launch.moe_forward`). The operands are the
sm100 grouped tests' exactness-preserving ones (:mod:`_sm100_moe_emu`)."""

from __future__ import annotations

PROFILE = {"sm_120a": "RTX5090", "sm_121a": "GB10"}


def emu_launcher(arch="sm_120a", launches=None):
    """A ``launch`` for :func:`moe_forward` running each grouped GEMM's real AOT artifact on the emulator."""
    from nvgemm.aot.compile_spec import make_spec
    from nvgemm.emulator.runner import prepare

    def launch(args):
        spec = make_spec("sm120_moe_nvfp4", args.config, arch, epilogue=args.spec)
        r = prepare(spec, device=PROFILE[arch]).launch(*args.abi_values(), 0)
        if launches is not None:
            launches.append(r)

    return launch


def run_moe_emu(ops, config13, config2, keep=None, arch="sm_120a", launches=None):
    """One ``nvfp4_moe`` call (W4A4 operands in schema order) through the grouped sm120 kernels."""
    from nvgemm.templates.sm120_moe.launch import moe_forward

    (x, ids, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwi, emap, sh, res, odt) = ops
    return moe_forward(x, ids, emap, wts, w13, s13, g13, i13, w2, s2, g2, i2, act, rwi, sh, res, odt, config13,
                       config2, emu_launcher(arch, launches), keep=keep)
