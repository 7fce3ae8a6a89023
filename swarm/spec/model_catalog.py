"""Shipped config.json files of popular models, to size a swarm for a model that is not installed.

`--model-config Qwen3-8B` names one of `swarm/spec/model_configs/*.json` (case does not matter,
an `org/` prefix and an `-Instruct` suffix are optional); anything else is a path to a
config.json or to a folder that holds one.
"""
from __future__ import annotations

import difflib
from pathlib import Path

from engine import ModelConfig, ModelLoadError

CONFIGS_DIR = Path(__file__).parent / "model_configs"


def shipped_model_configs() -> list[str]:
    return sorted(path.stem for path in CONFIGS_DIR.glob("*.json"))


def model_config_path(ref: str) -> Path:
    """The config.json `ref` names; ModelLoadError with the shipped names when there is none."""
    path = Path(ref).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return path
    shipped = _shipped(ref)
    if shipped is not None:
        return shipped
    names = shipped_model_configs()
    close = difflib.get_close_matches(ref, names, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ModelLoadError(f"no model config {ref!r}: {hint}give a config.json path or one of {', '.join(names)}")


def load_shipped_or_path(ref: str) -> ModelConfig:
    return ModelConfig.from_file(model_config_path(ref))


def _shipped(ref: str) -> Path | None:
    wanted = _key(ref)
    for name in shipped_model_configs():
        if _key(name) == wanted:
            return CONFIGS_DIR / f"{name}.json"
    return None


def _key(name: str) -> str:
    return name.rsplit("/", 1)[-1].lower().removesuffix(".json").removesuffix("-instruct")
