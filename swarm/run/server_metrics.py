"""A server's KV figures, read off its Prometheus page (`<base_url minus /v1>/metrics`): the readings
a run on a server feeds its `RunMemory` (swarm/run/memory.py) once a second.

Each engine names its figures its own way; what none exposes stays None and shows as
"unavailable". A server without the page (404) is not an error: every figure is unavailable.

    figure            swarm serve (swarm_)      vLLM (vllm:)                      SGLang (sglang:)
    kv_usage          kv_usage_ratio            kv_cache_usage_perc               token_usage
                                                (gpu_cache_usage_perc before V1)
    kv tokens         kv_blocks{state} ×        usage × num_gpu_blocks ×          num_used_tokens,
                      kv_block_size_tokens      block_size (cache_config_info)    max_total_num_tokens
    kv bytes          kv_used_bytes, _total_    -                                 -
    shared, saved     kv_shared_bytes,          -                                 -
                      kv_saved_bytes
    prefix hit rate   prefix_hit_tokens /       prefix_cache_hits / _queries      cache_hit_rate
                      prefix_lookup_tokens      (gpu_prefix_cache_hit_rate before)
    requests          num_requests_running,     num_requests_running, _waiting    num_running_reqs,
                      _waiting                                                    num_queue_reqs
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import asdict, dataclass, replace

import httpx
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """One reading of the server's page; None where it does not say."""

    source: str = ""  # "swarm", "vllm" or "sglang"
    kv_usage: float | None = None
    """Share of the server's KV cache in use, 0 to 1."""
    kv_used_tokens: int | None = None
    kv_total_tokens: int | None = None
    kv_used_bytes: int | None = None
    kv_total_bytes: int | None = None
    kv_shared_bytes: int | None = None
    kv_saved_bytes: int | None = None
    """What the shared blocks would cost again if every reader had its own copy."""
    prefix_hit_rate: float | None = None
    prefix_cache_hits: float | None = None
    """Counters (tokens since the server started), where the hit rate is only given this way."""
    prefix_cache_queries: float | None = None
    requests_running: int | None = None
    requests_waiting: int | None = None

    @property
    def peak_rank(self) -> float:
        return self.kv_usage or 0.0

    def hit_rate_since(self, first: ServerMetrics | None) -> float | None:
        """Over this run where the server counts hits (vLLM), else the server's own figure."""
        if self.prefix_cache_queries is None or first is None or first.prefix_cache_queries is None:
            return self.prefix_hit_rate
        queries = self.prefix_cache_queries - first.prefix_cache_queries
        hits = self.prefix_cache_hits - first.prefix_cache_hits
        return hits / queries if queries > 0 else self.prefix_hit_rate

    def to_dict(self) -> dict:
        return asdict(self)


Samples = dict[str, list[tuple[dict, float]]]


def parse_metrics(text: str) -> ServerMetrics | None:
    """The figures of a Prometheus text page, or None when it has none swarm knows."""
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, sample.value))
    for read in (_read_swarm, _read_vllm, _read_sglang):
        metrics = read(samples)
        if metrics is not None:
            return _with_usage(metrics)
    return None


def _read_swarm(samples: Samples) -> ServerMetrics | None:
    if "swarm_kv_used_bytes" not in samples:
        return None
    block_size = _total(samples, "swarm_kv_block_size_tokens")
    blocks = {labels.get("state"): value for labels, value in samples.get("swarm_kv_blocks", [])}
    tokens = {state: int(blocks[state] * block_size) if block_size and state in blocks else None
              for state in ("in_use", "total")}
    return ServerMetrics(
        "swarm", kv_usage=_mean(samples, "swarm_kv_usage_ratio"),
        kv_used_tokens=tokens["in_use"], kv_total_tokens=tokens["total"],
        kv_used_bytes=_int(_total(samples, "swarm_kv_used_bytes")),
        kv_total_bytes=_int(_total(samples, "swarm_kv_total_bytes")),
        kv_shared_bytes=_int(_total(samples, "swarm_kv_shared_bytes")),
        kv_saved_bytes=_int(_total(samples, "swarm_kv_saved_bytes")),
        prefix_hit_rate=_mean(samples, "swarm_prefix_cache_hit_rate"),
        prefix_cache_hits=_total(samples, "swarm_prefix_hit_tokens_total"),
        prefix_cache_queries=_total(samples, "swarm_prefix_lookup_tokens_total"),
        requests_running=_int(_total(samples, "swarm_num_requests_running")),
        requests_waiting=_int(_total(samples, "swarm_num_requests_waiting")))


