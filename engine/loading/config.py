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
}

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        arch = _architecture(raw)
        family = SUPPORTED_ARCHITECTURES[arch]
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
            qk_norm=family == "qwen3",
            rope_scaling=_rope_scaling(raw),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=_as_list(raw.get("eos_token_id")),
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

    def kv_bytes_per_token(self, dtype: str = "float16") -> int:
        """The module's kv_bytes_per_token for this model, its cache in `dtype`."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, DTYPE_BYTES[dtype])


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
