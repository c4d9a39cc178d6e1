"""Emulator device profiles refuse launches the device could not run: shared memory beyond the profile's
per-CTA opt-in maximum, clusters beyond its maximum cluster size, an arch without a profile."""

from __future__ import annotations

import pytest
import torch

from nvgemm.emulator.ptx import EmulationError
from nvgemm.emulator.ptx.machine import ARCH_DEVICES, DEVICES, device_for_arch
from nvgemm.emulator.runner import launch_ptx

pytestmark = pytest.mark.emulator


def _kernel(static_bytes: int) -> str:
    """Thread 0 writes the last byte of the dynamic shared window (past ``static_bytes`` of static shared
    memory) and stores it to out[0]: the launch really touches all the shared memory it asks for."""
    static = f".shared .align 16 .b8 sbuf[{static_bytes}];\n" if static_bytes else ""
    return (".version 8.7\n.target sm_120a\n.address_size 64\n" + static
            + ".extern .shared .align 16 .b8 dbuf[];\n"
            ".visible .entry k(.param .u64 p_out, .param .u32 p_last)\n{\n"
            ".reg .b32 %r<8>;\n.reg .b64 %rd<4>;\n"
            "ld.param.u64 %rd1, [p_out]; ld.param.u32 %r1, [p_last];\n"
            "mov.u32 %r2, dbuf; add.u32 %r3, %r2, %r1;\n"
            "mov.u32 %r4, 0x5a; st.shared.u8 [%r3], %r4; ld.shared.u8 %r5, [%r3];\n"
            "st.global.u32 [%rd1], %r5;\nret;\n}\n")


@pytest.mark.parametrize("name", ["RTX5090", "GB10", "A10", "L40S", "A100", "H200"])
def test_shared_memory_up_to_the_optin_maximum_runs_and_one_byte_more_is_refused(name):
    limit = DEVICES[name].max_smem_optin
    out = torch.zeros(1, dtype=torch.int32)
    launch_ptx(_kernel(0), (1, 1, 1), (32, 1, 1), [out, limit - 1], dyn_smem=limit, device=name)
    assert out.item() == 0x5A
    with pytest.raises(EmulationError, match=rf"needs {limit + 1} bytes of shared memory.*{name}.*at most {limit}"):
        launch_ptx(_kernel(0), (1, 1, 1), (32, 1, 1), [out, 0], dyn_smem=limit + 1, device=name)


def test_static_shared_memory_counts_against_the_limit():
    """sm_120's 99 KB per CTA: 64 KB static + 36 KB dynamic is refused there, runs on an H200 (227 KB)."""
    out = torch.zeros(1, dtype=torch.int32)
    ptx = _kernel(64 * 1024)
    with pytest.raises(EmulationError, match="RTX5090 \\(sm_120\\) allows at most 101376"):
        launch_ptx(ptx, (1, 1, 1), (32, 1, 1), [out, 0], dyn_smem=36 * 1024, device="RTX5090")
    launch_ptx(ptx, (1, 1, 1), (32, 1, 1), [out, 36 * 1024 - 1], dyn_smem=36 * 1024, device="H200")
    assert out.item() == 0x5A


def test_cluster_beyond_the_profile_maximum_is_refused():
    out = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(EmulationError, match="A10's maximum cluster size 1 \\(no thread block clusters\\)"):
        launch_ptx(_kernel(0), (2, 1, 1), (32, 1, 1), [out, 0], dyn_smem=16, cluster=(2, 1, 1), device="A10")
    with pytest.raises(EmulationError, match="16 CTAs\\) exceeds device profile RTX5090's maximum cluster size 8"):
        launch_ptx(_kernel(0), (16, 1, 1), (32, 1, 1), [out, 0], dyn_smem=16, cluster=(16, 1, 1), device="RTX5090")
    launch_ptx(_kernel(0), (2, 1, 1), (32, 1, 1), [out, 15], dyn_smem=16, cluster=(2, 1, 1), device="RTX5090")


def test_every_arch_has_a_profile_and_an_unknown_arch_is_a_clear_error():
    assert device_for_arch("sm_120a").cc == (12, 0) and device_for_arch("sm_121a").cc == (12, 1)
    assert {ARCH_DEVICES[a] for a in ARCH_DEVICES} <= set(DEVICES)
    with pytest.raises(ValueError, match="no emulator device profile for arch 'sm_75'"):
        device_for_arch("sm_75")
