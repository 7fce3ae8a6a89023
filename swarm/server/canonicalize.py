"""`swarm serve --canonicalize` on a request: the rules of swarm/trunk/canonicalize.py applied to the
system and developer messages it starts with, and what they find moved into its first user message
(one is made after them where there is none). A request with no finding comes back as it was, the
same objects, so canonicalizing never changes its prompt.

    [system: rules + <env>...</env>][user: task]  ->  [system: rules][user: MOVED_HEADER, <env>...</env>, task]
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from swarm.server.generation import ChatInputs
from swarm.server.metrics import CanonicalizedCounts
from swarm.server.protocol import ChatMessage, ContentPart
from swarm.trunk.canonicalize import MOVED_HEADER, Move, canonical_text

log = logging.getLogger("swarm.serve")


@dataclass(slots=True)
class Canonicalized:
    inputs: ChatInputs
    moves: list[Move]


class Canonicalizer:
    """ChatPrompter's hook with --canonicalize: each request's messages canonicalized; what moved is
    logged (one line per request it changed) and counted for /metrics."""

    def __init__(self, counts: CanonicalizedCounts):
        self.counts = counts

    def __call__(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        messages, moves = canonical_messages(messages)
        if moves:
            _log(moves)
            self.counts.add(moves)
        return messages


def canonicalize(inputs: ChatInputs) -> Canonicalized:
    """`inputs` with the volatile parts of its leading system text moved to its first user message."""
    messages, moves = canonical_messages(inputs.messages)
    return Canonicalized(replace(inputs, messages=messages) if moves else inputs, moves)


def canonical_messages(messages: list[ChatMessage]) -> tuple[list[ChatMessage], list[Move]]:
    leading = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), len(messages))
    kept, moves = [], []
    for message in messages[:leading]:
        message, moved = _canonical_message(message)
        kept.append(message)
        moves += moved
    if not moves:
        return messages, []
    return kept + _with_moved(messages[leading:], moves), moves


def _canonical_message(message: ChatMessage) -> tuple[ChatMessage, list[Move]]:
    if isinstance(message.content, str):
        text, moves = canonical_text(message.content)
        return (message.model_copy(update={"content": text}) if moves else message), moves
    if not message.content:
        return message, []
    parts, moves = [], []
    for part in message.content:  # part by part: Claude Code's billing header is a block of its own
        text, moved = canonical_text(part.text) if part.type == "text" and part.text else (part.text, [])
        moves += moved
        if not moved:
            parts.append(part)
        elif text:
            parts.append(part.model_copy(update={"text": text}))
    return (message.model_copy(update={"content": parts}) if moves else message), moves


def _with_moved(rest: list[ChatMessage], moves: list[Move]) -> list[ChatMessage]:
    """`rest` with the moved text before its first user message's (one is made where none is)."""
    moved = "\n\n".join([MOVED_HEADER] + [move.text for move in moves]) + "\n\n"
    index = next((i for i, m in enumerate(rest) if m.role == "user"), None)
    if index is None:
        return [ChatMessage(role="user", content=moved.rstrip("\n"))] + rest
    user = rest[index]
    if isinstance(user.content, list):
        content = [ContentPart(type="text", text=moved)] + user.content
    else:
        content = moved + (user.content or "")
    return rest[:index] + [user.model_copy(update={"content": content})] + rest[index + 1:]


def _log(moves: list[Move]) -> None:
    by_rule: dict[str, int] = {}
    for move in moves:
        by_rule[move.rule] = by_rule.get(move.rule, 0) + len(move.text)
    shown = ", ".join(f"{rule} {chars}" for rule, chars in by_rule.items())
    log.info("canonicalize: moved %d chars from the system text to the first user message (%s)",
             sum(by_rule.values()), shown)
