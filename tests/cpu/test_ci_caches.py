"""Every CI stage compiles into its own caches, never the machine's defaults: a graph or kernel left in
the default Inductor / Triton / CuTeDSL / vLLM / nvgemm cache by an earlier run would be loaded instead
of compiled, and the tests that check what a compile does (nvgemm's passes, its kernels) would see
nothing or stale output. Checked on the scripts' text: each cache variable is set to a path under a
folder the script made, before it runs pytest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parents[2] / ".ci"
TORCH_CACHES = ("NVGEMM_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR")
ENGINE_CACHES = {"vllm_e2e": ("VLLM_CACHE_ROOT",)}


def _unset_before_pytest(text: str, names) -> list[str]:
    run = text.index("pytest")
    return [v for v in names if not (m := re.search(rf'\b{v}="\$[A-Za-z_{{]', text)) or m.start() > run]


@pytest.mark.parametrize("script", sorted(p.name for p in CI.iterdir() if p.name != "run"))
def test_engine_stage_has_its_own_caches(script):
    text = (CI / script).read_text()
    missing = _unset_before_pytest(text, TORCH_CACHES + ENGINE_CACHES.get(script, ()))
    assert not missing, f".ci/{script} runs its tests with the machine's {', '.join(missing)}"


def test_torch_stages_have_their_own_caches():
    text = (CI / "run").read_text()
    stage = text[text.index("stage() {"):]
    assert not _unset_before_pytest(stage, TORCH_CACHES)
