"""Building the model a source describes, in one place: weights -> CausalLM -> the file's quantized
copies -> packed layouts. Which kind each linear layer is (engine.linear) is decided here, at load."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import ModelLoadError
from engine.linear import Linear, PackedLinear, QuantizedLinear, swap_linears
from engine.loading.config import ModelConfig
from engine.loading.loader import load_quantized_weights, load_weights
from engine.loading.model_source import ModelSource
from engine.model import CausalLM, RotaryEmbedding
from engine.options import EngineOptions
from kernels.cpu import onednn_linear, quant_matmul
from kernels.cpu.quant_matmul import QuantizedWeight


@dataclass(slots=True)
class LoadedModel:
    """The built model and what its weights take."""

    net: CausalLM
    weight_bytes: int      # everything the weights hold: the float tensors and the quantized copies
    quantized_bytes: int   # the file's quantized blocks, kept beside the float32 weights for decode
    packed: int            # weights in oneDNN's layout (0: torch multiplies them all)


def load_model(source: ModelSource, config: ModelConfig, device: torch.device, dtype: torch.dtype,
               options: EngineOptions) -> LoadedModel:
    """The model `config` describes, with the weights of `source`. On a CPU in float32, each linear
    layer whose weight the file stores in blocks the decode kernel reads becomes a QuantizedLinear
    (options.quantized_decode), and float weights go into oneDNN's layout (options.onednn_weights)."""
    net = _build_net(config, load_weights(source), device, dtype)
    float_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    cpu_float32 = device.type == "cpu" and dtype == torch.float32
    quantized_bytes = 0
    if options.quantized_decode and cpu_float32:
        quantized_bytes = _attach_quantized(net, load_quantized_weights(source))
    packed = 0
    if options.onednn_weights and cpu_float32:
        packed = _pack_weights(net, options.max_num_batched_tokens)
    return LoadedModel(net, float_bytes + quantized_bytes, quantized_bytes, packed)


def _build_net(config: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device,
                dtype: torch.dtype) -> CausalLM:
    """The CausalLM with every parameter taken from `weights` (Hugging Face names), every layer a Linear."""
    with torch.device("meta"):
        model = CausalLM(config)
    expected = dict(model.state_dict())
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = [name for name in expected if name not in weights]
    if missing:
        raise ModelLoadError(f"the checkpoint lacks tensor {missing[0]!r} ({len(missing)} missing)")
    state = {}
    for name, tensor in weights.items():
        if name not in expected:
            continue
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, "
                                 f"the config implies {tuple(expected[name].shape)}")
        state[name] = tensor.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = RotaryEmbedding(config).to(device)
    return model.eval()


def _attach_quantized(net: CausalLM, quantized: dict[str, QuantizedWeight]) -> int:
    """Makes each linear layer whose weight the file stores in blocks the decode kernel reads a
    QuantizedLinear; an lm_head tied to the embedding takes the embedding's blocks. Bytes the copies hold."""
    if not quantized or not quant_matmul.available():
        return 0
    if net.config.tie_word_embeddings and "model.embed_tokens.weight" in quantized:
        quantized = {**quantized, "lm_head.weight": quantized["model.embed_tokens.weight"]}

    def quantize(name: str, layer: Linear | PackedLinear) -> QuantizedLinear | None:
        weight = quantized.get(f"{name}.weight")
        if weight is None or weight.shape != (layer.out_features, layer.in_features):
            return None
        return QuantizedLinear(weight, layer)

    swap_linears(net, quantize)
    held = {id(m.quantized.codes): m.quantized.nbytes for m in net.modules() if isinstance(m, QuantizedLinear)}
    return sum(held.values())


def _pack_weights(net: CausalLM, rows: int) -> int:
    """Makes each Linear a PackedLinear laid out for steps of about `rows` rows, except an lm_head tied
    to the embedding: it keeps the plain layout the embedding reads. The number of weights packed
    (0 where this torch has no oneDNN)."""
    if not onednn_linear.available():
        return 0
    embedding = net.model.embed_tokens.weight

    def pack(name: str, layer: Linear | PackedLinear) -> PackedLinear | None:
        if not isinstance(layer, Linear) or layer.weight is embedding:
            return None
        return PackedLinear(layer, rows)

    return len(swap_linears(net, pack))
