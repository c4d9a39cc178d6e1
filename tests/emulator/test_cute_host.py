"""nvgemm.emulator.cute_host: a compiled CuTeDSL host function (not an nvgemm template) run through its own export,
the fake CUDA runtime and the interpreter (tests/emulator/emu_cute_host_programs.py; own code, no CUTLASS checkout).

The result is compared with torch on exact data (multiples of 1/4 with |x| <= 4, alpha = 1.5: every product and
sum is exact in fp32, so fused or separate multiply-add give the same bits); the grid is the DSL host code's, checked
against the tile count computed here.
"""

from isa_env import kernel_test_env

kernel_test_env("sm_90a")

import pytest  # noqa: E402
import torch  # noqa: E402

from nvgemm.emulator.ptx.errors import EmulationError  # noqa: E402

pytestmark = pytest.mark.emulator

SHAPE = (7, 45)  # tails in both modes: 2 x 2 tiles of 4 x 32


@pytest.fixture(scope="module")
def compiled():
    from importlib.metadata import version

    from nvgemm.emulator.cute_host import CHECKED_DSL_VERSIONS

    if version("nvidia-cutlass-dsl") not in CHECKED_DSL_VERSIONS:  # cute_host refuses it (tested below)
        pytest.skip(f"cute_host is checked against nvidia-cutlass-dsl {CHECKED_DSL_VERSIONS}")
    import cutlass.cute as cute
    from cutlass.cute.runtime import from_dlpack
    from emu_cute_host_programs import axpy

    t = [from_dlpack(torch.zeros(SHAPE)).mark_layout_dynamic() for _ in range(3)]
    return cute.compile(axpy, *t, 1.0, options="--gpu-arch sm_90a --keep-ptx")


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    a, b = [torch.randint(-16, 17, SHAPE, generator=g) * 0.25 for _ in range(2)]
    return a, b, torch.full(SHAPE, float("nan"))


def test_host_function_runs_and_matches_torch(compiled):
    from cutlass.cute.runtime import from_dlpack

    from nvgemm.emulator.cute_host import EmulatedHostFunction

    fn = EmulatedHostFunction(compiled)
    a, b, c = _data(0)
    launches = fn(*[from_dlpack(t).mark_layout_dynamic() for t in (a, b, c)], 1.5, memory=[a, b, c])
    assert len(launches) == 1
    assert launches[0].grid == (-(-SHAPE[0] // 4) * -(-SHAPE[1] // 32), 1, 1)
    assert launches[0].block == (128, 1, 1)
    torch.testing.assert_close(c, 1.5 * a + b, rtol=0, atol=0)
    # a second call with another shape and scalar goes through the same loaded library
    a2, b2 = a[:3, :40].contiguous(), b[:3, :40].contiguous()
    c2 = torch.full_like(a2, float("nan"))
    launches = fn(*[from_dlpack(t).mark_layout_dynamic() for t in (a2, b2, c2)], -0.5, memory=[a2, b2, c2])
    assert launches[0].grid == (2, 1, 1)
    torch.testing.assert_close(c2, -0.5 * a2 + b2, rtol=0, atol=0)


def test_unregistered_memory_is_an_error(compiled):
    from cutlass.cute.runtime import from_dlpack

    from nvgemm.emulator.cute_host import EmulatedHostFunction

    a, b, c = _data(1)
    with pytest.raises(EmulationError, match="global"):
        EmulatedHostFunction(compiled)(*[from_dlpack(t).mark_layout_dynamic() for t in (a, b, c)], 1.0,
                                       memory=[a, b])  # c is not an allocation: its stores are out of bounds


def test_other_dsl_version_is_refused(compiled, monkeypatch):
    import importlib.metadata

    from nvgemm.emulator.cute_host import EmulatedHostFunction

    monkeypatch.delenv("NVGEMM_EMU_ANY_DSL", raising=False)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.1")
    with pytest.raises(RuntimeError, match="0.0.1"):
        EmulatedHostFunction(compiled)


def test_unknown_device_profile_is_refused(compiled):
    from nvgemm.emulator.cute_host import EmulatedHostFunction

    with pytest.raises(ValueError, match="device profile"):
        EmulatedHostFunction(compiled, device="H300")


def test_host_code_is_not_confused_between_functions_sharing_a_kernel(compiled):
    """Two host functions around one kernel share its image and PTX: each call must run its own host code (an
    export cached by image + PTX ran the first function's host code for the second)."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import from_dlpack
    from emu_cute_host_programs import axpy_swapped

    from nvgemm.emulator.cute_host import EmulatedHostFunction

    t = [from_dlpack(torch.zeros(SHAPE)).mark_layout_dynamic() for _ in range(3)]
    swapped = cute.compile(axpy_swapped, *t, 1.0, options="--gpu-arch sm_90a --keep-ptx")
    a, b, c = _data(2)
    for fn, want in ((compiled, 2.0 * a + b), (swapped, 2.0 * b + a)):
        EmulatedHostFunction(fn)(*[from_dlpack(x).mark_layout_dynamic() for x in (a, b, c)], 2.0, memory=[a, b, c])
        torch.testing.assert_close(c, want, rtol=0, atol=0)


def test_device_view_types_cpu_memory_as_global(compiled):
    """``device_view``: a CPU tensor seen by ``from_dlpack`` as CUDA device memory (``gmem``, as CuTe's cp.async /
    TMA atoms require), over the same bytes; the axpy host function runs through such views too."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import from_dlpack
    from emu_cute_host_programs import axpy

    from nvgemm.emulator.cute_host import EmulatedHostFunction, device_view

    t = torch.zeros(4, 8)
    assert from_dlpack(t).memspace == cute.AddressSpace.generic
    assert from_dlpack(device_view(t)).memspace == cute.AddressSpace.gmem
    with pytest.raises(ValueError, match="CPU tensor"):
        device_view(torch.zeros(2, device="meta"))
    v = device_view(t)
    v.__dlpack__()
    with pytest.raises(RuntimeError, match="consumed once"):
        v.__dlpack__()
    a, b, c = _data(3)
    t = [from_dlpack(device_view(x)).mark_layout_dynamic() for x in (a, b, c)]
    gm = cute.compile(axpy, *t, 1.0, options="--gpu-arch sm_90a --keep-ptx")
    EmulatedHostFunction(gm)(*[from_dlpack(device_view(x)).mark_layout_dynamic() for x in (a, b, c)], 0.25,
                             memory=[a, b, c])
    torch.testing.assert_close(c, 0.25 * a + b, rtol=0, atol=0)
