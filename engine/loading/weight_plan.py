"""Which weights a load keeps in a block format, and which it turns into floats (EngineOptions.weights):

    auto    a GGUF file's matrices stay in the file's formats (KEPT_FORMATS); a Hugging Face
            checkpoint's tensors take the engine's dtype, as they always did
    float   everything becomes the engine's dtype (a GGUF file is dequantized at load)
    q8_0, q5_1, q5_0, q4_1, q4_0
            a Hugging Face checkpoint's matrices are quantized at load by gguf's own quantizer

A float format narrower than the engine's dtype stays as it is (an F16 matrix on a float32 CPU engine);
one as wide or wider becomes the engine's dtype. Any block format the kernels do not read is
dequantized at load, and the plan remembers which tensors that was and what it cost, for the note.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.errors import OptionError
from engine.options import QUANTIZE_SCHEMES, WEIGHT_SCHEMES
from kernels.reference.quant_blocks import FLOAT_DTYPES, KEPT_FORMATS, QuantizedTensor, block_layout, row_bytes

FORMAT_OF_DTYPE = {dtype: name for name, dtype in FLOAT_DTYPES.items()}


def check_weight_scheme(scheme: str, source_kind: str) -> str:
    """The scheme in lower case, or a one-line OptionError saying what to use instead."""
    lowered = str(scheme).lower()
    if lowered not in WEIGHT_SCHEMES:
        raise OptionError(f"weights {scheme!r} is not known; use one of {', '.join(WEIGHT_SCHEMES)}")
    if lowered in QUANTIZE_SCHEMES and source_kind == "gguf":
        raise OptionError(f"weights {scheme!r} quantizes a Hugging Face checkpoint at load; a GGUF file keeps "
                          "its own formats (use weights: auto, or a GGUF file quantized that way)")
    return lowered


@dataclass(slots=True)
class DequantizedAtLoad:
    """Matrices in formats no kernel reads, turned into floats: their names and the bytes that added."""

    names: dict[str, list[str]] = field(default_factory=dict)   # format -> tensor names
    extra_bytes: int = 0

    def note(self) -> str | None:
        if not self.names:
            return None
        count = sum(len(names) for names in self.names.values())
        formats = ", ".join(f"{fmt} ({len(names)}, e.g. {names[0]})" for fmt, names in self.names.items())
        return (f"{count} tensors in formats the kernels do not read were dequantized at load: {formats}; "
                f"they take {self.extra_bytes / 1e9:.2f} GB more than in the file")


@dataclass(slots=True)
class WeightPlan:
    scheme: str
    dtype: torch.dtype
    dequantized: DequantizedAtLoad = field(default_factory=DequantizedAtLoad)

    def keep(self, name: str, format: str, shape: tuple[int, ...]) -> bool:
        """Whether a file's matrix stays in its format (called as the file is read)."""
        if self.scheme == "float":
            return False
        if format in FLOAT_DTYPES:
            return FLOAT_DTYPES[format].itemsize < self.dtype.itemsize
        if format in KEPT_FORMATS:
            return True
        self.dequantized.names.setdefault(format, []).append(name)
        self.dequantized.extra_bytes += shape[0] * (shape[1] * self.dtype.itemsize - row_bytes(format, shape[1]))
        return False

    def quantize(self, tensor: torch.Tensor) -> torch.Tensor | QuantizedTensor:
        """A checkpoint's tensor as the scheme quantizes it: a matrix whose rows fill whole blocks
        becomes blocks; anything else (norms, biases) stays a tensor."""
        if self.scheme not in QUANTIZE_SCHEMES or tensor.dim() != 2:
            return tensor
        format = self.scheme.upper()
        if tensor.shape[1] % block_layout(format)[0]:
            return tensor
        blocks = quantize(tensor.float().numpy(), GGMLQuantizationType[format])
        return QuantizedTensor(torch.from_numpy(np.ascontiguousarray(blocks)), format, tensor.shape[1])

