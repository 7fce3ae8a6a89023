"""The run's KV memory over time (`RunMemory`), from whichever source its backend has: swarm's own
engine (`observe_engine(engine.kv_stats())`, a `MemorySnapshot`) or a server's /metrics page
(`observe(ServerMetrics)`, swarm/run/server_metrics.py). It keeps the latest reading, the first,
the peak and why figures are missing; the engine's readings also give each agent's bytes.

In the engine's accounting every block in use is exactly one of three kinds, so the figures add up:

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

from dataclasses import dataclass, fields, replace
from typing import Protocol

from engine import KVStats, RequestKV

TRUNK_REQUEST_ID = "(trunk)"
NOT_READ = "not read yet"
ENGINE_ONLY = ("block_size", "block_bytes", "bytes_per_token", "trunk_tokens", "trunk_blocks", "trunk_bytes",
               "peak_private_bytes", "bytes_saved")
"""Figures of the engine's own accounting: null in the memory document of a run on a server."""


class KVReading(Protocol):
    """One reading of the KV figures; None where its source does not say."""

    @property
    def peak_rank(self) -> float:
        """The peak is the reading where this is highest: bytes saved (engine), share in use (server)."""

    def hit_rate_since(self, first: "KVReading | None") -> float | None:
        """The prefix cache's hit rate over the run, where the source counts hits."""

    def to_dict(self) -> dict: ...


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
    """A reading of the engine's own accounting."""

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
    state_slots: int = 0
    """A hybrid model's (Qwen3.5) linear-attention state, beside the KV: a slot per live request..."""
    state_slot_bytes: int = 0
    snapshots: int = 0
    """...and the copies kept where prompts ended (the trunk's among them), shared by whoever starts there."""
    snapshot_bytes: int = 0

    @property
    def peak_rank(self) -> float:
        return self.bytes_saved

    def hit_rate_since(self, first: KVReading | None) -> float:
        return self.prefix_hit_rate  # the engine counts over its life: this run's

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


class RunMemory:
    def __init__(self, empty: KVReading, agent_names: list[str] = (), metrics_url: str = ""):
        self.latest = self.peak = empty
        """What the views show before the first reading: zeros (engine) or unavailable (server)."""
        self.first: KVReading | None = None
        self.samples = 0
        self.note = NOT_READ
        """Why there is no reading, when there is none."""
        self.metrics_url = metrics_url
        self.agents = {name: AgentMemory() for name in agent_names}
        self.block_size = self.block_bytes = self.bytes_per_token = 0
        self.trunk_tokens = self.trunk_blocks = 0
        self.peak_used_bytes = self.peak_private_bytes = 0

    @property
    def available(self) -> bool:
        return self.samples > 0

    @property
    def trunk_bytes(self) -> int:
        return self.trunk_blocks * self.block_bytes

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.latest.hit_rate_since(self.first)

    def set_trunk(self, tokens: int, blocks: int) -> None:
        self.trunk_tokens, self.trunk_blocks = tokens, blocks

    def observe(self, reading: KVReading | None, note: str = "") -> None:
        """A new reading, or None and why there is none (a server's page could not be read)."""
        if reading is None:
            self.note = note
            return
        self.first = self.first or reading
        self.latest, self.note = reading, ""
        self.samples += 1
        if reading.peak_rank >= self.peak.peak_rank:
            self.peak = reading

    def observe_engine(self, stats: KVStats) -> MemorySnapshot:
        self.block_size, self.block_bytes, self.bytes_per_token = \
            stats.block_size, stats.block_bytes, stats.bytes_per_token
        by_id = {request.request_id: request for request in stats.requests}
        for name, memory in self.agents.items():
            _update(memory, by_id.get(name))
        snapshot = _snapshot(stats, [by_id[name] for name in self.agents if name in by_id],
                             by_id.get(TRUNK_REQUEST_ID))
        self.observe(snapshot)
        self.peak_used_bytes = max(self.peak_used_bytes, snapshot.used_bytes)
        self.peak_private_bytes = max(self.peak_private_bytes, snapshot.private_bytes)
        return snapshot

    def engine_dict(self) -> dict:
        """summary.json's memory for a run on swarm's own engine."""
        return {
            "block_size": self.block_size, "block_bytes": self.block_bytes,
            "bytes_per_token": self.bytes_per_token, "pool_bytes": self.latest.total_bytes,
            "trunk_tokens": self.trunk_tokens, "trunk_blocks": self.trunk_blocks, "trunk_bytes": self.trunk_bytes,
            "peak_used_bytes": self.peak_used_bytes, "peak_private_bytes": self.peak_private_bytes,
            "bytes_saved": self.peak.bytes_saved, "peak": self.peak.to_dict(), "final": self.latest.to_dict(),
            "samples": self.samples,
        }

    def server_dict(self) -> dict:
        """summary.json's memory for a run on a server: its /metrics figures, null where it has none."""
        return dict.fromkeys(ENGINE_ONLY) | {
            "source": self.latest.source or None, "metrics_url": self.metrics_url,
            "available": self.available, "note": self.note or None, "samples": self.samples,
            "prefix_hit_rate": self.prefix_hit_rate, "peak_kv_usage": self.peak.kv_usage,
            "peak_used_bytes": self.peak.kv_used_bytes, "pool_bytes": self.latest.kv_total_bytes,
            "pool_tokens": self.latest.kv_total_tokens,
            "peak": self.peak.to_dict() if self.available else None,
            "final": self.latest.to_dict() if self.available else None}


def _snapshot(stats: KVStats, agents: list[RequestKV], trunk: RequestKV | None) -> MemorySnapshot:
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
        prefix_hit_rate=stats.prefix_hit_rate, tokens_computed=stats.tokens_computed,
        state_slots=stats.states.slots_in_use, state_slot_bytes=stats.states.slot_bytes_in_use,
        snapshots=stats.states.snapshots_held, snapshot_bytes=stats.states.snapshot_bytes)


def _update(memory: AgentMemory, request: RequestKV | None) -> None:
    if request is None:  # not holding KV now: ended, or its blocks were given back while it waited
        memory.shared_bytes = memory.private_bytes = memory.shared_tokens = memory.private_tokens = 0
        return
    memory.shared_bytes, memory.private_bytes = request.shared_bytes, request.private_bytes
    memory.shared_tokens, memory.private_tokens = request.shared_tokens, request.private_tokens
    memory.peak_shared_bytes = max(memory.peak_shared_bytes, request.shared_bytes)
    memory.peak_private_bytes = max(memory.peak_private_bytes, request.private_bytes)


def by_agent(stats: KVStats, agent_of: dict[str, str]) -> KVStats:
    """`stats` with each request's row named by its agent (`agent_of`: request id -> agent), for
    `RunMemory.observe_engine`: a harness's agent is whichever request it has in flight. An agent with
    two requests in flight gets one row, their sum; rows of no agent are left out (map TRUNK_REQUEST_ID to
    itself to keep the trunk's)."""
    rows: dict[str, RequestKV] = {}
    for request in stats.requests:
        agent = agent_of.get(request.request_id)
        if agent is None:
            continue
        row = rows.get(agent)
        rows[agent] = replace(request, request_id=agent) if row is None else _sum(row, request)
    return replace(stats, requests=list(rows.values()))


def _sum(row: RequestKV, other: RequestKV) -> RequestKV:
    return replace(row, **{f.name: getattr(row, f.name) + getattr(other, f.name)
                           for f in fields(RequestKV) if f.name != "request_id"})
