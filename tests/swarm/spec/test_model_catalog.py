import pytest

from engine.errors import ModelLoadError
from swarm.spec.model_catalog import load_shipped_or_path, model_config_path, shipped_model_configs

EXPECTED = {  # layers, KV heads, head dim, bytes per fp16 KV token
    "Qwen3-8B": (36, 8, 128, 147_456),
    "Qwen3-4B": (36, 8, 128, 147_456),
    "Qwen3-0.6B": (28, 8, 128, 114_688),
    "Llama-3.1-8B-Instruct": (32, 8, 128, 131_072),
    "Qwen2.5-7B-Instruct": (28, 4, 128, 57_344),
    "Qwen3.5-9B": (32, 4, 256, 32_768),   # KV in its 8 full-attention layers only
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_configs_load(name):
    config = load_shipped_or_path(name)
    shape = (config.num_layers, config.num_kv_heads, config.head_dim, config.kv_bytes_per_token())
    assert shape == EXPECTED[name]


def test_names_are_forgiving():
    assert model_config_path("qwen3-8b") == model_config_path("Qwen/Qwen3-8B")
    assert model_config_path("Llama-3.1-8B").name == "Llama-3.1-8B-Instruct.json"
    assert model_config_path("Qwen2.5-7B").name == "Qwen2.5-7B-Instruct.json"
    assert set(EXPECTED) <= set(shipped_model_configs())


def test_a_path_to_a_config_or_folder(tmp_path):
    (tmp_path / "config.json").write_text(model_config_path("Qwen3-0.6B").read_text())
    assert load_shipped_or_path(str(tmp_path)).num_layers == 28
    assert load_shipped_or_path(str(tmp_path / "config.json")).num_layers == 28


def test_an_unknown_name_lists_the_shipped_ones():
    with pytest.raises(ModelLoadError, match=r"did you mean 'Qwen3-8B'\?.*Qwen3-0.6B"):
        model_config_path("Qwen3-8")
