"""Checkpoint folders nvgemm must not trust: FIFOs and other non-regular files, corrupt headers, and
model code shipped in the folder (issue 22 items 7, 8)."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import threading

import pytest

from nvgemm.core.files import read_json, safetensors_header
from nvgemm.cli.precompile import checkpoint_shapes
from nvgemm.dispatch.serving_plan import vllm_gemms


def within(seconds: float, fn, *args):
    """``fn(*args)`` in a daemon thread: fails the test instead of hanging the suite if it blocks
    (opening a FIFO with no writer blocks in C/Rust, where a SIGALRM cannot interrupt it)."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # handed back to the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked for {seconds} s (opened a FIFO?)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    from nvgemm.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "llama", "llama", "NVFP4")


def _fifo_copy(src, dst, name):
    shutil.copytree(src, dst)
    if (dst / name).exists():
        (dst / name).unlink()
    os.mkfifo(dst / name)
    return dst


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "hf_quant_config.json"])
def test_fifo_in_checkpoint_is_refused_not_opened(tiny, tmp_path, name):
    from nvgemm.integrations.modelopt import CheckpointError, load_modelopt_checkpoint

    ck = _fifo_copy(tiny, tmp_path / "ck", name)
    with pytest.raises(CheckpointError, match=f"{name}: is a FIFO, not a regular file"):
        within(60, load_modelopt_checkpoint, ck)


def test_fifo_refused_by_precompile_and_serving_plan(tiny, tmp_path):
    ck = _fifo_copy(tiny, tmp_path / "ck", "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors: is a FIFO"):
        within(60, checkpoint_shapes, ck)
    with pytest.raises(ValueError, match="model.safetensors: is a FIFO"):
        within(60, vllm_gemms, ck, 1)
    ck2 = _fifo_copy(tiny, tmp_path / "ck2", "config.json")
    with pytest.raises(ValueError, match="config.json: is a FIFO"):
        within(60, vllm_gemms, ck2, 1)


@pytest.mark.parametrize("content,msg", [
    (b"", "0 bytes, too short"),
    (b"\x05\x00\x00", "3 bytes, too short"),
    ((10**6).to_bytes(8, "little") + b"{}", "header length 1000000 exceeds the file"),
    ((3).to_bytes(8, "little") + b"{x}", "header is not valid JSON"),
    ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
])
def test_corrupt_safetensors_header_named(tmp_path, content, msg):
    f = tmp_path / "model.safetensors"
    f.write_bytes(content)
    with pytest.raises(ValueError, match=msg) as e:
        safetensors_header(f)
    assert str(f) in str(e.value)
    with pytest.raises(ValueError, match=msg):
        checkpoint_shapes(tmp_path)


def test_json_errors_name_the_file(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"model_type": "llama",')
    with pytest.raises(ValueError, match=f"{f}: invalid JSON .* line 1"):
        read_json(f)


def test_checkpoint_code_never_runs_without_trust_remote_code(tmp_path, monkeypatch):
    """An unknown model_type with auto_map makes transformers offer to run the folder's code (it
    prompts when trust_remote_code is unset); nvgemm passes trust_remote_code=False unless told."""
    pytest.importorskip("transformers")
    from nvgemm.integrations.modelopt import CheckpointError, load_modelopt_checkpoint

    ck = tmp_path / "evil"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps({
        "model_type": "nvgemm_probe_evil",
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"},
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    }))
    marker = ck / "PWNED"
    (ck / "evil.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('checkpoint code ran')\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'nvgemm_probe_evil'\n")
    prompts = []
    monkeypatch.setattr(builtins, "input", lambda *a: prompts.append(a) or "y")  # a user who says yes
    with pytest.raises(CheckpointError, match="trust_remote_code=True"):
        load_modelopt_checkpoint(ck)
    assert not marker.exists(), "the checkpoint's code ran"
    assert not prompts, "transformers prompted for remote code"


@pytest.mark.parametrize("file,content,found", [
    ("hf_quant_config.json", [{"quant_algo": "NVFP4"}], "holds a list"),
    ("hf_quant_config.json", "NVFP4", "holds a string"),
    ("hf_quant_config.json", None, "holds null"),
    ("hf_quant_config.json", {"quantization": ["NVFP4"]}, "'quantization' section is a list"),
    ("hf_quant_config.json", {"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": ["q_proj"]}},
     "quantized_layers is a list"),
    ("config.json", [1, 2], "holds a list"),
    ("config.json", {"quantization_config": "modelopt"}, "quantization_config is a string"),
], ids=["hfq-list", "hfq-string", "hfq-null", "hfq-section-list", "hfq-layers-list", "config-list",
        "config-qc-string"])
def test_json_of_the_wrong_shape_is_a_checkpoint_error(tmp_path, file, content, found):
    """A config file holding a JSON list or scalar where an object belongs raises the loader's
    CheckpointError naming the file and what it holds (not an AttributeError from ``.get``)."""
    from nvgemm.integrations.modelopt import CheckpointError, read_quant_config

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if file == "config.json" and isinstance(content, dict):
        content = {"model_type": "llama", **content}
    (tmp_path / file).write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match=found) as e:
        read_quant_config(tmp_path)
    assert str(tmp_path / file) in str(e.value)


def test_hf_quant_config_list_refused_by_the_loader(tmp_path):
    pytest.importorskip("transformers")
    from nvgemm.integrations.modelopt import CheckpointError, load_modelopt_checkpoint

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps([{"quantization": {"quant_algo": "NVFP4"}}]))
    with pytest.raises(CheckpointError, match=r"hf_quant_config.json: holds a list \(\[\{'quantization'"):
        load_modelopt_checkpoint(tmp_path)
