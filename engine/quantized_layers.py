"""Layers whose weight stays in its file's block format (a QuantizedTensor), and which kernel multiplies
it on each device:

    CPU, float32, a few rows, a format the C kernel reads   kernels.cpu.quant_matmul straight from the blocks
      (not prompt rows that take bfloat16 products: engine.prompt_matmul), through a WeightSet
      (kernels.cpu.weight_set) of the layer alone or of the layers that take the same x; in bfloat16
      products from the layers' code panels where the engine keeps them (engine.code_panels)
    GPU, a format the Triton kernels read                    kernels.triton.quant_matmul (decode and prefill)
    CPU prompt rows in swarm's integer precision,            kernels.cpu.code_prompt: x quantized to int8, times
      a layer that keeps code panels                         the code panels' integer codes
    CPU prompt rows in swarm's bfloat16 precision            kernels.cpu.bf16_matmul: the blocks laid out in
      (engine.prompt_matmul: AVX512-BF16 where oneDNN's        bfloat16 panels into the scratch, a tile at a time
      bf16 mode rounds its sums)
    anything else (CPU prefill, other formats, dtypes)       tiles of the weight dequantized into one scratch
                                                             buffer the whole model shares, then the GEMM of
                                                             torch (on a CPU, the C kernel expands the tiles)

No layer holds a float copy of its weight: the scratch holds one tile at a time, so the model's
resident bytes are the file's, and the copies the engine lays out for its CPU kernels where it keeps them
(engine.packed_weights, engine.code_panels), which its weight count shows.
"""
from __future__ import annotations

import torch
from torch import nn

from engine import prompt_matmul
from kernels.cpu import bf16_matmul as bf16_kernel
from kernels.cpu import code_prompt
from kernels.cpu import quant_matmul as cpu_kernel
from kernels.cpu.weight_set import WeightSet
from kernels.reference import gguf_dequant
from kernels.reference.quant_blocks import QuantizedTensor
from kernels.reference.quant_matmul import DequantScratch, dequant_matmul


class QuantizedLinear(nn.Module):
    """y = x @ W.T + bias with W kept as its blocks; `scratch` is shared by every layer of a model."""

    def __init__(self, weight: QuantizedTensor, bias: torch.Tensor | None, scratch: DequantScratch):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.quantized = weight
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.scratch = scratch
        on_cpu = weight.device.type == "cpu"
        self._cpu_kernel = on_cpu and cpu_kernel.supports(weight.format) and cpu_kernel.available()
        self._triton = None if on_cpu else _triton_matmul(weight.format)
        self._expand = _cpu_expander(weight.format) if on_cpu else None
        self._weight_sets: dict[tuple[int, ...], tuple[tuple[nn.Module, ...], WeightSet]] = {}
        self.decode_products = "float32"   # of the rows the C kernel takes (engine.prompt_matmul.choose_decode)
        self.panels: torch.Tensor | None = None   # the weight packed once in bfloat16 (engine.packed_weights)
        self.code_panels: torch.Tensor | None = None   # its codes laid out for decode rows (engine.code_panels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alone = together([self], x)   # a few float32 rows on the C kernel; prompt rows in integer products
        if alone is not None:
            return alone[0]
        if self._triton is not None:
            return self._triton(x, self.quantized, self.bias)
        if self.panels is not None:
            return bf16_kernel.packed_linear(x, self.panels, self.out_features, self.bias)
        if prompt_matmul.kernel_now() and x.is_cpu and bf16_kernel.available():
            return bf16_kernel.quantized_linear(x, self.quantized, self.bias, self.scratch)
        return prompt_matmul.with_step_precision(dequant_matmul, x, self.quantized, self.bias, self.scratch,
                                                 dequantize=self._expand)

    def use_panels(self, panels: torch.Tensor) -> None:
        """Every CPU row multiplies these bfloat16 panels of the weight from now on (engine.packed_weights)."""
        self.panels = panels
        self._weight_sets.clear()

    def use_code_panels(self, panels: torch.Tensor) -> None:
        """Decode rows in bfloat16 products multiply these code panels from now on (engine.code_panels)."""
        self.code_panels = panels
        self._weight_sets.clear()

    @property
    def on_cpu_kernel(self) -> bool:
        """Whether a few float32 CPU rows go to the C kernel (kernels.cpu.quant_matmul)."""
        return self._cpu_kernel

    def weight_set_with(self, others: tuple[QuantizedLinear, ...]) -> WeightSet:
        """The CPU kernel's WeightSet of this layer's weight and then the others', in this layer's decode_products,
        made on first use."""
        layers = (self, *others)
        codes = (self.decode_products in ("bfloat16", "int8")
                 and all(layer.code_panels is not None for layer in layers))
        int8 = codes and self.decode_products == "int8"
        bf16 = self.decode_products == "bfloat16" or (self.decode_products == "int8" and not codes)
        packed = bf16 and all(layer.panels is not None for layer in layers)
        key = (bf16, packed, codes, int8, *(id(layer) for layer in others))
        if key not in self._weight_sets:   # the layers stay in the value, so their ids are not reused
            self._weight_sets[key] = layers, WeightSet(
                [layer.quantized for layer in layers], [layer.bias for layer in layers], bf16=bf16,
                panels=[layer.panels for layer in layers] if packed else None,
                code_panels=[layer.code_panels for layer in layers] if codes else None, int8=int8)
        return self._weight_sets[key][1]

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.quantized.format}"