def _read_vllm(samples: Samples) -> ServerMetrics | None:
    if not any(name.startswith("vllm:") for name in samples):
        return None
    usage = _mean(samples, "vllm:kv_cache_usage_perc")
    if usage is None:
        usage = _mean(samples, "vllm:gpu_cache_usage_perc")
    total = _vllm_total_tokens(samples)
    return ServerMetrics(
        "vllm", kv_usage=usage, kv_total_tokens=total,
        kv_used_tokens=round(usage * total) if usage is not None and total else None,
        prefix_hit_rate=_mean(samples, "vllm:gpu_prefix_cache_hit_rate"),
        prefix_cache_hits=_total(samples, "vllm:prefix_cache_hits_total"),
        prefix_cache_queries=_total(samples, "vllm:prefix_cache_queries_total"),
        requests_running=_int(_total(samples, "vllm:num_requests_running")),
        requests_waiting=_int(_total(samples, "vllm:num_requests_waiting")))


def _vllm_total_tokens(samples: Samples) -> int | None:
    for labels, _ in samples.get("vllm:cache_config_info", []):
        try:
            return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
        except (KeyError, ValueError):  # "None" before the engine has sized its cache
            continue
    return None


def _read_sglang(samples: Samples) -> ServerMetrics | None:
    if not any(name.startswith("sglang:") for name in samples):
        return None
    return ServerMetrics(
        "sglang", kv_usage=_mean(samples, "sglang:token_usage"),
        kv_used_tokens=_int(_total(samples, "sglang:num_used_tokens")),
        kv_total_tokens=_int(_total(samples, "sglang:max_total_num_tokens")),
        prefix_hit_rate=_mean(samples, "sglang:cache_hit_rate"),
        requests_running=_int(_total(samples, "sglang:num_running_reqs")),
        requests_waiting=_int(_total(samples, "sglang:num_queue_reqs")))


def _with_usage(metrics: ServerMetrics) -> ServerMetrics:
    if metrics.kv_usage is not None:
        return metrics
    for used, total in ((metrics.kv_used_bytes, metrics.kv_total_bytes),
                        (metrics.kv_used_tokens, metrics.kv_total_tokens)):
        if used is not None and total:
            return replace(metrics, kv_usage=used / total)
    return metrics


def _total(samples: Samples, name: str) -> float | None:
    """Summed over label sets: a server with several engines (data parallel) reports each."""
    values = [value for _, value in samples.get(name, [])]
    return sum(values) if values else None


def _mean(samples: Samples, name: str) -> float | None:
    values = [value for _, value in samples.get(name, [])]
    return sum(values) / len(values) if values else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


async def scrape(http: httpx.AsyncClient, url: str) -> tuple[ServerMetrics | None, str]:
    """One reading, or None and the reason in words; never raises for what the server does."""
    try:
        response = await http.get(url, timeout=SCRAPE_TIMEOUT_SECONDS)
    except httpx.HTTPError as err:
        return None, f"cannot read {url}: {type(err).__name__}"
    if response.status_code == 404:
        return None, f"the server has no {url} (404)"
    if response.status_code != 200:
        return None, f"{url} answered {response.status_code}"
    try:
        metrics = await asyncio.to_thread(parse_metrics, response.text)
    except ValueError as err:
        return None, f"cannot parse {url}: {err}"
    return metrics, "" if metrics is not None else f"{url} has no vLLM, SGLang or swarm KV figures"
