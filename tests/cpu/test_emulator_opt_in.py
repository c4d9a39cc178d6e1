"""The PTX emulator is opt-in: a process that dispatches ``nvfp4_linear`` and ``nvfp4_moe`` without asking for
it never imports ``nvgemm.emulator``; forcing an ``emu_*`` backend by env var (or ``nvgemm.emulator.enable``)
registers its backends and the forced one is selected. Each case runs in a fresh interpreter, so what an
earlier test imported cannot hide an import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

_DISPATCH = textwrap.dedent("""
    import json, sys
    import torch
    import nvgemm
    from nvgemm.nn.experts import NVFP4Experts
    from nvgemm.dispatch.registry import last_selected
    from nvgemm.dispatch.moe import last_moe_selected

    torch.manual_seed(0)
    lin = nvgemm.NVFP4Linear.from_linear(torch.nn.Linear(64, 32, bias=False), input_scale=0.01)
    y = lin(torch.randn(3, 64).to(torch.bfloat16))
    experts = NVFP4Experts.from_float(torch.randn(4, 64, 64), torch.randn(4, 64, 32), 0.01, 0.01)
    ids = torch.tensor([[0, 1], [2, 3], [1, 2]], dtype=torch.int32)
    z = experts(torch.randn(3, 64).to(torch.bfloat16), ids, torch.rand(3, 2))
    print(json.dumps({"linear": last_selected(), "moe": last_moe_selected(),
                      "shapes": [list(y.shape), list(z.shape)],
                      "emulator": sorted(m for m in sys.modules if m.startswith("nvgemm.emulator"))}))
""")

_FORCED = textwrap.dedent("""
    import json, sys
    import torch
    import nvgemm
    from nvgemm.core.backend import LinearProblem
    from nvgemm.dispatch.registry import backends, select_backend

    p = LinearProblem(m=4, n=64, k=64, device_type="cpu", capability=None, weight_only=True, x_dtype=torch.bfloat16,
                      out_dtype=torch.bfloat16, alpha="scalar", bias=False, activation="none", residual=False)
    chosen = select_backend(p, check=False)
    print(json.dumps({"chosen": chosen.name, "linear": [b.name for b in backends("linear")],
                      "requant": [b.name for b in backends("requant")], "moe": [b.name for b in backends("moe")],
                      "emulator": sorted(m for m in sys.modules if m.startswith("nvgemm.emulator"))}))
""")


def _run(code: str, **env) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("NVGEMM_")}
    e.update(env, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_normal_dispatch_does_not_import_the_emulator():
    out = _run(_DISPATCH)
    assert out["linear"] == "emulated" and out["moe"] == "emulated" and out["shapes"] == [[3, 32], [3, 64]]
    assert out["emulator"] == [], f"a plain CPU dispatch imported {out['emulator']}"


@pytest.mark.parametrize("var,name", [("NVGEMM_BACKEND", "emu_sm90"), ("NVGEMM_FUSED_BACKEND", "emu_sm100"),
                                      ("NVGEMM_MOE_BACKEND", "emu_sm100_moe")])
def test_forcing_an_emulator_backend_registers_the_emulator(var, name):
    out = _run(_FORCED, **{var: name})
    assert "nvgemm.emulator.backend" in out["emulator"]
    assert {"emu_sm90", "emu_sm100"} <= set(out["linear"]) and "emu_sm100" in out["requant"]
    assert "emu_sm100_moe" in out["moe"]
    if var == "NVGEMM_BACKEND":
        assert out["chosen"] == "emu_sm90"  # the forced backend is the one selected


def test_enable_registers_the_emulator_backends_once():
    code = _FORCED.replace("chosen = select_backend(p, check=False)",
                           "import nvgemm.emulator as emu; emu.enable(); emu.enable()\n"
                           "chosen = select_backend(p, check=False)")
    out = _run(code)
    assert out["chosen"] == "emulated"  # registered, never chosen unless forced
    assert out["linear"].count("emu_sm90") == 1 and "emu_sm100_moe" in out["moe"]
