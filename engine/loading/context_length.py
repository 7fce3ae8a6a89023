"""The context a model is served with: its trained length, or what `max_model_len` asks.

Shorter is always safe. Longer only with a warning: RoPE positions past the trained length were never
seen in training (a YaRN or llama3 `rope_scaling` the checkpoint ships is applied as it is, and not
stretched further), so replies past it may degrade; the protocol and the KV sizing work either way.
"""
from __future__ import annotations

import warnings
from dataclasses import replace

from engine.errors import OptionError
from engine.loading.config import ModelConfig


def with_context_length(config: ModelConfig, max_model_len: int | None) -> ModelConfig:
    if max_model_len is None:
        return config
    if max_model_len < 2:
        raise OptionError(f"max_model_len {max_model_len} is too small; give at least 2 tokens")
    trained = config.max_position_embeddings
    if max_model_len > trained:
        warnings.warn(f"max_model_len {max_model_len} is beyond the {trained} tokens this model was trained for: "
                      "positions past them were never seen in training, so replies that long may degrade",
                      stacklevel=2)
    return replace(config, max_position_embeddings=max_model_len)
