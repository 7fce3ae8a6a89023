"""A model made in memory: a named shape (or any config dict) with random weights, generated one tensor
at a time on the device the engine runs on, as floats or straight into a block format (Q4_K, Q8_0, ...).

It loads through the same path as a file (`LLMEngine(random_source("qwen3-8b", "Q4_K", "cuda"), options)`:
engine.loading.build makes the model on the meta device and each tensor becomes a parameter or a
quantized layer as it streams in), so a card can time a model's shape without its file and without a
host copy of its weights. The values mean nothing; the shapes, formats and bytes are the model's.
The tokenizer names each id ("t42"), so prompts are given as token ids.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer as Backend
from tokenizers import models

from engine.hybrid_model import HybridCausalLM
from engine.loading.config import ModelConfig
from engine.loading.model_source import ModelSource
from engine.loading.tokenizer import Tokenizer
from engine.model import CausalLM
from kernels.reference.quant_blocks import QuantizedTensor, block_layout

if TYPE_CHECKING:
    from engine.loading.gguf_weights import KeepBlocks

ZERO_CENTRED_NORMS = ("layernorm.weight", "model.norm.weight", "q_norm.weight", "k_norm.weight")
SHAPES = {
    # Qwen/Qwen3-8B's config.json, the fields the engine reads
    "qwen3-8b": dict(architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     max_position_embeddings=40960, tie_word_embeddings=False),
    # the same architecture in miniature: rows of whole Q4_K super-blocks, runs in seconds on a CPU
    "tiny-qwen3": dict(architectures=["Qwen3ForCausalLM"], vocab_size=2048, hidden_size=256,
                       intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       max_position_embeddings=4096, tie_word_embeddings=False),
    # Qwen/Qwen3.5-9B's text model (swarm/spec/model_configs/Qwen3.5-9B.json), the fields the engine reads
    "qwen3.5-9b": dict(architectures=["Qwen3_5ForCausalLM"], vocab_size=248320, hidden_size=4096,
                       intermediate_size=12288, num_hidden_layers=32, full_attention_interval=4,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=256, partial_rotary_factor=0.25,
                       linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                       linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                       rope_theta=10000000.0, max_position_embeddings=262144, tie_word_embeddings=False),
}


@dataclass(frozen=True, slots=True)
class BlockScales:
    """Where a block keeps its fp16 scale (ggml-common.h), and its fp16 min with the multiple of the scale
    that centres the values on zero; `spread`: the root mean square of a value of random bytes per unit
    of scale (quant times sub-block scale), measured through gguf's dequantizer."""

    scale_at: int
    min_at: int | None = None
    min_per_scale: float = 0.0
    spread: float = 1.0


# Q4_1 and Q5_1 add the min to quants of mean 7.5 and 15.5; the K-quants subtract it times a 6-bit
# sub-block min, of the same mean as the 6-bit sub-block scale.
SCALES = {"Q8_0": BlockScales(0, spread=78), "Q4_0": BlockScales(0, spread=4.8),
          "Q5_0": BlockScales(0, spread=9.6), "Q4_1": BlockScales(0, 2, -7.5, 4.8),
          "Q5_1": BlockScales(0, 2, -15.5, 9.6), "Q4_K": BlockScales(0, 2, 7.5, 275),
          "Q5_K": BlockScales(0, 2, 15.5, 558), "Q6_K": BlockScales(208, spread=1434)}


@dataclass(frozen=True, slots=True)
class RandomSource(ModelSource):
    """A ModelSource (kind "random") whose config, tokenizer and weights engine.loading.loader asks it for."""

    config: ModelConfig = field(compare=False)
    block_format: str | None = None      # matrices in this format; None: floats of the engine's dtype
    device: str = "cpu"                  # where the tensors are made
    seed: int = 0

    def model_config(self) -> ModelConfig:
        return self.config

    def tokenizer(self) -> Tokenizer:
        vocab = {f"t{i}": i for i in range(self.config.vocab_size)}
        return Tokenizer(Backend(models.WordLevel(vocab, unk_token="t0")))

    def weights(self, keep: KeepBlocks | None = None) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
        """Each parameter CausalLM has, under its name; a matrix comes as blocks where `keep` (the
        load's WeightPlan.keep) takes `block_format`."""
        generator = torch.Generator(self.device).manual_seed(self.seed)
        for name, shape in _parameter_shapes(self.config).items():
            in_blocks = self.block_format is not None and len(shape) == 2 and (
                keep is None or keep(name, self.block_format, shape))
            if in_blocks:
                yield name, random_blocks(self.block_format, *shape, generator)
            else:
                yield name, _random_float(name, shape, generator, self.config.is_hybrid)


def random_source(shape: str | dict, block_format: str | None = None, device: str = "cpu",
                  seed: int = 0) -> RandomSource:
    """A model of `shape` (a name in SHAPES or a Hugging Face config dict) with random weights made on
    `device`, its matrices in `block_format` (a GGUF type such as "Q4_K") or floats."""
    raw = SHAPES[shape] if isinstance(shape, str) else shape
    if block_format is not None and block_format not in SCALES:
        raise ValueError(f"no random blocks for {block_format!r}; use one of {', '.join(SCALES)}")
    name = shape if isinstance(shape, str) else raw["architectures"][0]
    ref = f"random:{name}" + (f"-{block_format}" if block_format else "")
    return RandomSource(ref, "random", Path(ref), ModelConfig.from_dict(raw), block_format, device, seed)


def random_blocks(block_format: str, rows: int, cols: int, generator: torch.Generator) -> QuantizedTensor:
    """A [rows, cols] weight of random blocks whose values average about zero and are about cols ** -0.5
    in size (as a float layer's are, so activations stay finite through any number of layers)."""
    values, nbytes = block_layout(block_format)
    blocks = torch.randint(0, 256, (rows, cols // values, nbytes), dtype=torch.uint8, device=generator.device,
                           generator=generator)
    layout = SCALES[block_format]
    size = cols ** -0.5 / layout.spread
    scales = torch.empty(rows, cols // values, 1, device=generator.device).uniform_(
        0.5 * size, 1.5 * size, generator=generator)
    _put_half(blocks, layout.scale_at, scales)
    if layout.min_at is not None:
        _put_half(blocks, layout.min_at, scales * layout.min_per_scale)
    return QuantizedTensor(blocks.reshape(rows, -1), block_format, cols)


def _put_half(blocks: torch.Tensor, offset: int, values: torch.Tensor) -> None:
    blocks[:, :, offset:offset + 2] = values.half().view(torch.uint8)


def _random_float(name: str, shape: tuple[int, ...], generator: torch.Generator, hybrid: bool = False) -> torch.Tensor:
    """Norms scale by one (a hybrid's zero-centred ones, x·(1 + w), hold zeros for it), biases and a Gated
    DeltaNet's A_log and dt_bias are zeros, matrices (and conv kernels) are about fan_in ** -0.5."""
    device = generator.device
    if len(shape) == 1:
        ones = name.endswith("norm.weight") and not (hybrid and name.endswith(ZERO_CENTRED_NORMS))
        return torch.ones(shape, device=device) if ones else torch.zeros(shape, device=device)
    return torch.randn(shape, device=device, generator=generator) * shape[-1] ** -0.5


def _parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        net = HybridCausalLM(config) if config.is_hybrid else CausalLM(config)
    shapes = {name: tuple(t.shape) for name, t in net.state_dict(keep_vars=True).items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes
