"""A GGUF file's weights streamed under their Hugging Face names and in their shapes, one tensor at a time:
as the file's blocks where the loader keeps that format, else dequantized to float32.

    token_embd / output_norm / output          -> model.embed_tokens / model.norm / lm_head
    blk.N.attn_q ... ffn_down                  -> model.layers.N.self_attn.q_proj ... mlp.down_proj
    llama and mistral q/k rows                 -> back from llama.cpp's interleaved rotary order
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from engine.errors import ModelLoadError
from engine.loading.gguf_file import ROPE_FACTORS, GGUFHeader, TensorEntry, model_header
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
LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
PERMUTED_FAMILIES = {"llama", "mistral"}  # convert_hf_to_gguf reorders their q/k rows; Qwen's it leaves


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
    weights_in_file = [name for name in header.tensors if name != ROPE_FACTORS]  # that one is rope_scaling
    hf_names = {name: _hf_name(header, name) for name in weights_in_file}
    for name, hf_name in hf_names.items():
        entry = header.tensors[name]
        order = _rotary_row_order(header, name, entry.shape[0])
        if len(entry.shape) == 2 and keep is not None and keep(hf_name, entry.qtype.name, entry.shape):
            value = _blocks(header, entry, order)
        else:
            values = torch.from_numpy(header.read(entry))
            value = values if order is None else values[order]
        header.release(entry)
        yield hf_name, value


def _blocks(header: GGUFHeader, entry: TensorEntry, order: torch.Tensor | None) -> QuantizedTensor:
    raw = header.raw_blocks(entry)
    raw = np.array(raw) if order is None else raw[order.numpy()]   # either way a copy, once
    return QuantizedTensor(torch.from_numpy(raw), entry.qtype.name, entry.shape[1])


def _hf_name(header: GGUFHeader, name: str) -> str:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    match = LAYER_TENSOR.fullmatch(name)
    if not match or match.group(2) not in LAYER_NAMES:
        raise ModelLoadError(f"{header.path}: tensor {name!r} is not part of a {header.family} model "
                             "this engine can load; use a plain llama, mistral, qwen2 or qwen3 GGUF")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{LAYER_NAMES[part]}.{kind}"


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
