"""What one part of the GPU check is given (PartContext) and how it says it could not run (PartSkipped)
or found something wrong (PartFailed). A part returns its details as a JSON-ready dict."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ERROR_LINES = 12    # of a traceback, kept in a report


class PartSkipped(Exception):
    """The part cannot run here (no such option yet, no tests folder): not a failure."""

    def __init__(self, reason: str, details: dict | None = None):
        super().__init__(reason)
        self.details = details or {}


class PartFailed(Exception):
    """The part ran and what it checked does not hold; `details` say what it saw."""

    def __init__(self, reason: str, details: dict | None = None):
        super().__init__(reason)
        self.details = details or {}


@dataclass(slots=True)
class PartContext:
    device: str                 # "cuda" (ROCm's torch calls its GPU that too) or "cpu" with --allow-cpu
    quick: bool                 # a tiny model instead of the 8B shape
    seconds: float              # the part's time box
    result_file: Path
    inputs: dict = field(default_factory=dict)    # reports of the parts run before, by name
    started: float = field(default_factory=time.monotonic)

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def seconds_left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def save(self, status: str, details: dict, error: str | None = None) -> None:
        """Writes the part's result so far; what a part saves survives its being killed at the time box."""
        partial = self.result_file.with_suffix(".partial")
        partial.write_text(json.dumps({"status": status, "details": details, "error": error}, default=str))
        os.replace(partial, self.result_file)


def last_lines(text: str, count: int = ERROR_LINES) -> list[str]:
    return text.strip().splitlines()[-count:]
