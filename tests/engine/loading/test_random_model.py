"""A model made in memory (engine.loading.random_model) loads through the engine's own path: its float
weights give transformers' greedy tokens, its blocks are what gguf's dequantizer reads as weights of
the intended size, and the engine holds exactly the bytes of the shape's formats."""
import gguf
import numpy as np
import pytest
import torch
import transformers

from engine import LLM, SamplingParams
from engine.loading.random_model import SCALES, SHAPES, random_blocks, random_source
from kernels.cpu import quant_matmul
from tests.helpers.tiny_models import reference_greedy

SHAPE = "tiny-qwen3"
PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 8, 13, 21, 34, 55, 89, 144, 233, 19]


def transformers_model(source) -> transformers.PreTrainedModel:
    """transformers' Qwen3 of the same shape holding the source's own tensors."""
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SHAPES[SHAPE])).eval()
    model.load_state_dict(dict(source.weights()), strict=True)
    return model


def test_float_weights_give_transformers_greedy_tokens():
    source = random_source(SHAPE, seed=3)
    ours = LLM(source, dtype="float32", kv_budget_tokens=256).generate([PROMPT], SamplingParams(max_tokens=12))
    assert ours[0].token_ids == reference_greedy(transformers_model(source), PROMPT, 12)


@pytest.mark.parametrize("block_format", list(SCALES))
def test_random_blocks_are_weights_centred_on_zero_of_about_the_inverse_square_root_of_their_width(block_format):
    weight = random_blocks(block_format, 64, 1024, torch.Generator().manual_seed(0))
    values = gguf.quants.dequantize(weight.blocks.numpy(), gguf.GGMLQuantizationType[block_format]).astype(np.float64)
    assert values.shape == (64, 1024) and np.isfinite(values).all()
    size = np.sqrt(np.mean(values ** 2))
    assert 0.7 < size * 1024 ** 0.5 < 1.4
    assert abs(values.mean()) < 0.15 * size


@pytest.mark.skipif(not quant_matmul.available(), reason="needs the quantized decode kernel (a C compiler)")
def test_the_engine_holds_every_matrix_in_blocks_and_counts_their_bytes():
    config = random_source(SHAPE).config
    llm = LLM(random_source(SHAPE, "Q4_K"), kv_budget_tokens=256, packed_weights=False,
              code_panels=False)   # blocks alone
    hidden, inner = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    layer_values = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inner
    values = config.num_layers * layer_values + 2 * config.vocab_size * hidden
    q4_k_bytes = values // 256 * gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K][1]
    assert llm.weight_memory().by_format["Q4_K"] == q4_k_bytes
    assert set(llm.weight_memory().by_format) == {"Q4_K", "F32"}    # the norms stay floats
    assert len(llm.generate([PROMPT], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids) == 4


def test_a_seed_makes_the_same_weights_and_another_seed_others():
    first, again, other = (dict(random_source(SHAPE, "Q4_K", seed=s).weights()) for s in (1, 1, 2))
    name = "model.layers.0.mlp.down_proj.weight"
    assert torch.equal(first[name].blocks, again[name].blocks)
    assert not torch.equal(first[name].blocks, other[name].blocks)
    assert {n: getattr(t, "shape", None) for n, t in first.items()} == {
        n: getattr(t, "shape", None) for n, t in other.items()}


def test_an_unknown_block_format_names_the_ones_it_makes():
    with pytest.raises(ValueError, match="no random blocks for 'Q2_K'; use one of Q8_0"):
        random_source(SHAPE, "Q2_K")



def test_a_qwen35_shape_loads_as_the_hybrid_and_gives_transformers_greedy_tokens():
    """The Gated DeltaNet's parameters too (conv1d kernels, A_log, dt_bias), and the zero-centred norms at zero."""
    shape = dict(SHAPES["qwen3.5-9b"], vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                 linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    source = random_source(shape, seed=5)
    weights = dict(source.weights())
    assert torch.equal(weights["model.layers.0.input_layernorm.weight"], torch.zeros(128))
    assert torch.equal(weights["model.layers.0.linear_attn.norm.weight"], torch.ones(16))
    fields = {key: value for key, value in shape.items() if key != "architectures"}
    reference = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**fields)).eval()
    reference.load_state_dict(weights, strict=True)
    ours = LLM(source, dtype="float32", kv_budget_tokens=256).generate([PROMPT], SamplingParams(max_tokens=8,
                                                                                               ignore_eos=True))
    assert ours[0].token_ids == reference_greedy(reference, PROMPT, 8)
