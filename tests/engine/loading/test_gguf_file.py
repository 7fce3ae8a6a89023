"""engine/loading/gguf_file.py against transformers loading the same GGUF files (the oracle)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.loading.config import ModelConfig
from engine.loading.gguf_file import gguf_file_type, read_gguf_config, read_gguf_tokenizer
from engine.loading.gguf_weights import iter_gguf_weights, read_gguf_tensors
from kernels.reference.gguf_dequant import dequantize
from kernels.reference.quant_blocks import KEPT_FORMATS, QuantizedTensor
from tests.helpers.tiny_gguf import (
    DEQUANTIZE_ONLY,
    QUANTIZABLE,
    smollm2_or_skip,
    tiny_model,
    write_metadata_only,
    write_model,
)

transformers = pytest.importorskip("transformers")

# Largest relative error (Frobenius) of the dequantized weights against the weights quantized.
QUANT_ERROR = {Q.F32: 0.0, Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 1e-2, Q.Q5_0: 0.05, Q.Q5_1: 0.05,
               Q.Q4_0: 0.1, Q.Q4_1: 0.1}
CONFIG_FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                 "tie_word_embeddings", "bos_token_id", "eos_token_id"]


def transformers_state_dict(path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                             dtype=torch.float32)
    return model, {name: tensor.float() for name, tensor in model.state_dict().items()}


def assert_same_tensors(ours, theirs, tied):
    assert set(theirs) - set(ours) == ({"lm_head.weight"} if tied else set())
    assert set(ours) <= set(theirs)
    assert all(tensor.dtype == torch.float32 for tensor in ours.values())
    assert [name for name, tensor in ours.items() if not torch.equal(tensor, theirs[name])] == []


def assert_config_matches(ours, model):
    theirs = model.config
    for field in CONFIG_FIELDS:
        assert ours[field] == getattr(theirs, field), field
    assert ours["architectures"] == [type(model).__name__]
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert ours["head_dim"] == head_dim
    assert ours["rms_norm_eps"] == pytest.approx(theirs.rms_norm_eps, rel=1e-6)
    assert ours["rope_theta"] == pytest.approx(theirs.rope_parameters["rope_theta"])


def assert_one_line_error(info, path):
    message = str(info.value)
    assert "\n" not in message
    assert path.name in message


# --- the real SmolLM2-135M-Instruct Q4_1 file ---------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    return smollm2_or_skip()


@pytest.fixture(scope="module")
def smollm2_ours(smollm2):
    return read_gguf_tensors(smollm2)


@pytest.fixture(scope="module")
def smollm2_transformers(smollm2_in_transformers):
    model = smollm2_in_transformers
    return model, {name: tensor.float() for name, tensor in model.state_dict().items()}


def test_smollm2_tensors_equal_transformers(smollm2_ours, smollm2_transformers):
    _, theirs = smollm2_transformers
    assert len(smollm2_ours) == 30 * 9 + 2
    assert_same_tensors(smollm2_ours, theirs, tied=True)


def keep_every_matrix(name: str, format: str, shape: tuple) -> bool:
    return format in KEPT_FORMATS


def read_blocks(path) -> dict[str, QuantizedTensor]:
    return {name: value for name, value in iter_gguf_weights(path, keep_every_matrix)
            if isinstance(value, QuantizedTensor)}


def test_smollm2_quantized_blocks_are_every_matrix_and_dequantize_to_the_weights(smollm2, smollm2_ours):
    quantized = read_blocks(smollm2)
    assert len(quantized) == 30 * 7 + 1
    assert quantized["model.embed_tokens.weight"].format == "Q8_0"
    assert {weight.format for weight in quantized.values()} == {"Q8_0", "Q4_1"}
    for name, weight in quantized.items():
        assert torch.equal(dequantize(weight), smollm2_ours[name]), name
    assert gguf_file_type(smollm2) == "Q4_1"


def test_smollm2_q_and_k_rows_are_unpermuted(smollm2, smollm2_ours, smollm2_transformers):
    from transformers.integrations.gguf.dequant import dequantize as torch_dequantize
    from transformers.integrations.gguf.reader import GgufHeader, load_gguf_state_dict

    _, theirs = smollm2_transformers
    raw = load_gguf_state_dict(GgufHeader.from_file(str(smollm2)))["blk.0.attn_q.weight"]
    as_stored = torch_dequantize(raw[...].flatten(), raw.ggml_type).reshape(576, 576)
    ours = smollm2_ours["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(ours, as_stored)  # the permutation is real, and undone
    torch.testing.assert_close(ours, theirs["model.layers.0.self_attn.q_proj.weight"], rtol=0, atol=0)
    torch.testing.assert_close(smollm2_ours["model.layers.29.self_attn.k_proj.weight"],
                               theirs["model.layers.29.self_attn.k_proj.weight"], rtol=0, atol=0)


def test_smollm2_config_matches_transformers(smollm2, smollm2_transformers):
    model, _ = smollm2_transformers
    config = read_gguf_config(smollm2)
    assert_config_matches(config, model)
    assert config["model_type"] == "llama"
    assert config["rms_norm_eps"] == 1e-5
    assert "rope_scaling" not in config


def test_smollm2_config_builds_a_model_config(smollm2):
    config = ModelConfig.from_dict(read_gguf_config(smollm2))
    assert (config.family, config.num_layers, config.num_kv_heads, config.head_dim) == ("llama", 30, 3, 64)
    assert config.tie_word_embeddings and config.eos_token_ids == [2]


# --- quantization types, on tiny random models --------------------------------------------------

@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda q: q.name)
def test_quantized_types_match_transformers_and_the_weights(tmp_path, qtype):
    model = tiny_model("llama")
    path = write_model(tmp_path / f"tiny-{qtype.name}.gguf", model, qtype)
    ours = read_gguf_tensors(path)
    assert_same_tensors(ours, transformers_state_dict(path)[1], tied=False)
    for name, weight in model.state_dict().items():
        error = torch.linalg.norm(ours[name] - weight) / torch.linalg.norm(weight)
        assert error <= QUANT_ERROR[qtype], name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.F16, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_quantized_blocks_kept_equal_the_dequantized_weights(tmp_path, family, qtype):
    path = write_model(tmp_path / f"{family}-{qtype.name}.gguf", tiny_model(family), qtype)
    quantized, weights = read_blocks(path), read_gguf_tensors(path)
    assert set(quantized) == {name for name, w in weights.items() if w.dim() == 2}
    for name, weight in quantized.items():  # llama's q/k rows are reordered back, like the weights
        assert torch.equal(dequantize(weight), weights[name]), name


@pytest.mark.parametrize("qtype", DEQUANTIZE_ONLY, ids=lambda q: q.name)
def test_k_quants_match_transformers_and_its_torch_dequantizer(tmp_path, qtype):
    from transformers.integrations.gguf.dequant import dequantize as torch_dequantize

    path = write_model(tmp_path / f"tiny-{qtype.name}.gguf", tiny_model("llama"), qtype)
    ours = read_gguf_tensors(path)
    assert_same_tensors(ours, transformers_state_dict(path)[1], tied=False)
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors if t.tensor_type == qtype}
    blocks = stored["blk.1.ffn_down.weight"]
    independent = torch_dequantize(torch.from_numpy(np.array(blocks.data)).flatten(), qtype)
    torch.testing.assert_close(ours["model.layers.1.mlp.down_proj.weight"].flatten(), independent)
    assert len(stored) == 2 * 7 + 2


# --- families -----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_family_matches_transformers(tmp_path, family):
    model = tiny_model(family)
    path = write_model(tmp_path / f"{family}.gguf", model, Q.Q8_0)
    theirs_model, theirs = transformers_state_dict(path)
    assert_same_tensors(read_gguf_tensors(path), theirs, tied=False)
    assert_config_matches(read_gguf_config(path), theirs_model)


def test_qwen3_head_dim_comes_from_key_length(tmp_path):
    path = write_model(tmp_path / "qwen3.gguf", tiny_model("qwen3"), Q.F16)
    config = read_gguf_config(path)
    assert config["head_dim"] == 128 != config["hidden_size"] // config["num_attention_heads"]
    assert ModelConfig.from_dict(config).qk_norm


def test_mistral_written_as_llama_loads_as_llama_like_transformers(tmp_path):
    model = tiny_model("mistral")
    path = write_model(tmp_path / "mistral.gguf", model, Q.Q8_0, arch="llama", name="Mistral-Tiny-v0.3")
    theirs_model, theirs = transformers_state_dict(path)
    assert_same_tensors(read_gguf_tensors(path), theirs, tied=False)
    assert_config_matches(read_gguf_config(path), theirs_model)


def test_architecture_mistral_is_unpermuted_like_llama(tmp_path):
    # gguf-py (and so transformers) cannot read this architecture: the original weights are the oracle
    model = tiny_model("mistral")
    path = write_model(tmp_path / "mistral.gguf", model, Q.F32, arch="mistral")
    assert read_gguf_config(path)["architectures"] == ["MistralForCausalLM"]
    ours = read_gguf_tensors(path)
    for name, weight in model.state_dict().items():
        torch.testing.assert_close(ours[name], weight, rtol=0, atol=0, msg=name)


def test_tied_embeddings_have_no_lm_head(tmp_path):
    path = write_model(tmp_path / "tied.gguf", tiny_model("llama", tie_word_embeddings=True), Q.Q4_0)
    assert read_gguf_config(path)["tie_word_embeddings"] is True
    assert "lm_head.weight" not in read_gguf_tensors(path)


def test_missing_sizes_fall_back(tmp_path):
    tokens = [f"t{i}" for i in range(512)]
    path = write_model(tmp_path / "plain.gguf", tiny_model("llama"), Q.F16,
                       skip_keys=("llama.vocab_size", "llama.attention.key_length"),
                       extra={"tokenizer.ggml.tokens": (tokens, V.ARRAY)})
    config = read_gguf_config(path)
    assert config["vocab_size"] == 512
    assert config["head_dim"] == 256 // 4


# --- rope scaling -------------------------------------------------------------------------------

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def write_with_rope_freqs(path, rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = tiny_model("llama", rope_parameters=rope, max_position_embeddings=131072)
    head_dim = model.config.head_dim
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](model.config, "cpu")
    plain = 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2).double() / head_dim)
    factors = (plain / scaled.double()).float().numpy()
    return write_model(path, model, Q.F16, extra_tensors={"rope_freqs.weight": (factors, None)})


def test_llama3_rope_scaling_is_read_from_rope_freqs(tmp_path):
    path = write_with_rope_freqs(tmp_path / "llama31.gguf", LLAMA3_ROPE)
    scaling = read_gguf_config(path)["rope_scaling"]
    expected = {key: value for key, value in LLAMA3_ROPE.items() if key != "rope_theta"}
    assert scaling == pytest.approx(expected) and scaling["rope_type"] == "llama3"
    assert ModelConfig.from_dict(read_gguf_config(path)).rope_scaling["factor"] == pytest.approx(32.0)
    assert "rope_freqs.weight" not in read_gguf_tensors(path)


def test_rope_freqs_that_are_not_llama3_defaults_are_refused(tmp_path):
    path = write_with_rope_freqs(tmp_path / "odd.gguf", LLAMA3_ROPE | {"low_freq_factor": 2.0})
    with pytest.raises(UnsupportedArchitectureError) as info:
        read_gguf_config(path)
    assert_one_line_error(info, path)


def test_rope_scaling_metadata(tmp_path):
    extra = {"llama.rope.scaling.type": ("linear", V.STRING), "llama.rope.scaling.factor": (2.0, V.FLOAT32)}
    path = write_model(tmp_path / "linear.gguf", tiny_model("llama"), Q.F16, extra=extra)
    config = read_gguf_config(path)
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(UnsupportedArchitectureError):
        ModelConfig.from_dict(config)


# --- files that cannot be loaded ----------------------------------------------------------------

def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
    path = write_metadata_only(tmp_path / "gpt2.gguf", "gpt2", {"gpt2.block_count": (2, V.UINT32)})
    for read in (read_gguf_config, read_gguf_tensors):
        with pytest.raises(UnsupportedArchitectureError) as info:
            read(path)
        assert_one_line_error(info, path)
        assert "'gpt2'" in str(info.value) and "llama" in str(info.value) and "qwen3" in str(info.value)


def test_missing_path(tmp_path):
    path = tmp_path / "nowhere.gguf"
    for read in (read_gguf_config, read_gguf_tensors, read_gguf_tokenizer):
        with pytest.raises(ModelLoadError) as info:
            read(path)
        assert_one_line_error(info, path)


@pytest.mark.parametrize("content", [b"", b"{\"model_type\": \"llama\"}\n", b"GGU", bytes(range(256)) * 4])
def test_not_a_gguf_file(tmp_path, content):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError) as info:
        read_gguf_config(path)
    assert_one_line_error(info, path)


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        read_gguf_tensors(tmp_path)
    assert_one_line_error(info, tmp_path)


@pytest.mark.parametrize("size", [4, 20, 5_000, 1_000_000, 1_700_000, 60_000_000])
def test_truncated_real_file(tmp_path, smollm2, size):
    path = tmp_path / f"first-{size}.gguf"
    with smollm2.open("rb") as source, path.open("wb") as target:
        target.write(source.read(size))
    readers = (read_gguf_config, read_gguf_tensors, read_gguf_tokenizer) if size == 60_000_000 else (read_gguf_config,)
    for read in readers:
        with pytest.raises(ModelLoadError) as info:
            read(path)
        assert_one_line_error(info, path)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", tiny_model("qwen2"), Q.Q4_0)
    data_end = max(t.data_offset + t.n_bytes for t in gguf.GGUFReader(path).tensors)
    return path, data_end


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1, exclude_max=True))
def test_any_truncation_is_a_model_load_error(tmp_path, tiny_file, cut):
    source, data_end = tiny_file
    path = tmp_path / "cut.gguf"
    path.write_bytes(source.read_bytes()[:int(cut * data_end)])
    with pytest.raises(ModelLoadError) as info:
        read_gguf_tensors(path)
    assert_one_line_error(info, path)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # corrupt scales decode to NaN
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0, 1, exclude_max=True), byte=st.integers(0, 255))
def test_a_corrupt_header_byte_never_escapes_as_another_error(tmp_path, tiny_file, where, byte):
    content = tiny_file[0].read_bytes()
    header_end = content.index(b"blk.") + 2_000  # into the tensor table
    corrupt = bytearray(content)
    corrupt[int(where * header_end)] = byte
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(corrupt))
    try:
        read_gguf_config(path)
        read_gguf_tensors(path)
    except ModelLoadError as error:
        assert "\n" not in str(error) and path.name in str(error)


def test_a_type_gguf_cannot_dequantize_is_a_model_load_error(tmp_path):
    q8_k_blocks = np.zeros((512, 292), np.uint8)  # Q8_K: 256 values in 292 bytes, one block a row
    path = write_model(tmp_path / "q8k.gguf", tiny_model("llama"), Q.F16,
                       extra_tensors={"token_embd.weight": (q8_k_blocks, Q.Q8_K)})
    with pytest.raises(ModelLoadError) as info:
        read_gguf_tensors(path)
    assert_one_line_error(info, path)
    assert "Q8_K" in str(info.value)
