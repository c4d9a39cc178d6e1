"""``nvgemm demo --emulate-kernels {sm90,sm100,sm120}``: each choice forces its emulator backend
(``NVGEMM_BACKEND=emu_<choice>``) and runs the Triton kernels on the path from that target's PTX; the flag's
parser rejects anything else. The whole demo under ``sm120`` (every linear on the sm_120a kernels, the fused
gate_up -> down chain on the sm_120a fused requant / prequant launches) is ``emulator_full``."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

pytest.importorskip("triton")

from nvgemm import settings  # noqa: E402
from nvgemm.cli import demo  # noqa: E402

pytestmark = pytest.mark.emulator


def _parser():
    p = argparse.ArgumentParser()
    demo.add_parser(p.add_subparsers())
    return p


@pytest.mark.parametrize("choice,triton_arch", [("sm90", "sm_90a"), ("sm100", "sm_100a"), ("sm120", "sm_120a")])
def test_emulate_kernels_forces_the_backend_and_the_triton_target(choice, triton_arch, capsys):
    from nvgemm.emulator import triton_ptx
    from nvgemm.templates.common import triton_stand_in

    args = _parser().parse_args(["demo", "--emulate-kernels", choice])
    assert args.emulate_kernels == choice
    n0 = len(triton_ptx.LAUNCHES)
    with demo._emulated_kernels(args.emulate_kernels):
        assert settings.NVGEMM_BACKEND == f"emu_{choice}"
        assert triton_stand_in.installed_arch() == triton_arch
        x = (torch.randn(3, 64, generator=torch.Generator().manual_seed(0)) * 2).bfloat16()
        torch.ops.nvgemm.quantize_nvfp4(x, torch.tensor(0.02), True)
    assert triton_stand_in.installed_arch() is None  # removed after the run
    assert [(r.kernel, r.arch) for r in triton_ptx.LAUNCHES[n0:]] == [("quantize_nvfp4_kernel", triton_arch)]
    out = capsys.readouterr().out
    assert f"(NVGEMM_BACKEND=emu_{choice})" in out and f"from their {triton_arch} PTX" in out
    assert f"quantize_nvfp4_kernel x1 ({triton_arch}" in out


def test_emulate_kernels_rejects_an_unknown_target(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["demo", "--emulate-kernels", "sm89"])
    assert "invalid choice: 'sm89'" in capsys.readouterr().err


@pytest.mark.emulator_full
def test_demo_with_the_sm120_kernels(capsys):
    """The whole demo (tiny Llama, ModelOpt NVFP4, one decode token) with ``--emulate-kernels sm120``: every
    linear ran ``emu_sm120`` and agrees with the checkpoint's reference, the quantizer ran from sm_120a PTX
    (30-80 s on this 2-core CPU, warm / cold caches)."""
    pytest.importorskip("modelopt")
    from nvgemm.cli import main

    assert main(["demo", "--emulate-kernels", "sm120", "--tokens", "1"]) == 0
    out = capsys.readouterr().out
    for layer in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        assert re.search(rf"{layer}\s+emu_sm120 x4", out), out
    assert re.search(r"quantize_nvfp4_kernel x\d+ \(sm_120a", out), out
    assert out.rstrip().splitlines()[-2] == "OK", out
