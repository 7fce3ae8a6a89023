"""The KV pool's tensors against the bytes-per-token formula: what the formula says is what is allocated."""
import pytest
import torch

from engine.kv.cache import KVCache, blocks_for_budget
from engine.loading.config import ModelConfig

SHAPES = {   # layers, heads, KV heads, head dim: one KV head per query head, grouped, one for all, odd
    "mha": (2, 4, 4, 32),
    "gqa": (3, 8, 2, 64),
    "mqa": (2, 6, 1, 48),
    "odd": (1, 3, 3, 24),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def config_of(layers: int, heads: int, kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": heads * 8,
                                  "intermediate_size": 32, "num_hidden_layers": layers, "num_attention_heads": heads,
                                  "num_key_value_heads": kv_heads, "head_dim": head_dim})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block_size", [1, 16])
def test_the_tensors_hold_the_formulas_bytes_per_token(shape, dtype, block_size):
    config = config_of(*SHAPES[shape])
    kv = KVCache.allocate(config, 3, block_size, DTYPES[dtype], torch.device("cpu"))
    measured = sum(t.numel() * t.element_size() for pair in kv.layers for t in pair)
    assert kv.total_bytes == measured
    assert kv.block_bytes == config.kv_bytes_per_token(dtype) * block_size
    assert kv.bytes_per_token == config.kv_bytes_per_token(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_byte_budget_buys_the_blocks_the_tensors_take(dtype):
    config = config_of(*SHAPES["gqa"])
    block_bytes = KVCache.allocate(config, 1, 16, DTYPES[dtype], torch.device("cpu")).block_bytes
    for budget in (1, block_bytes - 1, block_bytes, 5 * block_bytes + 7):
        assert blocks_for_budget(config, 16, DTYPES[dtype], budget_bytes=budget) == max(1, budget // block_bytes)
