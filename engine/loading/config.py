"""Model hyper-parameters, read from a Hugging Face `config.json` dict.

GGUF files are translated into the same dict first (see `gguf_file.py`), so this is
the one place that knows which architectures exist and what their fields mean.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import ModelLoadError, UnsupportedArchitectureError

MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
}

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",   # the text model of it; vision weights are skipped
}

HYBRID_FAMILIES = ("qwen3_5",)
FULL_ATTENTION, LINEAR_ATTENTION = "full_attention", "linear_attention"

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class LinearAttentionShape:
    """The Gated DeltaNet layers' dimensions (engine.linear_attention), under the checkpoint's names."""

    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int

    @classmethod
    def from_dict(cls, raw: dict) -> "LinearAttentionShape":
        return cls(raw.get("linear_num_key_heads", 16), raw.get("linear_num_value_heads", 32),
                   raw.get("linear_key_head_dim", 128), raw.get("linear_value_head_dim", 128),
                   raw.get("linear_conv_kernel_dim", 4))

    @property
    def conv_dim(self) -> int:
        keys = self.linear_num_key_heads * self.linear_key_head_dim
        return 2 * keys + self.linear_num_value_heads * self.linear_value_head_dim


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    rope_scaling: dict | None = None
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # hybrids (Qwen3.5): each layer's kind (empty: every layer is full attention), the part of each head
    # rotary turns, and the linear layers' shape
    layer_types: list[str] = field(default_factory=list)
    partial_rotary_factor: float = 1.0
    linear_attention: LinearAttentionShape | None = None
    hidden_act: str = "silu"

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        arch = _architecture(raw)
        family = SUPPORTED_ARCHITECTURES[arch]
        if family in HYBRID_FAMILIES:
            raw = _text_fields(raw)
        heads = raw["num_attention_heads"]
        hidden = raw["hidden_size"]
        if family == "mistral" and raw.get("sliding_window") not in (None, 0):
            max_pos = raw.get("max_position_embeddings", 0)
            if raw["sliding_window"] < max_pos:
                raise UnsupportedArchitectureError(
                    f"Mistral with a sliding window ({raw['sliding_window']}) is not supported; "
                    "use a checkpoint with sliding_window: null")
        return cls(
            architecture=arch,
            family=family,
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(raw),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
            qk_norm=family in ("qwen3", "qwen3_5"),
            rope_scaling=_rope_scaling(raw),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_as_list(raw.get("eos_token_id")),
            **(_hybrid_fields(raw) if family in HYBRID_FAMILIES else {}),
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelLoadError(f"{path}: no such file; a model folder needs a config.json") from None
        except json.JSONDecodeError as err:
            raise ModelLoadError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
        try:
            return cls.from_dict(raw)
        except KeyError as err:
            raise ModelLoadError(f"{path}: missing key {err.args[0]!r}") from None

    @property
    def is_hybrid(self) -> bool:
        """Layers of two kinds (Qwen3.5): linear attention keeps a recurrent state per sequence, not KV."""
        return bool(self.layer_types)

    @property
    def kv_layers(self) -> list[int]:
        """The layers that keep KV (full attention), in order: KV layer j of the pool is layer kv_layers[j]."""
        if not self.layer_types:
            return list(range(self.num_layers))
        return [i for i, kind in enumerate(self.layer_types) if kind == FULL_ATTENTION]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == LINEAR_ATTENTION]

    @property
    def num_kv_layers(self) -> int:
        return len(self.kv_layers)

    @property
    def rotary_dim(self) -> int:
        """The leading dims of each head that rotary turns (all of them but in partial rotary)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def kv_bytes_per_token(self, dtype: str = "float16") -> int:
        """The module's kv_bytes_per_token for this model, its cache in `dtype` (full-attention layers only)."""
        return kv_bytes_per_token(self.num_kv_layers, self.num_kv_heads, self.head_dim, DTYPE_BYTES[dtype])


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """The KV cache one token takes: K and V, every layer: 2 x layers x KV heads x head dim x dtype bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def _architecture(raw: dict) -> str:
    archs = raw.get("architectures") or [MODEL_TYPES.get(raw.get("model_type"), raw.get("model_type"))]
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    name = archs[0] or "unknown"
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    raise UnsupportedArchitectureError(
        f"architecture {name!r} is not supported; supported: {supported}")


def _text_fields(raw: dict) -> dict:
    """A multimodal config's text model fields (under `text_config`), with the top level's architecture
    and embedding tie, which transformers reads there."""
    if "text_config" not in raw:
        return raw
    outer = {key: raw[key] for key in ("architectures", "tie_word_embeddings", "torch_dtype", "dtype") if key in raw}
    return {**raw["text_config"], **outer}


def _hybrid_fields(raw: dict) -> dict:
    if raw.get("attention_bias") or raw.get("attn_output_gate", True) is False:
        raise UnsupportedArchitectureError("Qwen3.5 with attention_bias: true or attn_output_gate: false is not "
                                           "supported (its checkpoints have no attention biases and a gated output)")
    return dict(layer_types=_layer_types(raw), partial_rotary_factor=_partial_rotary_factor(raw),
                linear_attention=LinearAttentionShape.from_dict(raw), hidden_act=raw.get("hidden_act", "silu"))


def _layer_types(raw: dict) -> list[str]:
    """`layer_types`, else every `full_attention_interval`-th layer full attention (transformers' default: 4)."""
    layers = raw["num_hidden_layers"]
    interval = raw.get("full_attention_interval", 4)
    types = raw.get("layer_types") or [LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION
                                       for i in range(layers)]
    unknown = sorted(set(types) - {FULL_ATTENTION, LINEAR_ATTENTION})
    if len(types) != layers or unknown:
        raise UnsupportedArchitectureError(
            f"layer_types must name each of the {layers} layers full_attention or linear_attention "
            f"(got {len(types)}{', e.g. ' + repr(unknown[0]) if unknown else ''})")
    return list(types)


def _partial_rotary_factor(raw: dict) -> float:
    params = raw.get("rope_parameters") or {}
    factor = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)))
    head_dim = raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"]
    rotated = int(head_dim * factor)
    if factor > 1 or rotated < 2 or rotated % 2:
        raise UnsupportedArchitectureError(f"partial_rotary_factor {factor} of head_dim {head_dim} must rotate an "
                                           "even number of dims, at least 2 and at most head_dim")
    return factor


def _rope_theta(raw: dict) -> float:
    if "rope_theta" in raw:
        return float(raw["rope_theta"])
    params = raw.get("rope_parameters") or {}
    return float(params.get("rope_theta", 10000.0))


def _rope_scaling(raw: dict) -> dict | None:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise UnsupportedArchitectureError(
            f"rope_scaling of type {kind!r} is not supported; supported: llama3")
    return dict(scaling)


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
