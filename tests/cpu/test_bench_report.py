"""`nvgemm bench` report writers (the GPU timing itself needs a GPU): table rows and roofline plot."""

from __future__ import annotations

import pytest

from nvgemm.cli.bench import gpu_markdown, plot_roofline


def _result():
    rows = []
    for layer, n, k in (("qkv", 6144, 4096), ("down", 4096, 14336)):
        for m in (1, 8, 32):
            roof = (n * k // 2 + n * k // 16) / 4.0e12 * 1e6  # bytes / (4 TB/s), in us
            rows.append({"layer": layer, "n": n, "k": k, "m": m, "roofline_us": roof, "nvgemm_us": roof * 1.25,
                         "nvgemm_backend": "cutedsl_sm90", "bf16_us": roof * 3.5, "cublas_nvfp4_us": None,
                         "fp8_us": roof * 1.9, "cublas_nvfp4_mode": "n/a: sm_90 has no FP4 MMA"})
    return {"model": "Llama-3.1-8B", "gpu": "H200", "arch": "sm_90", "bandwidth_gbs": 4000.0, "l2_mb": 50.0,
            "iters": 16, "reps": 5, "rows": rows}


def test_markdown_table_has_every_row_and_the_roofline_ratio():
    md = gpu_markdown(_result())
    lines = [line for line in md.splitlines() if line.startswith("| qkv") or line.startswith("| down")]
    assert len(lines) == 6
    assert all(line.rstrip().endswith("| 1.25x |") for line in lines)  # nvgemm / roofline
    assert "n/a: sm_90 has no FP4 MMA" in md


def test_roofline_png_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "roofline.png"
    msg = plot_roofline(_result(), path)
    assert msg == f"wrote {path}"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
