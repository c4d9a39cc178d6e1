"""A decoder MLP layer in the launch order of Inductor's generated code, under programmatic dependent launch on
the emulator: the code ``torch.compile`` + ``nvgemm.enable()`` generates for a fake B200 (W4A4, sm_100a: the
RMSNorm and activation quantizer -> gate/up GEMM with the fused SiLU-mul requant -> down GEMM fed the codes ->
the residual add; Inductor's own Triton kernels or nvgemm's fused ones, as the generated code has them) and a
fake H200 (W4A16, sm_90a: RMSNorm -> gate/up GEMM with the SiLU-mul epilogue -> down GEMM -> residual add),
replayed on CPU tensors with every launch on the emulator
(``_inductor_emu_replay.py``) and the PDL attributes the generated code and nvgemm's launchers set.

The reference is the same replay run launch by launch (the compiled step on the emulated backend). Under every
PDL schedule the captured stream must give its bits, report no race, and (early / late stores) start the
dependents before their producers completed; the three PDL mutations of the real PTX are each reported
(``_pdl_mutations.py``). Independent of the emulator, the output is checked against the layer's own CPU
forward (nvgemm's emulated reference path) within 2**-5 relative to the output's max: both quantize the same
activations, but Inductor's fused RMSNorm may round differently from the eager one, which can flip an FP4 code.
"""

from __future__ import annotations

import pytest
import torch
from isa_env import kernel_test_env

kernel_test_env("sm_100a")

import _inductor_emu_replay as replay_mod  # noqa: E402
from _pdl_mutations import MUTATIONS, apply_and_expect_race, consumer_pairs  # noqa: E402
from nvgemm.emulator.ptx.pdl import SCHEDULES  # noqa: E402
from nvgemm.emulator.stream import capture, run_captured  # noqa: E402

pytestmark = pytest.mark.emulator_full  # opt-in: the whole decoder layer (test_pdl_decoder_layer.py) is the default

LAYERS = {"B200-w4a4": ("B200", "sm_100a"), "H200-w4a16": ("H200", "sm_90a")}
_BUILT: dict = {}


@pytest.fixture(autouse=True)
def _stand_in_removed_after():
    """The Triton stand-in these tests install is removed after each (other tests expect the torch references)."""
    yield
    import nvgemm.emulator as emu

    emu.disable_triton()


def layer(name):
    if name not in _BUILT:
        gpu, arch = LAYERS[name]
        import nvgemm.emulator as emu

        emu.enable(arch)
        code, inputs = replay_mod.build(gpu)
        ref = replay_mod.replay(code, inputs, arch)[0]
        _BUILT[name] = (code, inputs, arch, ref)
    code, inputs, arch, ref = _BUILT[name]
    import nvgemm.emulator as emu

    emu.enable(arch)
    return code, inputs, arch, ref


def captured(name):
    code, inputs, arch, _ = layer(name)
    with capture() as grids:
        out = replay_mod.replay(code, inputs, arch)[0]
    return grids, out


@pytest.mark.parametrize("name", list(LAYERS))
def test_generated_layer_under_pdl_schedules_bit_exact(name):
    code, inputs, arch, ref = layer(name)
    names = None
    for schedule in SCHEDULES:
        grids, out = captured(name)
        names = [(g.name, g.pdl) for g in grids]
        r = run_captured(grids, schedule)
        assert r.races == []
        assert torch.equal(out, ref), schedule
        assert any(r.started_before_predecessor_completed) == (schedule != "serial"), \
            (schedule, r.started_before_predecessor_completed)
    # the launches of the generated code: two nvgemm GEMMs (gate/up, down), every nvgemm kernel launched with
    # PDL; on sm_100a an activation quantizer (alone or fused with the RMSNorm) before the first GEMM
    gemms = [i for i, (n, _) in enumerate(names) if n.startswith("nvgemm_cutedsl_")]
    assert len(gemms) == 2, names
    assert all(p for n, p in names if not n.startswith("triton_")), names  # Inductor's own: triton_*
    if arch == "sm_100a":
        assert any("quantize" in n for n, _ in names[:gemms[0]]), names
    # independent of the emulator: the layer's eager CPU forward (the emulated reference path), loosely
    model = replay_mod.MlpLayer(weight_only=arch == "sm_90a")
    eager = model(inputs[0]).float()
    err = (ref.float() - eager).abs().max() / eager.abs().max()
    assert err < 2 ** -5, float(err)


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("mutation", MUTATIONS)
def test_generated_layer_pdl_mutations_caught(name, mutation):
    grids, _ = captured(name)
    pairs = consumer_pairs(grids)
    assert pairs, "no PDL consumer in the layer"
    apply_and_expect_race(lambda: captured(name)[0], mutation, pairs[(MUTATIONS.index(mutation) + 1) % len(pairs)])
