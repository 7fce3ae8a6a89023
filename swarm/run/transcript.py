"""`<run>/agent-<name>.jsonl`: one JSON object a line per agent event, flushed as it happens,
so a run that is killed leaves every transcript complete up to its last event.

    {"t": 3.512, "event": "tool_call", "turn": 1, "name": "read_file", "arguments": {"path": "a.py"}}

`t` is seconds since the run started. Events: message (the system and first user message, with
their token counts), prefilled (context_tokens), assistant (each turn's text, tokens and
finish_reason; `partial` when the run stopped it, with the reason as its finish_reason),
tool_call, tool_error (a malformed call, with the message the agent got), tool_result (output,
ok, and appended_tokens: what the turn's results added to the context), end (status, reason,
turns, a partial turn included, token counts, seconds). The reasons are listed in summary.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from swarm.agents.agent import AgentEvent


def transcript_path(run_dir: Path, agent: str) -> Path:
    return run_dir / f"agent-{agent}.jsonl"


class TranscriptWriter:
    def __init__(self, run_dir: Path, start_time: float):
        self.run_dir = run_dir
        self.start_time = start_time
        self.files: dict[str, TextIO] = {}

    def write(self, event: AgentEvent) -> None:
        record = {"t": round(event.time - self.start_time, 4), "event": event.kind, **event.data}
        file = self._file(event.agent)
        file.write(json.dumps(record, ensure_ascii=False) + "\n")
        file.flush()

    def close(self) -> None:
        for file in self.files.values():
            file.close()
        self.files.clear()

    def _file(self, agent: str) -> TextIO:
        if agent not in self.files:
            self.files[agent] = transcript_path(self.run_dir, agent).open("a", encoding="utf-8")
        return self.files[agent]
