"""Tiny Qwen3.5 GGUF files (architecture "qwen35"), written from a transformers model the way llama.cpp's
convert_hf_to_gguf writes them (conversion/qwen.py, Qwen3_5TextModel):

    names        linear_attn.in_proj_qkv / in_proj_z / in_proj_b / in_proj_a -> attn_qkv / attn_gate / ssm_beta /
                 ssm_alpha; conv1d, dt_bias, A_log, norm, out_proj -> ssm_conv1d, ssm_dt.bias, ssm_a, ssm_norm,
                 ssm_out; post_attention_layernorm -> post_attention_norm
    values       every norm but the Gated DeltaNet's stored as 1 + w; A_log as -exp(A_log); conv1d squeezed
    value heads  grouped by key head in the checkpoint, tiled in the file (where key heads < value heads)
    metadata     ssm.conv_kernel, ssm.state_size (key head dim), ssm.group_count (key heads), ssm.time_step_rank
                 (value heads), ssm.inner_size, full_attention_interval, rope.dimension_count
"""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from tests.helpers.tiny_gguf import GLOBAL_PARTS, LAYER_PARTS, _finish, _hparams, _sub_type

LINEAR_PARTS = {
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a", "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
}


def write_qwen35(path: Path, model, qtype: Q, conv1d_type: Q = Q.F32, mtp_layer: bool = False) -> Path:
    """`model` (a transformers Qwen3_5ForCausalLM) as a qwen35 GGUF, its matrices in `qtype` (1-D tensors and the
    conv1d F32, as convert_hf_to_gguf writes them; `conv1d_type` F16 stores it so instead). `mtp_layer`: one more
    layer after the model's, of multi-token-prediction tensors (random), as the converter appends Qwen3.5's."""
    config = model.config
    writer = gguf.GGUFWriter(path, "qwen35")
    writer.add_name("tiny-qwen35")
    layers = config.num_hidden_layers
    mtp = {"qwen35.block_count": (layers + 1, V.UINT32), "qwen35.nextn_predict_layers": (1, V.UINT32)}
    for key, (value, kind) in (metadata(config) | (mtp if mtp_layer else {})).items():
        writer.add_key_value(key, value, kind, sub_type=_sub_type(value, kind))
    if mtp_layer:
        hidden = config.hidden_size
        writer.add_tensor(f"blk.{layers}.nextn.eh_proj.weight", np.ones((hidden, 2 * hidden), np.float32))
        writer.add_tensor(f"blk.{layers}.attn_norm.weight", np.ones(hidden, np.float32))
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = stored_values(hf_name, tensor.float(), config).numpy()
        writer.add_tensor(gguf_name(hf_name), *_encoded(values, conv1d_type if "conv1d" in hf_name else qtype))
    _finish(writer)
    return path


def metadata(config) -> dict:
    arch = "qwen35"
    tokens = [f"t{i}" for i in range(config.vocab_size - 2)] + ["t", "0"]   # and one merge, t 0 -> t0
    rotary_dim = int(config.head_dim * config.rope_parameters["partial_rotary_factor"])
    # llama.cpp's multi-section rotary: pairs of dims per section (on text every section turns alike)
    pairs = rotary_dim // 2
    return _hparams(config, arch) | {
        f"{arch}.ssm.conv_kernel": (config.linear_conv_kernel_dim, V.UINT32),
        f"{arch}.ssm.state_size": (config.linear_key_head_dim, V.UINT32),
        f"{arch}.ssm.group_count": (config.linear_num_key_heads, V.UINT32),
        f"{arch}.ssm.time_step_rank": (config.linear_num_value_heads, V.UINT32),
        f"{arch}.ssm.inner_size": (config.linear_value_head_dim * config.linear_num_value_heads, V.UINT32),
        f"{arch}.full_attention_interval": (full_attention_interval(config.layer_types), V.UINT32),
        f"{arch}.rope.dimension_count": (rotary_dim, V.UINT32),
        f"{arch}.rope.dimension_sections": ([pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0], V.ARRAY),
        "tokenizer.ggml.model": ("gpt2", V.STRING),
        "tokenizer.ggml.tokens": (tokens, V.ARRAY),
        "tokenizer.ggml.merges": (["t 0"], V.ARRAY),   # llama.cpp's loader wants merges
    }