def use_decode_products(model: nn.Module, precision: str) -> None:
    """Every quantized layer of `model` takes `precision` ("float32", "bfloat16" or "int8": integer products where
    the layer keeps code panels, bfloat16 ones where not) for the rows the C kernel takes
    (engine.prompt_matmul.choose_decode); set before the first step."""
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            module.decode_products = precision


def together(layers: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor] | None:
    """[layer(x) for layer in layers], bit for bit, in one call of the CPU kernel where every layer would take
    it alone (a decode step's q, k and v; its gate and up: the threads wake once for all; prompt rows in integer
    products: x quantized once); None where not."""
    if (prompt_matmul.int8_now() and x.is_cpu
            and all(isinstance(layer, QuantizedLinear) and layer.code_panels is not None for layer in layers)):
        return code_prompt.linear_many(x, [layer.code_panels for layer in layers],
                                       [layer.quantized.format for layer in layers],
                                       [layer.out_features for layer in layers], [layer.bias for layer in layers])
    if not (all(isinstance(layer, QuantizedLinear) and layer._cpu_kernel for layer in layers)
            and cpu_kernel.usable(x) and not prompt_matmul.bfloat16_now()):
        return None
    return layers[0].weight_set_with(tuple(layers[1:]))(x)


def each_of(layers: list[nn.Module], x: torch.Tensor) -> list[torch.Tensor]:
    """[layer(x) for layer in layers], together where they can be."""
    return together(layers, x) or [layer(x) for layer in layers]


class QuantizedEmbedding(nn.Module):
    """Token embeddings kept as their blocks: a lookup dequantizes only the rows it reads."""

    def __init__(self, weight: QuantizedTensor, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.quantized = weight
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return gguf_dequant.dequantize_rows(self.quantized, ids, self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings} x {self.embedding_dim}, {self.quantized.format}"


def _triton_matmul(format: str):
    """The Triton matmul where it reads `format`, else None (PyTorch dequantizes)."""
    try:
        from kernels.triton import quant_matmul as triton_kernel  # imports triton: only on a GPU
    except ImportError:   # a torch build without triton
        return None
    return triton_kernel.quant_matmul if triton_kernel.supports(format) else None


def _cpu_expander(format: str):
    """The C expansion of a tile of blocks into float32, where the kernel reads the format; else None
    (PyTorch's)."""
    if not (cpu_kernel.supports(format) and cpu_kernel.available()):
        return None

    def expand(weight: QuantizedTensor, rows: tuple[int, int], out: torch.Tensor) -> torch.Tensor:
        if out.dtype != torch.float32:
            return gguf_dequant.dequantize(weight, rows, out=out, dtype=out.dtype)
        return cpu_kernel.dequantize(weight, rows, out)

    return expand
