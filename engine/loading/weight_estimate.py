"""What a model's weights take before anything is loaded: a llama.cpp file type's bytes from the model's
config alone (`estimate_weights`), or a GGUF file's own bytes from its header (`gguf_file_weights`).

The estimate gives each tensor of the architecture the type llama.cpp's quantizer gives it for that
file type (`llama_tensor_get_type` in llama.cpp's src/llama-quant.cpp), times the type's bytes per
value (gguf's GGML_QUANT_SIZES). For the file types here that rule is:

    norms, biases (1-D)           F32, in every file type
    float file types (F16, ...)   every matrix in that type
    output (lm_head)              Q6_K; Q8_0 in a Q8_0 file, or when a row is not whole blocks of the
                                  file's type. A tied embedding is quantized as the output is.
    attn_v, ffn_down              Q6_K in the layers `use_more_bits` picks, in Q4_K_M and Q5_K_M files
    attn_qkv (Qwen3.5)            as attn_v: llama.cpp counts the two together, one a layer
    ssm_conv1d (Qwen3.5)          F32 in every file type (convert_hf_to_gguf writes it so; the quantizer skips it)
    attn_v, 70B models            Q5_K where Q4_K_M gives Q4_K (llama.cpp's LLM_TYPE_70B rule)
    every other matrix            the file type's own format (Q4_K for Q4_K_M, Q5_K for Q5_K_M)
    a row not whole blocks        Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, else F16
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import OptionError
from engine.loading.config import ModelConfig
from engine.weight_memory import WeightMemory

# llama.cpp file type (as `llama-quantize` names it, lower case) -> the format most matrices get.
FILE_TYPE_FORMATS = {
    "f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q6_k": "Q6_K", "q5_k_m": "Q5_K",
    "q4_k_m": "Q4_K", "q5_1": "Q5_1", "q5_0": "Q5_0", "q4_1": "Q4_1", "q4_0": "Q4_0",
}
WEIGHT_FILE_TYPES = tuple(FILE_TYPE_FORMATS)
FLOAT_FORMATS = ("F32", "F16", "BF16")
MORE_BITS_FILE_TYPES = ("q4_k_m", "q5_k_m")   # attn_v and ffn_down get Q6_K in some layers
ROW_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
ROPE_FACTORS = "rope_freqs.weight"   # llama-3.1's rope scaling as a tensor: the engine keeps it as rope_scaling


@dataclass(frozen=True, slots=True)
class PlannedTensor:
    """One tensor of a file, under its GGUF name: shape in torch order (rows first) and storage format."""

    name: str
    shape: tuple[int, ...]
    format: str

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.format, self.shape)


def estimate_weights(config: ModelConfig, file_type: str) -> WeightMemory:
    """The bytes of `config`'s model as a llama.cpp file of `file_type` ("q4_k_m", "Q8_0", ...), by format."""
    return _memory(planned_tensors(config, file_type), file_type.upper())


def gguf_file_weights(path: str | Path) -> WeightMemory:
    """The tensor bytes a GGUF file holds, by format, read from its header (no tensor is read)."""
    from engine.loading.gguf_file import gguf_file_type, read_gguf_header

    header = read_gguf_header(path)
    tensors = [PlannedTensor(e.name, e.shape, e.qtype.name) for e in header.tensors.values() if e.name != ROPE_FACTORS]
    return _memory(tensors, gguf_file_type(path) or "GGUF")


def planned_tensors(config: ModelConfig, file_type: str) -> list[PlannedTensor]:
    """Every tensor of the architecture in llama.cpp's order (by layer), with the format `file_type` gives it."""
    rule = _FileTypeRule(check_file_type(file_type), config)
    return [PlannedTensor(name, shape, rule.format(name, shape)) for name, shape in architecture_tensors(config)]


def check_file_type(file_type: str) -> str:
    """`file_type` in lower case, or a one-line OptionError listing the ones known."""
    lowered = str(file_type).lower()
    if lowered not in FILE_TYPE_FORMATS:
        raise OptionError(f"weights {file_type!r} is not a file type swarm can size; "
                          f"use one of {', '.join(WEIGHT_FILE_TYPES)}")
    return lowered


