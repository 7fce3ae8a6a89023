"""`/metrics`: the engine's own figures in Prometheus form, read in the engine thread per scrape.

    swarm_kv_used_bytes / swarm_kv_total_bytes      KV pool in use (referenced or pinned) / all of it
    swarm_kv_blocks{state=total|in_use|free|cached|shared|pinned}
    swarm_kv_shared_bytes                           blocks read by more than one request
    swarm_kv_private_bytes                          blocks each request holds alone, summed
    swarm_kv_saved_bytes                            what the shared blocks would cost again unshared
    swarm_prefix_cache_hit_rate                     hit tokens / looked-up prompt tokens, since start
    swarm_num_requests_running / _waiting
    swarm_requests_total{finish_reason}             the reason its client got (tool_calls too), counted by
                                                    the server; cancelled and error by the engine
    swarm_prompt_tokens_total, swarm_cached_prompt_tokens_total,
    swarm_generation_tokens_total, swarm_preemptions_total, swarm_engine_step_errors_total
    swarm_canonicalized_requests_total              requests --canonicalize changed (with the flag only)
    swarm_canonicalized_chars_total{rule}           characters it moved out of system texts, by rule
    swarm_agent_requests_total{agent}               with agent keys: requests started, by the key's agent;
    swarm_agent_prompt_tokens_total{agent}          their prompt tokens, and of the finished ones the
    swarm_agent_cached_tokens_total{agent}          tokens read from the prefix cache and the tokens
    swarm_agent_generated_tokens_total{agent}       generated (cancelled and failed requests too)
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine import AsyncEngine, EngineSnapshot
from swarm.server.exchanges import ExchangeFinished, ExchangeStarted
from swarm.server.served_model import ServedModel

FINISH_REASONS = ("stop", "length", "tool_calls", "cancelled", "error")
ENGINE_FINISH_REASONS = ("cancelled", "error")
"""Only the engine sees these; whether a finished reply is `tool_calls` only the server knows."""


class ReplyCounts:
    """Replies by the finish reason their client was given; added on the event loop, read per scrape."""

    def __init__(self):
        self._counts: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, finish_reason: str) -> None:
        with self._lock:
            self._counts[finish_reason] += 1

    def counts(self) -> Counter:
        with self._lock:
            return Counter(self._counts)


class CanonicalizedCounts(Collector):
    """What --canonicalize moved (swarm/trunk/canonicalize.py); added in prompt threads, read per scrape."""

    def __init__(self):
        self._requests = 0
        self._chars: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, moves: list) -> None:
        with self._lock:
            self._requests += 1
            for move in moves:
                self._chars[move.rule] += len(move.text)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            requests, chars = self._requests, Counter(self._chars)
        yield _counter("swarm_canonicalized_requests", "Requests whose system text --canonicalize changed.", requests)
        moved = CounterMetricFamily("swarm_canonicalized_chars", "Characters --canonicalize moved from system "
                                    "texts to first user messages, by rule.", labels=["rule"])
        for rule in sorted(chars):
            moved.add_metric([rule], chars[rule])
        yield moved


class AgentCounts(Collector):
    """Requests and tokens by agent, as an exchange listener (swarm/server/exchanges.py); read per scrape."""

    FIELDS = {"requests": "Requests started", "prompt_tokens": "Prompt tokens of the requests started",
              "cached_tokens": "Prompt tokens read from the prefix cache, of the requests finished",
              "generated_tokens": "Tokens generated, of the requests finished"}

    def __init__(self, agents: list[str]):
        self._counts = {agent: Counter() for agent in agents}
        self._lock = threading.Lock()

    def started(self, record: ExchangeStarted) -> None:
        self._add(record.agent, requests=1, prompt_tokens=record.prompt_tokens)

    def finished(self, record: ExchangeFinished) -> None:
        self._add(record.agent, cached_tokens=record.cached_tokens, generated_tokens=record.generated_tokens)

    def _add(self, agent: str | None, **amounts: int) -> None:
        if agent is not None:
            with self._lock:
                self._counts.setdefault(agent, Counter()).update(amounts)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts = {agent: Counter(counted) for agent, counted in self._counts.items()}
        for name, documentation in self.FIELDS.items():
            family = CounterMetricFamily(f"swarm_agent_{name}", f"{documentation}, by agent.", labels=["agent"])
            for agent in sorted(counts):
                family.add_metric([agent], counts[agent][name])
            yield family


class EngineCollector(Collector):
    def __init__(self, engine: AsyncEngine, model: ServedModel, replies: ReplyCounts):
        self.engine = engine
        self.model = model
        self.replies = replies

    def collect(self) -> Iterator[Metric]:
        snapshot = self.engine.snapshot_blocking()
        yield from kv_metrics(snapshot)
        yield from request_metrics(snapshot, self.replies.counts())
        yield _gauge("swarm_trunk_tokens", "Tokens of the pinned trunk prefilled at start (0: none).",
                     self.model.trunk_tokens)


def metrics_registry(engine: AsyncEngine, model: ServedModel, replies: ReplyCounts,
                     *optional: Collector | None) -> CollectorRegistry:
    """The engine's metrics, and those of each optional collector that is there."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model, replies))
    for collector in optional:
        if collector is not None:
            registry.register(collector)
    return registry


def kv_metrics(snapshot: EngineSnapshot) -> Iterator[Metric]:
    kv = snapshot.kv
    yield _gauge("swarm_kv_used_bytes", "KV cache bytes in blocks that are referenced or pinned.", kv.used_bytes)
    yield _gauge("swarm_kv_total_bytes", "KV cache bytes of the whole block pool.", kv.total_bytes)
    yield _gauge("swarm_kv_usage_ratio", "Share of the KV block pool in use.",
                 kv.blocks_in_use / kv.blocks_total if kv.blocks_total else 0.0)
    blocks = GaugeMetricFamily("swarm_kv_blocks", "KV blocks by state.", labels=["state"])
    for state, value in (("total", kv.blocks_total), ("in_use", kv.blocks_in_use), ("free", kv.blocks_free),
                         ("cached", kv.blocks_cached), ("shared", kv.blocks_shared), ("pinned", kv.blocks_pinned)):
        blocks.add_metric([state], value)
    yield blocks
    yield _gauge("swarm_kv_block_size_tokens", "Tokens per KV block.", kv.block_size)
    yield _gauge("swarm_kv_shared_bytes", "KV bytes in blocks that more than one request reads.",
                 kv.blocks_shared * kv.block_bytes)
    yield _gauge("swarm_kv_private_bytes", "KV bytes in blocks that one request holds alone, summed over requests.",
                 sum(r.private_bytes for r in kv.requests))
    references = sum(r.shared_blocks for r in kv.requests)
    yield _gauge("swarm_kv_saved_bytes", "KV bytes the shared blocks would take again if each reader had a copy.",
                 max(0, references - kv.blocks_shared) * kv.block_bytes)
    yield _gauge("swarm_prefix_cache_hit_rate", "Prompt tokens found in the prefix cache / prompt tokens looked up.",
                 kv.prefix_hit_rate)
    yield _counter("swarm_prefix_lookup_tokens", "Prompt tokens looked up in the prefix cache.",
                   kv.prefix_lookup_tokens)
    yield _counter("swarm_prefix_hit_tokens", "Prompt tokens found in the prefix cache.", kv.prefix_hit_tokens)
    yield _counter("swarm_tokens_computed", "Tokens the model computed KV for (prefill and decode).",
                   kv.tokens_computed)


def request_metrics(snapshot: EngineSnapshot, replies: Counter) -> Iterator[Metric]:
    counters = snapshot.counters
    yield _gauge("swarm_num_requests_running", "Requests computing: prefilling or decoding.", snapshot.num_running)
    yield _gauge("swarm_num_requests_waiting", "Requests queued for admission.", snapshot.num_waiting)
    finished = CounterMetricFamily("swarm_requests", "Finished requests by the finish reason their client got.",
                                   labels=["finish_reason"])
    reasons = replies + Counter({reason: counters.finished[reason] for reason in ENGINE_FINISH_REASONS})
    for reason in sorted(set(FINISH_REASONS) | set(reasons)):
        finished.add_metric([reason], reasons[reason])
    yield finished
    yield _counter("swarm_requests_added", "Requests the engine accepted.", counters.requests_added)
    yield _counter("swarm_prompt_tokens", "Prompt tokens of accepted requests.", counters.prompt_tokens)
    yield _counter("swarm_cached_prompt_tokens", "Prompt tokens served from the prefix cache.", counters.cached_tokens)
    yield _counter("swarm_generation_tokens", "Tokens generated.", counters.generation_tokens)
    yield _counter("swarm_preemptions", "Requests preempted to free KV blocks.", snapshot.num_preemptions)
    yield _counter("swarm_engine_step_errors", "Engine steps that raised; their requests failed.",
                   counters.step_errors)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)
