"""The swarm's KV memory, read off the engine's own accounting (`engine.kv_stats()`).

Every block in use is exactly one of three kinds, so the figures add up:

    used_bytes = shared_bytes          blocks two or more requests reference (the trunk, and
                                       any suffix blocks agents happen to have in common)
               + private_bytes         blocks one agent alone references (its own history)
               + trunk_private_bytes   blocks only the trunk request references (its partly
                                       filled last block, which each agent copied on write)
               + pinned_only_bytes     pinned trunk blocks whose request gave them up

Sharing saves what each agent would otherwise hold a copy of:

    bytes_without_sharing = sum over agents of (shared + private bytes it references)
    bytes_saved           = sum over agents of its shared bytes - shared_bytes
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine import KVStats, RequestKV

TRUNK_REQUEST_ID = "(trunk)"


@dataclass(slots=True)
class AgentMemory:
    shared_bytes: int = 0
    private_bytes: int = 0
    shared_tokens: int = 0
    private_tokens: int = 0
    peak_shared_bytes: int = 0
    peak_private_bytes: int = 0


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    used_bytes: int = 0
    total_bytes: int = 0
    shared_bytes: int = 0
    private_bytes: int = 0
    trunk_private_bytes: int = 0
    pinned_only_bytes: int = 0
    bytes_without_sharing: int = 0
    bytes_saved: int = 0
    agents_with_kv: int = 0
    agents_sharing: int = 0
    prefix_hit_rate: float = 0.0
    tokens_computed: int = 0

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(slots=True)
class SwarmMemory:
    agent_names: list[str]
    block_size: int = 0
    block_bytes: int = 0
    bytes_per_token: int = 0
    trunk_tokens: int = 0
    trunk_blocks: int = 0
    agents: dict[str, AgentMemory] = field(default_factory=dict)
    latest: MemorySnapshot = field(default_factory=MemorySnapshot)
    peak: MemorySnapshot = field(default_factory=MemorySnapshot)
    peak_used_bytes: int = 0
    peak_private_bytes: int = 0
    samples: int = 0

    def __post_init__(self):
        self.agents = {name: AgentMemory() for name in self.agent_names}

    @property
    def trunk_bytes(self) -> int:
        return self.trunk_blocks * self.block_bytes

    def set_trunk(self, tokens: int, blocks: int) -> None:
        self.trunk_tokens, self.trunk_blocks = tokens, blocks

    def observe(self, stats: KVStats) -> MemorySnapshot:
        self.block_size, self.block_bytes, self.bytes_per_token = \
            stats.block_size, stats.block_bytes, stats.bytes_per_token
        by_id = {request.request_id: request for request in stats.requests}
        for name, memory in self.agents.items():
            _update(memory, by_id.get(name))
        snapshot = self._snapshot(stats, by_id)
        self.samples += 1
        self.latest = snapshot
        if snapshot.bytes_saved >= self.peak.bytes_saved:
            self.peak = snapshot
        self.peak_used_bytes = max(self.peak_used_bytes, snapshot.used_bytes)
        self.peak_private_bytes = max(self.peak_private_bytes, snapshot.private_bytes)
        return snapshot

    def _snapshot(self, stats: KVStats, by_id: dict[str, RequestKV]) -> MemorySnapshot:
        agents = [by_id[name] for name in self.agents if name in by_id]
        trunk = by_id.get(TRUNK_REQUEST_ID)
        shared = stats.blocks_shared * stats.block_bytes
        private = sum(r.private_bytes for r in agents)
        trunk_private = trunk.private_bytes if trunk else 0
        pinned_only = stats.used_bytes - shared - private - trunk_private
        assert pinned_only >= 0, "a block in use that no request references must be pinned"
        agent_shared = sum(r.shared_bytes for r in agents)
        return MemorySnapshot(
            used_bytes=stats.used_bytes, total_bytes=stats.total_bytes, shared_bytes=shared,
            private_bytes=private, trunk_private_bytes=trunk_private, pinned_only_bytes=pinned_only,
            bytes_without_sharing=agent_shared + private, bytes_saved=max(0, agent_shared - shared),
            agents_with_kv=len(agents), agents_sharing=sum(1 for r in agents if r.shared_blocks),
            prefix_hit_rate=stats.prefix_hit_rate, tokens_computed=stats.tokens_computed)

    def to_dict(self) -> dict:
        return {
            "block_size": self.block_size, "block_bytes": self.block_bytes,
            "bytes_per_token": self.bytes_per_token, "pool_bytes": self.latest.total_bytes,
            "trunk_tokens": self.trunk_tokens, "trunk_blocks": self.trunk_blocks, "trunk_bytes": self.trunk_bytes,
            "peak_used_bytes": self.peak_used_bytes, "peak_private_bytes": self.peak_private_bytes,
            "bytes_saved": self.peak.bytes_saved, "peak": self.peak.to_dict(), "final": self.latest.to_dict(),
            "samples": self.samples,
        }


def _update(memory: AgentMemory, request: RequestKV | None) -> None:
    if request is None:  # not holding KV now: ended, or its blocks were given back while it waited
        memory.shared_bytes = memory.private_bytes = memory.shared_tokens = memory.private_tokens = 0
        return
    memory.shared_bytes, memory.private_bytes = request.shared_bytes, request.private_bytes
    memory.shared_tokens, memory.private_tokens = request.shared_tokens, request.private_tokens
    memory.peak_shared_bytes = max(memory.peak_shared_bytes, request.shared_bytes)
    memory.peak_private_bytes = max(memory.peak_private_bytes, request.private_bytes)