def architecture_tensors(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The GGUF names and shapes [rows, cols] of a Llama/Mistral/Qwen2/Qwen3/Qwen3.5 model's tensors."""
    hidden, vocab = config.hidden_size, config.vocab_size
    tensors = [("token_embd.weight", (vocab, hidden)), ("output_norm.weight", (hidden,))]
    if not config.tie_word_embeddings:
        tensors.append(("output.weight", (vocab, hidden)))
    linear_layers = set(config.linear_layers)
    for layer in range(config.num_layers):
        parts = _linear_layer_tensors(config) if layer in linear_layers else _layer_tensors(config)
        tensors += [(f"blk.{layer}.{part}", shape) for part, shape in parts]
    return tensors


def tensor_bytes(format: str, shape: tuple[int, ...]) -> int:
    values, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[format]]
    *rows, cols = shape
    assert cols % values == 0, f"a {format} row holds whole blocks of {values} values, not {cols}"
    count = 1
    for size in rows:
        count *= size
    return count * (cols // values) * nbytes


def _layer_tensors(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """A full-attention layer; a hybrid's q_proj also gives each head's output gate (twice the rows)."""
    hidden = config.hidden_size
    q_width, kv_width = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    query_rows = 2 * q_width if config.is_hybrid else q_width
    parts = [("attn_norm.weight", (hidden,)), ("attn_q.weight", (query_rows, hidden)),
             ("attn_k.weight", (kv_width, hidden)), ("attn_v.weight", (kv_width, hidden)),
             ("attn_output.weight", (hidden, q_width))]
    if config.attention_bias:
        parts += [("attn_q.bias", (q_width,)), ("attn_k.bias", (kv_width,)), ("attn_v.bias", (kv_width,))]
    if config.qk_norm:
        parts += [("attn_q_norm.weight", (config.head_dim,)), ("attn_k_norm.weight", (config.head_dim,))]
    return parts + _mlp_tensors(config)


def _linear_layer_tensors(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """A Gated DeltaNet layer of Qwen3.5, under llama.cpp's qwen35 names."""
    shape, hidden = config.linear_attention, config.hidden_size
    assert shape is not None
    heads, value_width = shape.linear_num_value_heads, shape.linear_num_value_heads * shape.linear_value_head_dim
    return [("attn_norm.weight", (hidden,)), ("attn_qkv.weight", (shape.conv_dim, hidden)),
            ("attn_gate.weight", (value_width, hidden)), ("ssm_conv1d.weight", (shape.conv_dim,
                                                                                shape.linear_conv_kernel_dim)),
            ("ssm_dt.bias", (heads,)), ("ssm_a", (heads,)), ("ssm_beta.weight", (heads, hidden)),
            ("ssm_alpha.weight", (heads, hidden)), ("ssm_norm.weight", (shape.linear_value_head_dim,)),
            ("ssm_out.weight", (hidden, value_width))] + _mlp_tensors(config)


def _mlp_tensors(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    hidden, inner = config.hidden_size, config.intermediate_size
    norm = "post_attention_norm.weight" if config.is_hybrid else "ffn_norm.weight"
    return [(norm, (hidden,)), ("ffn_gate.weight", (inner, hidden)), ("ffn_up.weight", (inner, hidden)),
            ("ffn_down.weight", (hidden, inner))]


@dataclass(frozen=True, slots=True)
class _FileTypeRule:
    """llama_tensor_get_type for one file type and model."""

    file_type: str
    config: ModelConfig

    def format(self, name: str, shape: tuple[int, ...]) -> str:
        default = FILE_TYPE_FORMATS[self.file_type]
        if len(shape) == 1 or name.endswith(".ssm_conv1d.weight"):
            return "F32"
        if default in FLOAT_FORMATS:
            return default
        cols = shape[-1]
        if name == "output.weight" or (name == "token_embd.weight" and self.config.tie_word_embeddings):
            return _fitting(_output_format(default, cols), cols)
        if name.endswith((".attn_v.weight", ".attn_qkv.weight", ".ffn_down.weight")):
            return _fitting(self._layer_format(name, default), cols)
        return _fitting(default, cols)

    def _layer_format(self, name: str, default: str) -> str:
        layer = int(name.split(".")[1])
        if self.file_type in MORE_BITS_FILE_TYPES and use_more_bits(layer, self.config.num_layers):
            return "Q6_K"
        if name.endswith(".attn_v.weight") and default == "Q4_K" and _is_70b(self.config):
            return "Q5_K"
        return default


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's pick of the layers whose attn_v and ffn_down get more bits: the first and last
    eighth, and every third layer between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _output_format(default: str, cols: int) -> str:
    if cols % _block_values(default):
        return "Q8_0"
    return default if default == "Q8_0" else "Q6_K"


def _fitting(format: str, cols: int) -> str:
    """llama.cpp's fallback for a row that is not whole blocks of `format`. (For a type it has no
    fallback for, llama.cpp refuses; convert_hf_to_gguf writes F16 then, as here.)"""
    if cols % _block_values(format) == 0:
        return format
    fallback = ROW_FALLBACK.get(format, "F16")
    return fallback if cols % _block_values(fallback) == 0 else "F16"


def _is_70b(config: ModelConfig) -> bool:
    """llama.cpp's LLM_TYPE_70B: 80 layers of Qwen2, or of Llama with grouped-query attention."""
    if config.num_layers != 80:
        return False
    grouped = config.num_kv_heads < config.num_heads
    return config.family == "qwen2" or (config.family in ("llama", "mistral") and grouped)


def _block_values(format: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType[format]][0]


def _memory(tensors: list[PlannedTensor], label: str) -> WeightMemory:
    by_format: dict[str, int] = {}
    for tensor in tensors:
        by_format[tensor.format] = by_format.get(tensor.format, 0) + tensor.nbytes
    ordered = dict(sorted(by_format.items(), key=lambda item: -item[1]))
    return WeightMemory(sum(ordered.values()), ordered, label)
