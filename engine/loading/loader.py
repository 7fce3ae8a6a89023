"""Find a model (named, Hugging Face folder, or GGUF file) and read its parts."""
from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open

from engine.errors import ModelLoadError
from engine.loading.config import ModelConfig
from engine.loading.model_source import ModelSource, resolve_model
from engine.loading.tokenizer import Tokenizer
from kernels.reference.quant_blocks import QuantizedTensor

if TYPE_CHECKING:
    from engine.loading.gguf_weights import KeepBlocks

# A multimodal checkpoint's text model (Qwen3_5ForConditionalGeneration) is read under the text model's names;
# its vision tower and its multi-token-prediction head are not read at all.
TEXT_MODEL_PREFIX = ("model.language_model.", "model.")
SKIPPED_PARTS = {"model.visual.": "vision", "mtp.": "MTP"}


def load_model_config(ref: str | ModelSource) -> ModelConfig:
    source = _source(ref)
    if source.kind == "random":   # engine.loading.random_model: made in memory
        return source.model_config()
    if source.kind == "hf":
        config = ModelConfig.from_file(source.path / "config.json")
        config.eos_token_ids = _generation_eos(source.path) or config.eos_token_ids
        return config
    from engine.loading.gguf_file import read_gguf_config
    return ModelConfig.from_dict(read_gguf_config(source.path))


def load_tokenizer(ref: str | ModelSource) -> Tokenizer:
    source = _source(ref)
    if source.kind == "random":
        return source.tokenizer()
    if source.kind == "hf":
        config = load_model_config(source)
        return Tokenizer.from_hf_folder(source.path, eos_token_ids=config.eos_token_ids)
    from engine.loading.gguf_file import read_gguf_tokenizer
    return read_gguf_tokenizer(source.path)


def load_weights(ref: str | ModelSource) -> dict[str, torch.Tensor]:
    """All parameters under Hugging Face names, as float tensors."""
    return dict(iter_weights(ref))


def iter_weights(ref: str | ModelSource, keep: "KeepBlocks | None" = None
                 ) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """Each parameter under its Hugging Face name, one at a time, so a load holds one in flight. A
    GGUF file's matrices come as their blocks where `keep(name, format, shape)` says so."""
    source = _source(ref)
    if source.kind == "random":
        yield from source.weights(keep)
        return
    if source.kind == "gguf":
        from engine.loading.gguf_weights import iter_gguf_weights
        yield from iter_gguf_weights(source.path, keep)
        return
    skipped: Counter[str] = Counter()
    for file in _safetensors_files(source.path):
        yield from _safetensors_tensors(file, skipped)
    if skipped:
        parts = " and ".join(f"{count} {part}" for part, count in skipped.items())
        warnings.warn(f"skipped {parts} tensors of {source.path.name}: swarm runs the text model only", stacklevel=2)


def _safetensors_tensors(file: Path, skipped: Counter[str]) -> Iterator[tuple[str, torch.Tensor]]:
    try:
        with safe_open(str(file), framework="pt") as tensors:
            for name in tensors.keys():
                part = next((part for prefix, part in SKIPPED_PARTS.items() if name.startswith(prefix)), None)
                if part is not None:
                    skipped[part] += 1
                    continue
                yield text_model_name(name), tensors.get_tensor(name)
    except (SafetensorError, OSError, ValueError) as err:
        raise ModelLoadError(f"{file}: corrupt safetensors file ({_first_line(err)})") from None


def text_model_name(name: str) -> str:
    """`model.language_model.layers.0...` -> `model.layers.0...`; other names as they are."""
    old, new = TEXT_MODEL_PREFIX
    return new + name[len(old):] if name.startswith(old) else name


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
