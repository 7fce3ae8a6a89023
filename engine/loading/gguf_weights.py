"""A GGUF file's weights streamed under their Hugging Face names and in their shapes, one tensor at a time:
as the file's blocks where the loader keeps that format, else dequantized to float32.

    token_embd / output_norm / output          -> model.embed_tokens / model.norm / lm_head
    blk.N.attn_q ... ffn_down                  -> model.layers.N.self_attn.q_proj ... mlp.down_proj
    llama and mistral q/k rows                 -> back from llama.cpp's interleaved rotary order
    qwen35 (Qwen3.5): attn_qkv, attn_gate, ssm_* -> model.layers.N.linear_attn.*, undoing what
        convert_hf_to_gguf changed: norms stored as 1 + w, A stored as -exp(A_log), conv1d squeezed, and
        value heads "tiled" for ggml's broadcast (see VALUE_HEADS_TILED)
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES

from engine.errors import ModelLoadError
from engine.loading.gguf_file import ROPE_FACTORS, GGUFHeader, TensorEntry, model_header, text_block_count
from kernels.reference.quant_blocks import QuantizedTensor

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
QWEN35_LAYER_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight", "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A_log", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}
LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)(\.weight|\.bias|)")
PERMUTED_FAMILIES = {"llama", "mistral"}  # convert_hf_to_gguf reorders their q/k rows; Qwen's it leaves
# Qwen3.5's norms computing x·(1 + w), which convert_hf_to_gguf stores as 1 + w (not the Gated DeltaNet's own)
ZERO_CENTRED_NORMS = ("layernorm.weight", "model.norm.weight", "q_norm.weight", "k_norm.weight")


def read_gguf_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every weight dequantized to float32, under its Hugging Face name and in its [out, in] shape."""
    return dict(iter_gguf_weights(path))


KeepBlocks = Callable[[str, str, tuple[int, ...]], bool]


def iter_gguf_weights(path: str | Path, keep: KeepBlocks | None = None
                      ) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """Each weight under its Hugging Face name, one at a time in the file's order, so that a load
    holds one tensor in flight: as the file's blocks (a QuantizedTensor owning a copy of them) where
    `keep(hf_name, format, shape)` says so, else dequantized to float32. Every name is checked
    before any tensor is read."""
    header = model_header(path)
    prediction = _prediction_tensors(header)
    if prediction:
        warnings.warn(f"skipped {len(prediction)} multi-token-prediction tensors of {header.path.name}: "
                      "swarm runs the text model only", stacklevel=2)
    weights_in_file = [name for name in header.tensors   # rope_freqs is rope_scaling, read with the config
                       if name != ROPE_FACTORS and name not in prediction]
    hf_names = {name: _hf_name(header, name) for name in weights_in_file}
    for name, hf_name in hf_names.items():
        entry = header.tensors[name]
        order = _stored_order(header, name, hf_name, entry.shape[0])
        columns = _column_order(header, hf_name)
        if (keep is not None and _can_keep(hf_name, entry, columns)
                and keep(hf_name, entry.qtype.name, entry.shape)):
            value = _blocks(header, entry, order, columns)
        else:
            value = _float_value(header, entry, hf_name, order, columns)
        header.release(entry)
        yield hf_name, value


def _prediction_tensors(header: GGUFHeader) -> set[str]:
    """The tensors of the layers after the model's own that nextn_predict_layers says the file appends."""
    if not header.arch_value("nextn_predict_layers", 0):
        return set()
    layers = text_block_count(header)
    return {name for name in header.tensors
            if (match := re.match(r"blk\.(\d+)\.", name)) and int(match.group(1)) >= layers}


def _can_keep(hf_name: str, entry: TensorEntry, columns: torch.Tensor | None) -> bool:
    """A matrix of a linear layer whose columns, if they move, move in whole blocks."""
    if len(entry.shape) != 2 or hf_name.endswith("conv1d.weight"):
        return False
    return columns is None or len(_block_columns(columns, entry)) > 0


def _float_value(header: GGUFHeader, entry: TensorEntry, hf_name: str, order: torch.Tensor | None,
                 columns: torch.Tensor | None) -> torch.Tensor:
    values = torch.from_numpy(header.read(entry))
    values = values if order is None else values[order]
    values = values if columns is None else values[:, columns]
    return _qwen35_value(hf_name, values) if header.family == "qwen35" else values


def _qwen35_value(hf_name: str, values: torch.Tensor) -> torch.Tensor:
    """The checkpoint's value of what convert_hf_to_gguf stored as 1 + w, -exp(A_log) or a squeezed conv1d."""
    if hf_name.endswith(ZERO_CENTRED_NORMS):
        return values - 1.0
    if hf_name.endswith(".A_log"):
        return torch.log(-values.reshape(-1))
    if hf_name.endswith(".dt_bias"):
        return values.reshape(-1)
    if hf_name.endswith("conv1d.weight"):
        return values.reshape(values.shape[0], 1, -1)
    return values


