"""What each backend of a run can know, side by side: the views and the summary show a figure
only where its backend has it, and "n/a" (a figure this backend cannot have, like per-agent
bytes on a server) or "unavailable" (one the server could give and did not) elsewhere.

    figure                                       local (swarm's engine)      openai (a server)
    the weights' bytes by format                 yes (the engine's count)     n/a
    KV bytes per agent, shared and private       yes                          n/a
    the trunk prefilled once and pinned          yes                          the server's prefix cache
    decode rate from the engine's step times     yes                          generated / wall time
    prompt and cached tokens from each usage     -                            yes
    KV figures from /metrics                     -                            yes
    followers wait for the leader's first token  -                            yes
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BackendFacts:
    kind: str
    """"local" or "openai": the spec's backend.type."""
    per_agent_kv_bytes: bool
    """Each agent's shared and private KV bytes, read off the engine's block accounting."""
    trunk_pinned: bool
    """The trunk is prefilled once before the agents start, and pinned: its tokens, blocks and the bytes saved."""
    step_timing: bool
    """The engine's decode steps are timed: the decode rate is decode tokens over decode seconds."""
    cached_tokens: bool
    """Each turn's usage says its prompt tokens and how many of them the server had cached."""
    server_metrics: bool
    """The KV figures come from the server's Prometheus page, read once a second."""
    leader_first: bool
    """The first agent's first turn goes alone and the others follow at its first token: by then the
    server has the shared prefix in its cache, and computes it once."""


LOCAL_FACTS = BackendFacts("local", per_agent_kv_bytes=True, trunk_pinned=True, step_timing=True,
                           cached_tokens=False, server_metrics=False, leader_first=False)
OPENAI_FACTS = BackendFacts("openai", per_agent_kv_bytes=False, trunk_pinned=False, step_timing=False,
                            cached_tokens=True, server_metrics=True, leader_first=True)
