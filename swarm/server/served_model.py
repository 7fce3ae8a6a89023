"""What `swarm serve` serves: the model's name and aliases, and the trunk it pinned at start."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class ServedModel:
    name: str
    aliases: set[str] = field(default_factory=set)
    trunk_tokens: int = 0
    trunk_blocks: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