def full_attention_interval(layer_types: list[str]) -> int:
    """The interval llama.cpp's file says the layers follow (it cannot say any other pattern)."""
    interval = layer_types.index("full_attention") + 1
    assert all((kind == "full_attention") == ((i + 1) % interval == 0) for i, kind in enumerate(layer_types))
    return interval


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL_PARTS:
        return GLOBAL_PARTS[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    if rest in LINEAR_PARTS:
        return f"blk.{layer}.{LINEAR_PARTS[rest]}"
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_PARTS[part]}.{kind}"


def stored_values(hf_name: str, values: torch.Tensor, config) -> torch.Tensor:
    """What convert_hf_to_gguf stores for a checkpoint tensor (before the file's type)."""
    values = tile_value_heads(hf_name, values, config)
    if hf_name.endswith(".A_log"):
        return -torch.exp(values)
    if hf_name.endswith("conv1d.weight"):
        return values.squeeze(1)
    if hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
        return values + 1
    return values


def tile_value_heads(hf_name: str, values: torch.Tensor, config) -> torch.Tensor:
    """_LinearAttentionVReorderBase: value heads grouped by key head [k, v/k, d] become tiled [v/k, k, d]."""
    keys, heads = config.linear_num_key_heads, config.linear_num_value_heads
    if keys == heads or "linear_attn." not in hf_name:
        return values
    key_width, value_width = keys * config.linear_key_head_dim, config.linear_value_head_dim

    def tiled(part: torch.Tensor, width: int, dim: int = 0) -> torch.Tensor:
        part = part.movedim(dim, 0)
        shape = part.shape
        part = part.reshape(keys, heads // keys, width, *shape[1:]).transpose(0, 1).reshape(shape)
        return part.movedim(0, dim).contiguous()

    if hf_name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        return torch.cat((values[:2 * key_width], tiled(values[2 * key_width:], value_width)))
    if hf_name.endswith("in_proj_z.weight"):
        return tiled(values, value_width)
    if hf_name.endswith(("in_proj_a.weight", "in_proj_b.weight", ".A_log", ".dt_bias")):
        return tiled(values, 1)
    if hf_name.endswith("out_proj.weight"):
        return tiled(values, value_width, dim=1)
    return values


def _encoded(values: np.ndarray, qtype: Q) -> tuple:
    """(data, raw_shape, raw_dtype) for GGUFWriter.add_tensor."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if values.ndim == 1 or qtype == Q.F32 or values.shape[-1] % block:
        return values.astype(np.float32), None, None
    return gguf.quants.quantize(values, qtype), None, qtype


def round_like_the_file(model, qtype: Q, conv1d_type: Q = Q.F32) -> None:
    """Sets every matrix of `model` (and conv1d kernel) to what the file's type keeps of it, so that transformers on
    the model and the engine on the file run the same weights. (Value heads move whole rows, or columns inside
    out_proj's one block a row in the tiny models: neither changes what a block keeps.)"""
    with torch.no_grad():
        for name, param in model.named_parameters():
            kind = conv1d_type if name.endswith("conv1d.weight") else qtype
            stored = param.reshape(param.shape[0], -1)
            if param.dim() < 2 or kind == Q.F32 or stored.shape[-1] % gguf.GGML_QUANT_SIZES[kind][0]:
                continue
            kept = gguf.quants.dequantize(gguf.quants.quantize(stored.numpy(), kind), kind)
            param.copy_(torch.from_numpy(kept).reshape(param.shape))


def kquant_sized_model(seed: int = 0):
    """A random transformers Qwen3.5 whose every matrix row is whole K-quant super-blocks (256 values), in 8
    layers (6 Gated DeltaNet, 2 full attention), for llama.cpp's quantizer."""
    import transformers

    config = transformers.Qwen3_5TextConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=8, full_attention_interval=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=64, linear_value_head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
