"""Building the model a source describes, in one place: the tensors stream in one at a time, each
becoming a parameter of the engine's dtype or staying in its block format (engine.loading.weight_plan),
then the layers whose weight stayed in blocks become quantized layers (engine.quantized_layers) and
float weights on a CPU go into oneDNN's layout.

The host holds one tensor in flight, so a load's peak is what the model keeps plus one tensor
dequantized (a GGUF file's pages count while they are read: the file is memory-mapped).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import ModelLoadError, OptionError
from engine.hybrid_model import HybridCausalLM
from engine.linear import Linear, PackedLinear, swap_linears
from engine.loading.config import ModelConfig
from engine.loading.loader import iter_weights
from engine.loading.model_source import ModelSource
from engine.loading.weight_plan import FORMAT_OF_DTYPE, WeightPlan, check_weight_scheme
from engine.model import CausalLM, RotaryEmbedding
from engine.options import QUANTIZE_SCHEMES, EngineOptions
from engine.quantized_layers import QuantizedEmbedding, QuantizedLinear
from engine.weight_memory import WeightMemory
from kernels.cpu import onednn_linear
from kernels.reference.quant_blocks import QuantizedTensor
from kernels.reference.quant_matmul import DequantScratch

EMBEDDING = "model.embed_tokens.weight"


@dataclass(slots=True)
class LoadedModel:
    """The built model and what its weights take."""

    net: CausalLM
    weights: WeightMemory
    packed: int            # weights in oneDNN's layout (0: torch multiplies them all)


def load_model(source: ModelSource, config: ModelConfig, device: torch.device, dtype: torch.dtype,
               options: EngineOptions) -> LoadedModel:
    """The model `config` describes, with the weights of `source` kept as options.weights says."""
    plan = WeightPlan(check_weight_scheme(options.weights, source.kind), dtype)
    if config.is_hybrid and plan.scheme in QUANTIZE_SCHEMES:
        raise OptionError(f"weights {plan.scheme!r} is not supported for Qwen3.5 yet (its linear-attention layers "
                          "have no quantized kernels); use weights: auto or float")
    with torch.device("meta"):
        net = HybridCausalLM(config) if config.is_hybrid else CausalLM(config)
    quantized = _read_weights(net, source, plan, device, dtype)
    _swap_quantized(net, quantized, dtype)
    net.model.rotary_emb = RotaryEmbedding(config).to(device)
    _check_complete(net)
    packed = 0
    if options.onednn_weights and device.type == "cpu" and dtype == torch.float32:
        packed = _pack_weights(net, options.max_num_batched_tokens)
    note = plan.dequantized.note()
    if note:
        warnings.warn(note, stacklevel=2)
    return LoadedModel(net.eval(), _weight_memory(net, source, plan, dtype), packed)


def _read_weights(net: CausalLM, source: ModelSource, plan: WeightPlan, device: torch.device,
                  dtype: torch.dtype) -> dict[str, QuantizedTensor]:
    """Puts each float tensor of `source` into `net` as it is read; the matrices kept in blocks are
    returned, under their names, on `device`."""
    expected = {name: tuple(t.shape) for name, t in net.state_dict(keep_vars=True).items()}
    if net.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    quantized = {}
    for name, value in iter_weights(source, plan.keep):
        if name not in expected:
            continue
        if tuple(value.shape) != expected[name]:
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(value.shape)}, the config implies {expected[name]}")
        value = plan.quantize(value) if isinstance(value, torch.Tensor) else value
        if isinstance(value, QuantizedTensor):
            quantized[name] = value.to(device)
        else:
            _set_parameter(net, name, value.to(device=device, dtype=dtype))
    return quantized


def _set_parameter(net: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attribute = name.rpartition(".")
    setattr(net.get_submodule(module_name), attribute, nn.Parameter(value, requires_grad=False))


def _swap_quantized(net: CausalLM, quantized: dict[str, QuantizedTensor], dtype: torch.dtype) -> None:
    """The layers whose weight stayed in blocks become quantized layers sharing one scratch; a tied
    lm_head reads the embedding's blocks, or its float weight."""
    scratch = DequantScratch()
    if EMBEDDING in quantized:
        net.model.embed_tokens = QuantizedEmbedding(quantized[EMBEDDING], dtype)
    if net.config.tie_word_embeddings:
        if EMBEDDING in quantized:
            quantized = {**quantized, "lm_head.weight": quantized[EMBEDDING]}
        else:
            net.lm_head.weight = net.model.embed_tokens.weight

    def make(name: str, layer: Linear | PackedLinear) -> QuantizedLinear | None:
        weight = quantized.get(f"{name}.weight")
        return None if weight is None else QuantizedLinear(weight, layer.bias, scratch)

    swap_linears(net, make)


def _check_complete(net: CausalLM) -> None:
    missing = [name for name, t in net.state_dict(keep_vars=True).items() if t.is_meta]
    if missing:
        raise ModelLoadError(f"the checkpoint lacks tensor {missing[0]!r} ({len(missing)} missing)")


def _pack_weights(net: CausalLM, rows: int) -> int:
    """Makes each float Linear a PackedLinear laid out for steps of about `rows` rows, except an lm_head
    tied to a float embedding: it keeps the plain layout the embedding reads. The number of weights
    packed (0 where this torch has no oneDNN)."""
    if not onednn_linear.available():
        return 0
    embedding = getattr(net.model.embed_tokens, "weight", None)

    def pack(name: str, layer: Linear | PackedLinear) -> PackedLinear | None:
        if not isinstance(layer, Linear) or layer.weight is embedding:
            return None
        return PackedLinear(layer, rows)

    return len(swap_linears(net, pack))


def _weight_memory(net: CausalLM, source: ModelSource, plan: WeightPlan, dtype: torch.dtype) -> WeightMemory:
    """Every tensor the weights hold, once each (a tied lm_head shares the embedding's), by format."""
    held: dict[int, tuple[str, int]] = {}
    for module in net.modules():
        if isinstance(module, (QuantizedLinear, QuantizedEmbedding)):
            held[id(module.quantized.blocks)] = (module.quantized.format, module.quantized.nbytes)
    for param in net.parameters():   # each once, shared ones too; packed (oneDNN) tensors have no storage
        held[id(param)] = (FORMAT_OF_DTYPE[param.dtype], param.numel() * param.element_size())
    by_format: dict[str, int] = {}
    for format, nbytes in held.values():
        by_format[format] = by_format.get(format, 0) + nbytes
    by_format = dict(sorted(by_format.items(), key=lambda kv: -kv[1]))
    return WeightMemory(sum(by_format.values()), by_format, _label(source, plan, dtype, by_format))


def _label(source: ModelSource, plan: WeightPlan, dtype: torch.dtype, by_format: dict[str, int]) -> str:
    """The file's stated type ("Q4_K_M"), else the format holding the most bytes; the scheme a
    checkpoint was quantized with; or the dtype."""
    if plan.scheme not in ("auto", "float"):
        return plan.scheme.upper()
    if source.kind == "gguf" and plan.scheme == "auto":
        from engine.loading.gguf_file import gguf_file_type
        return gguf_file_type(source.path) or next(iter(by_format))
    return FORMAT_OF_DTYPE[dtype]
