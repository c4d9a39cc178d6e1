"""`nvgemm demo` end to end on CPU (ModelOpt quantize + export, nvgemm load, greedy decode)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("modelopt")

from nvgemm.cli import main  # noqa: E402
from nvgemm.testing import make_tiny_checkpoint  # noqa: E402


def test_demo_builtin_model():
    # A fresh interpreter with every warning shown once (-W default): import-time warnings of the
    # libraries the demo loads are seen too, which an in-process run would miss once they were imported.
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-c",
         "from nvgemm.cli import main; raise SystemExit(main(['demo', '--tokens', '3', '--prompt-len', '5']))"],
        capture_output=True, text=True, timeout=600,
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, out + err
    # a clean demo: no warning at all, in particular no deprecation caused by nvgemm's own calls
    # (transformers' past_key_values / torch_dtype, torch.jit.script); progress bars are not warnings
    noisy = [ln for ln in err.splitlines() if re.search(r"warn|deprecat", ln, re.IGNORECASE)]
    assert not noisy, err
    assert "quantized and exported with ModelOpt" in out
    assert re.search(r"per-token latency median [0-9.]+ ms", out)
    for layer in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):  # the default (fused) decode layout
        assert re.search(rf"{layer}\s+emulated x4", out), out
    worst = float(re.search(r"worst max\|diff\|/max\|ref\| = ([0-9.e+-]+)", out).group(1))
    assert worst <= 2.0**-7
    assert out.rstrip().endswith("OK")


def test_demo_on_a_checkpoint_weight_only(tmp_path, capsys):
    ckpt = make_tiny_checkpoint(tmp_path / "ck", "qwen2", "W4A16_NVFP4")
    rc = main(["demo", "--checkpoint", str(ckpt), "--tokens", "2", "--batch", "2", "--prompt-len", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "quant_algo W4A16_NVFP4" in out and "quantized and exported" not in out
    assert "lm_head" not in out  # the bf16 head unless asked for
    # --quantize-lm-head: the head is one more NVFP4 linear, checked against its dequantize-and-matmul reference
    # like the others (the OK line), and compared with the bf16 head
    rc = main(["demo", "--checkpoint", str(ckpt), "--tokens", "2", "--batch", "2", "--prompt-len", "4",
               "--quantize-lm-head"])
    out = capsys.readouterr().out
    assert rc == 0 and "\nOK" in out, out
    assert "NVFP4 lm_head (w4a16) vs the bf16 lm_head" in out, out


def test_demo_moe(capsys):
    """`nvgemm demo --model moe`: a tiny Qwen3-MoE quantized, exported, loaded and decoded; the
    per-layer report covers the MoE experts layers (compared with DequantExperts)."""
    rc = main(["demo", "--model", "moe", "--tokens", "3", "--prompt-len", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Qwen3MoeForCausalLM" in out and "2 NVFP4 MoE layers" in out
    assert re.search(r"experts\s+emulated x2", out), out
    assert re.search(r"every linear and MoE layer, last decode step: worst max\|diff\|/max\|ref\| = ([0-9.e+-]+)", out)
    assert out.rstrip().endswith("OK")
