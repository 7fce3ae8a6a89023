"""What a model's weights take, by storage format: the engine's own count of the tensors it holds."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class WeightMemory:
    """total_bytes: every byte the weights hold on the device (a tensor shared by two layers, such as a
    tied lm_head, counts once). by_format: those bytes by storage format ("Q4_K", "Q6_K", "F32", ...),
    adding up to total_bytes. label: what the model is, for a header: the file's type ("Q4_K_M"),
    the quantization asked for at load ("Q8_0"), or the dtype ("BF16")."""

    total_bytes: int
    by_format: dict[str, int] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self):
        assert sum(self.by_format.values()) == self.total_bytes, "the formats add up to the total"

    @property
    def model_bytes(self) -> int:
        """The model's own bytes: total_bytes less the copies laid out for the kernels (LAYOUT_FORMATS), which
        a machine's floor does not need."""
        return self.total_bytes - sum(self.by_format.get(layout, 0) for layout in LAYOUT_FORMATS)

    def to_json(self) -> dict:
        return {"total_bytes": self.total_bytes, "by_format": dict(self.by_format), "label": self.label}


PANELS_FORMAT = "BF16 panels"
CODES_FORMAT = "code panels"
LAYOUT_FORMATS = (PANELS_FORMAT, CODES_FORMAT)


def with_panels(weights: WeightMemory, panels_bytes: int, format: str = PANELS_FORMAT) -> WeightMemory:
    """The weights with a copy laid out for the kernels, counted beside the blocks: bfloat16 panels
    (engine.packed_weights) or code panels (engine.code_panels, format CODES_FORMAT)."""
    return WeightMemory(weights.total_bytes + panels_bytes, {**weights.by_format, format: panels_bytes},
                        weights.label)
