"""Where a model is: a named model, a Hugging Face folder or a GGUF file. Resolving one reads
nothing but the file system, so a spec can be checked without importing torch."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError
from engine.loading.named_models import NAMED_MODELS


@dataclass(frozen=True, slots=True)
class ModelSource:
    ref: str
    kind: str  # "gguf", "hf" or "random" (engine.loading.random_model)
    path: Path

    @property
    def display_name(self) -> str:
        return self.ref if self.ref in NAMED_MODELS else self.path.name


def resolve_model(ref: str | ModelSource) -> ModelSource:
    if isinstance(ref, ModelSource):   # already resolved, or made in memory (engine.loading.random_model)
        return ref
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