def _blocks(header: GGUFHeader, entry: TensorEntry, order: torch.Tensor | None,
            columns: torch.Tensor | None) -> QuantizedTensor:
    raw = header.raw_blocks(entry)
    raw = np.array(raw) if order is None else raw[order.numpy()]   # either way a copy, once
    if columns is not None:
        block_bytes = GGML_QUANT_SIZES[entry.qtype][1]
        by_block = raw.reshape(raw.shape[0], -1, block_bytes)
        raw = np.ascontiguousarray(by_block[:, _block_columns(columns, entry).numpy()].reshape(raw.shape))
    return QuantizedTensor(torch.from_numpy(raw), entry.qtype.name, entry.shape[1])


def _block_columns(columns: torch.Tensor, entry: TensorEntry) -> torch.Tensor:
    """The order of whole blocks a column order moves, or an empty tensor where it splits a block."""
    block = GGML_QUANT_SIZES[entry.qtype][0]
    firsts = columns[::block]
    if len(columns) % block or not torch.equal(columns, (firsts[:, None] + torch.arange(block)).reshape(-1)):
        return columns[:0]
    return firsts // block if torch.all(firsts % block == 0) else columns[:0]


def _hf_name(header: GGUFHeader, name: str) -> str:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    match = LAYER_TENSOR.fullmatch(name)
    layer, part, kind = match.groups() if match else (None, "", "")
    qwen35_names = QWEN35_LAYER_NAMES if header.family == "qwen35" else {}
    if part + kind in qwen35_names:
        return f"model.layers.{layer}.{qwen35_names[part + kind]}"
    if not match or not kind or part not in LAYER_NAMES:
        raise ModelLoadError(f"{header.path}: tensor {name!r} is not part of a {header.family} model "
                             "this engine can load; use a plain llama, mistral, qwen2, qwen3 or qwen35 GGUF")
    return f"model.layers.{layer}.{LAYER_NAMES[part]}{kind}"


def _stored_order(header: GGUFHeader, name: str, hf_name: str, rows: int) -> torch.Tensor | None:
    """The row order that gives back the checkpoint's rows, or None for a tensor stored in that order."""
    if header.family == "qwen35":
        return _value_head_rows(header, hf_name)
    return _rotary_row_order(header, name, rows)


def _rotary_row_order(header: GGUFHeader, name: str, rows: int) -> torch.Tensor | None:
    """convert_hf_to_gguf reorders each head's q/k rows from Hugging Face's rotate-half layout to
    llama.cpp's interleaved pairs: rows (0..d/2, d/2..d) become (0, d/2, 1, d/2+1, ...). The row
    order that undoes it, or None for a tensor that was not reordered."""
    if header.family not in PERMUTED_FAMILIES or not (".attn_q." in name or ".attn_k." in name):
        return None
    heads = header.arch_count("attention.head_count")
    if ".attn_k." in name:
        heads = header.arch_count("attention.head_count_kv", heads)
    if rows % (2 * heads):
        raise ModelLoadError(f"{header.path}: tensor {name} has {rows} rows, which {heads} heads "
                             "cannot share; the metadata and the tensors disagree")
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


# VALUE_HEADS_TILED: where Qwen3.5 has fewer key heads than value heads, the checkpoint groups the value heads by
# the key head they share (k0: v0 v1, k1: v2 v3) and convert_hf_to_gguf tiles them (v0 v2, v1 v3: k0 k1, k0 k1)
# in every tensor with a row, element or column per value head. These orders put them back.

def _value_head_rows(header: GGUFHeader, hf_name: str) -> torch.Tensor | None:
    key_heads, key_dim = header.arch_count("ssm.group_count"), header.arch_count("ssm.state_size")
    value_dim = header.arch_count("ssm.inner_size") // header.arch_count("ssm.time_step_rank")
    if hf_name.endswith(("in_proj_qkv.weight", "conv1d.weight")):   # q and k rows stay, v rows move
        before_v = 2 * key_heads * key_dim
        v_rows = _grouped_value_heads(header, value_dim)
        return None if v_rows is None else torch.cat((torch.arange(before_v), before_v + v_rows))
    if hf_name.endswith("in_proj_z.weight"):
        return _grouped_value_heads(header, value_dim)
    if hf_name.endswith(("in_proj_a.weight", "in_proj_b.weight", ".A_log", ".dt_bias")):
        return _grouped_value_heads(header, 1)
    return None


def _column_order(header: GGUFHeader, hf_name: str) -> torch.Tensor | None:
    if header.family != "qwen35" or not hf_name.endswith("out_proj.weight"):
        return None
    return _grouped_value_heads(header, header.arch_count("ssm.inner_size") // header.arch_count("ssm.time_step_rank"))


def _grouped_value_heads(header: GGUFHeader, width: int) -> torch.Tensor | None:
    """The index into tiled value heads (`width` entries each) that gives them grouped, or None if nothing moved."""
    key_heads, value_heads = header.arch_count("ssm.group_count"), header.arch_count("ssm.time_step_rank")
    if key_heads == value_heads:
        return None
    if value_heads % key_heads:
        raise ModelLoadError(f"{header.path}: ssm.time_step_rank {value_heads} is not a multiple of "
                             f"ssm.group_count {key_heads}; the GGUF file is corrupt")
    per_key = value_heads // key_heads
    return torch.arange(value_heads * width).reshape(per_key, key_heads, width).transpose(0, 1).reshape(-1)
