"""What the prompts of real requests share: their common trunk, where each one leaves the others, and
what in their system text makes them leave (prefix lint on the text as the client sent it).

    request A ids = [ trunk: the tokens every request starts with ][ A's own ... ]
    request B ids = [ trunk ...................................... ][ B's own ... ]
                                                                    ^ B diverges here, from A: the
                                                                      request it shares the most with

A divergence is shown as the text of a few tokens either side of it, decoded from each request's own
ids, so `…Working directory: /srv/|alpha` against `|beta` says why at a glance.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from engine import Tokenizer
from swarm.trunk.canonical import common_prefix_length, token_ids_sha256
from swarm.trunk.lint import ADVICE
from swarm.trunk.volatile_patterns import Volatiles, find_volatile

CONTEXT_TOKENS = 8
"""Tokens of text shown on each side of a divergence."""


@dataclass(slots=True)
class RenderedRequest:
    """One request as serve renders it: its prompt ids, and the system messages it started with."""

    name: str
    api: str
    token_ids: list[int]
    system_texts: list[str]


@dataclass(slots=True)
class RequestBranch:
    name: str
    api: str
    prompt_tokens: int
    diverges_at: int | None
    """The first token that differs from `diverges_from`, the request it shares the most tokens with."""
    diverges_from: str | None
    before: str
    """The text of the tokens before the divergence (the same in both)."""
    after: str
    """This request's text from the divergence on."""
    other_after: str
    """`diverges_from`'s text from the divergence on."""


@dataclass(slots=True)
class SystemFinding:
    kind: str
    text: str
    requests: list[str]
    """The requests whose system text holds it, at the same place."""
    message: int
    """Which of the leading system messages (0: the first)."""
    line: int
    token_index: int | None
    """Where it sits in the first of `requests`' prompt; None where the template rewrote the text."""
    in_trunk: bool
    advice: str


@dataclass(slots=True)
class RequestPrefix:
    trunk_ids: list[int]
    branches: list[RequestBranch]
    findings: list[SystemFinding]

    @property
    def trunk_tokens(self) -> int:
        return len(self.trunk_ids)

    @property
    def trunk_sha256(self) -> str:
        return token_ids_sha256(self.trunk_ids)

    def to_json(self) -> dict:
        return {"trunk": {"tokens": self.trunk_tokens, "sha256": self.trunk_sha256},
                "requests": [asdict(b) for b in self.branches], "findings": [asdict(f) for f in self.findings]}


def request_prefix(tokenizer: Tokenizer, requests: list[RenderedRequest],
                   volatiles: Volatiles | None = None) -> RequestPrefix:
    assert requests, "at least one request to compare"
    trunk = requests[0].token_ids[:common_prefix_length([r.token_ids for r in requests])]
    branches = [_branch(tokenizer, request, requests) for request in requests]
    return RequestPrefix(trunk, branches, system_findings(tokenizer, requests, len(trunk), volatiles))


def system_findings(tokenizer: Tokenizer, requests: list[RenderedRequest], trunk_tokens: int,
                    volatiles: Volatiles | None = None) -> list[SystemFinding]:
    """Prefix lint's volatile patterns on each request's system text; one finding per place and text."""
    found: dict[tuple, SystemFinding] = {}
    for request in requests:
        prompt = tokenizer.decode(request.token_ids, skip_special_tokens=False)
        for message, text in enumerate(request.system_texts):
            for start, end, kind in find_volatile(text, volatiles):
                key = (kind, text[start:end], message, text.count("\n", 0, start) + 1)
                if key in found:
                    found[key].requests.append(request.name)
                    continue
                index = _token_at(tokenizer, request.token_ids, prompt, text, start)
                found[key] = SystemFinding(*key[:2], [request.name], *key[2:], index,
                                           index is not None and index < trunk_tokens, ADVICE[kind])
    return list(found.values())


def _branch(tokenizer: Tokenizer, request: RenderedRequest, requests: list[RenderedRequest]) -> RequestBranch:
    others = [(common_prefix_length([request.token_ids, o.token_ids]), -i, o) for i, o in enumerate(requests)
              if o is not request]
    if not others:
        return RequestBranch(request.name, request.api, len(request.token_ids), None, None, "", "", "")
    at, _, other = max(others, key=lambda found: found[:2])
    ids = request.token_ids
    return RequestBranch(request.name, request.api, len(ids), at, other.name,
                         _text(tokenizer, ids[max(0, at - CONTEXT_TOKENS):at]),
                         _text(tokenizer, ids[at:at + CONTEXT_TOKENS]),
                         _text(tokenizer, other.token_ids[at:at + CONTEXT_TOKENS]))


def _text(tokenizer: Tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


def _token_at(tokenizer: Tokenizer, ids: list[int], prompt: str, text: str, char: int) -> int | None:
    """The token of `ids` that holds character `char` of `text`, a system text inside the decoded
    `prompt`: the first whose prefix decodes past it (a bisection: decoding is the one oracle)."""
    where = prompt.find(text)
    if where < 0:
        return None
    target, low, high = where + char, 0, len(ids) - 1
    while low < high:
        middle = (low + high) // 2
        if len(_text(tokenizer, ids[:middle + 1])) > target:
            high = middle
        else:
            low = middle + 1
    return low
