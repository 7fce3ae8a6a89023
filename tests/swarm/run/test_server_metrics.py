"""Reading a server's KV figures off its Prometheus page, on pages in each engine's own format, and
the run's memory of them."""
import asyncio

import httpx
import pytest

from swarm.run.memory import RunMemory
from swarm.run.server_metrics import ServerMetrics, parse_metrics, scrape

# vLLM V1 (0.8 and later), one engine, as its /metrics writes it (histograms shortened).
VLLM_V1 = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12095.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 12000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 9000.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048",swap_space="4"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 1.25
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 5.0
"""

# vLLM V0 (0.6, 0.7): the usage and the hit rate were gauges with other names.
VLLM_V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
# HELP vllm:gpu_prefix_cache_hit_rate GPU prefix cache block hit rate.
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.8
"""

# SGLang, launched with --enable-metrics (the figures from its production-metrics page).
SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{model_name="meta-llama/Llama-3.1-8B-Instruct"} 123859.0
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="meta-llama/Llama-3.1-8B-Instruct"} 442343.0
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
"""


def test_vllm_v1_usage_tokens_requests_and_hit_counters():
    metrics = parse_metrics(VLLM_V1)
    assert metrics.source == "vllm"
    assert metrics.kv_usage == 0.25 and metrics.kv_total_tokens == 2048 * 16 and metrics.kv_used_tokens == 8192
    assert (metrics.requests_running, metrics.requests_waiting) == (3, 1)
    assert (metrics.prefix_cache_hits, metrics.prefix_cache_queries) == (9000, 12000)
    assert metrics.prefix_hit_rate is None  # V1 only counts; the run's memory divides
    assert metrics.kv_used_bytes is None and metrics.kv_shared_bytes is None


def test_vllm_with_two_engines_sums_requests_and_averages_usage():
    second = VLLM_V1.replace('engine="0"', 'engine="1"').replace(" 0.25", " 0.75")
    metrics = parse_metrics(VLLM_V1 + "\n".join(line for line in second.splitlines()
                                                 if line.startswith("vllm:") and "engine=" in line) + "\n")
    assert metrics.kv_usage == 0.5 and metrics.requests_running == 6 and metrics.prefix_cache_queries == 24000


def test_vllm_v0_gauges():
    metrics = parse_metrics(VLLM_V0)
    assert metrics.source == "vllm" and metrics.kv_usage == 0.5 and metrics.prefix_hit_rate == 0.8
    assert metrics.kv_total_tokens is None and metrics.kv_used_tokens is None
    assert (metrics.requests_running, metrics.requests_waiting) == (2, 0)


def test_sglang_figures():
    metrics = parse_metrics(SGLANG)
    assert metrics.source == "sglang"
    assert metrics.kv_usage == 0.28 and (metrics.kv_used_tokens, metrics.kv_total_tokens) == (123859, 442343)
    assert metrics.prefix_hit_rate == pytest.approx(0.0075, abs=1e-4)
    assert (metrics.requests_running, metrics.requests_waiting) == (4, 2)


def test_a_page_without_known_figures_gives_nothing():
    assert parse_metrics("# TYPE up gauge\nup 1\n") is None
    assert parse_metrics("") is None


def test_hit_rate_counts_only_this_run_where_the_server_counts_hits():
    memory = RunMemory(ServerMetrics(), metrics_url="http://x/metrics")
    assert not memory.available and memory.prefix_hit_rate is None and memory.note == "not read yet"
    memory.observe(ServerMetrics("vllm", kv_usage=0.1, prefix_cache_hits=500.0, prefix_cache_queries=1000.0))
    assert memory.prefix_hit_rate is None  # nothing asked since the run started
    memory.observe(ServerMetrics("vllm", kv_usage=0.4, prefix_cache_hits=1400.0, prefix_cache_queries=2000.0))
    memory.observe(ServerMetrics("vllm", kv_usage=0.2, prefix_cache_hits=2300.0, prefix_cache_queries=3000.0))
    assert memory.prefix_hit_rate == 0.9 and memory.samples == 3
    assert memory.peak.kv_usage == 0.4 and memory.latest.kv_usage == 0.2
    memory.observe(None, "cannot read http://x/metrics: ConnectError")
    assert memory.latest.kv_usage == 0.2 and "ConnectError" in memory.note
    summary = memory.server_dict()
    assert summary["available"] and summary["peak_kv_usage"] == 0.4 and summary["final"]["kv_usage"] == 0.2


def read(handler) -> tuple:
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await scrape(http, "http://server:8000/metrics")
    return asyncio.run(go())


def test_scrape_reads_a_page_and_says_why_when_it_cannot():
    metrics, note = read(lambda request: httpx.Response(200, text=SGLANG))
    assert metrics.source == "sglang" and note == ""
    assert read(lambda request: httpx.Response(404)) == (None, "the server has no http://server:8000/metrics (404)")
    assert read(lambda request: httpx.Response(200, text="up 1\n"))[1].endswith("no vLLM, SGLang or swarm KV figures")

    def refuse(request):
        raise httpx.ConnectError("connection refused")
    assert read(refuse) == (None, "cannot read http://server:8000/metrics: ConnectError")
