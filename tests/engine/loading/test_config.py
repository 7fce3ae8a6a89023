"""Reading config.json: Qwen3.5's hybrid fields (multimodal and text-only configs), its KV counted on the
full-attention layers only, and the one-line refusals; the other families as before."""
import pytest

from engine.errors import UnsupportedArchitectureError
from engine.linear_attention.state_pool import state_bytes_per_sequence
from engine.loading.config import ModelConfig

# Qwen/Qwen3.5-9B's config.json, the fields the engine reads: the text model nested under text_config
QWEN3_5_9B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
        "full_attention_interval": 4, "attn_output_gate": True, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
        "eos_token_id": 248044, "dtype": "bfloat16",
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                            "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    },
}
QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128}


def text_only(**changes) -> dict:
    return {**QWEN3_5_9B["text_config"], **changes}


def test_qwen3_5_9b_reads_its_text_model_and_counts_kv_on_its_full_attention_layers():
    config = ModelConfig.from_dict(QWEN3_5_9B)
    assert (config.architecture, config.family, config.is_hybrid) == ("Qwen3_5ForConditionalGeneration", "qwen3_5",
                                                                      True)
    assert config.kv_layers == [3, 7, 11, 15, 19, 23, 27, 31] and len(config.linear_layers) == 24
    assert config.kv_bytes_per_token("bfloat16") == 2 * 8 * 4 * 256 * 2 == 32 * 1024
    assert config.rotary_dim == 64 and config.rope_theta == 1e7 and config.rope_scaling is None
    assert config.qk_norm and not config.tie_word_embeddings and config.eos_token_ids == [248044]
    assert config.linear_attention.conv_dim == 2 * 16 * 128 + 32 * 128
    assert state_bytes_per_sequence(config, 2) == 24 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)   # about 49 MiB


def test_a_text_only_config_names_its_model_by_model_type_and_layer_types_beat_the_interval():
    config = ModelConfig.from_dict(text_only(num_hidden_layers=3, layer_types=["linear_attention", "full_attention",
                                                                               "linear_attention"]))
    assert config.architecture == "Qwen3_5ForCausalLM" and config.kv_layers == [1]
    every_other = ModelConfig.from_dict(text_only(num_hidden_layers=4, full_attention_interval=2))
    assert every_other.kv_layers == [1, 3] and every_other.num_kv_layers == 2


def test_the_top_level_decides_the_embedding_tie_of_a_multimodal_config():
    tied = {**QWEN3_5_9B, "tie_word_embeddings": True,
            "text_config": {**QWEN3_5_9B["text_config"], "tie_word_embeddings": False}}
    assert ModelConfig.from_dict(tied).tie_word_embeddings


@pytest.mark.parametrize("changes, words", [
    (dict(layer_types=["full_attention"] * 3), "layer_types must name each of the 32 layers"),
    (dict(num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"]), "'sliding_attention'"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(attn_output_gate=False), "attn_output_gate"),
    (dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.003}), "partial_rotary_factor"),
])
def test_what_swarm_cannot_run_is_refused_in_one_line(changes, words):
    with pytest.raises(UnsupportedArchitectureError, match=words) as caught:
        ModelConfig.from_dict(text_only(**changes))
    assert "\n" not in str(caught.value)


def test_the_other_families_keep_every_layer_as_kv():
    config = ModelConfig.from_dict(QWEN3_8B)
    assert not config.is_hybrid and config.layer_types == [] and config.linear_attention is None
    assert config.kv_layers == list(range(36)) and config.num_kv_layers == 36
    assert config.rotary_dim == config.head_dim == 128
    assert config.kv_bytes_per_token("bfloat16") == 147456
