"""Find a model (named, Hugging Face folder, or GGUF file) and read its parts."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.named_models import NAMED_MODELS
from engine.tokenizer import Tokenizer
from kernels.quant_matmul import QuantizedWeight


@dataclass(frozen=True, slots=True)
class ModelSource:
    ref: str
    kind: str  # "gguf" or "hf"
    path: Path

    @property
    def display_name(self) -> str:
        return self.ref if self.ref in NAMED_MODELS else self.path.name


def resolve_model(ref: str) -> ModelSource:
    named = NAMED_MODELS.get(ref)
    if named is not None:
        return ModelSource(ref, "gguf", named.require_path())
    path = Path(ref).expanduser()
    if not path.exists():
        names = ", ".join(NAMED_MODELS)
        raise ModelLoadError(
            f"model {ref!r} not found: give a named model ({names}), a Hugging Face folder or a .gguf file")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path}: folder has no config.json; point at a Hugging Face model folder")
        return ModelSource(ref, "hf", path)
    return ModelSource(ref, "gguf", path)


def load_model_config(ref: str | ModelSource) -> ModelConfig:
    source = _source(ref)
    if source.kind == "hf":
        config = ModelConfig.from_file(source.path / "config.json")
        config.eos_token_ids = _generation_eos(source.path) or config.eos_token_ids
        return config
    from engine.gguf_file import read_gguf_config
    return ModelConfig.from_dict(read_gguf_config(source.path))


def load_tokenizer(ref: str | ModelSource) -> Tokenizer:
    source = _source(ref)
    if source.kind == "hf":
        config = load_model_config(source)
        return Tokenizer.from_hf_folder(source.path, eos_token_ids=config.eos_token_ids)
    from engine.gguf_file import read_gguf_tokenizer
    return read_gguf_tokenizer(source.path)


def load_weights(ref: str | ModelSource) -> dict[str, torch.Tensor]:
    """All parameters under Hugging Face names."""
    source = _source(ref)
    if source.kind == "gguf":
        from engine.gguf_file import read_gguf_tensors
        return read_gguf_tensors(source.path)
    weights: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(source.path):
        try:
            weights.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError) as err:
            raise ModelLoadError(f"{file}: corrupt safetensors file ({_first_line(err)})") from None
    return weights


def load_quantized_weights(ref: str | ModelSource) -> dict[str, QuantizedWeight]:
    """The matrices a GGUF file stores in blocks the quantized decode kernel reads, under Hugging
    Face names; none for a Hugging Face folder."""
    source = _source(ref)
    if source.kind != "gguf":
        return {}
    from engine.gguf_file import read_gguf_quantized
    return read_gguf_quantized(source.path)


def _source(ref: str | ModelSource) -> ModelSource:
    return ref if isinstance(ref, ModelSource) else resolve_model(ref)


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError):
            raise ModelLoadError(f"{index}: not a valid safetensors index (needs a weight_map)") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no model.safetensors; the folder needs the model weights")
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise ModelLoadError(f"{folder}: shard {missing[0]} listed in the index is missing")
    return files


def _generation_eos(folder: Path) -> list[int]:
    path = folder / "generation_config.json"
    if not path.exists():
        return []
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except json.JSONDecodeError:
        raise ModelLoadError(f"{path}: not valid JSON") from None
    if eos is None:
        return []
    return list(eos) if isinstance(eos, list) else [eos]


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
