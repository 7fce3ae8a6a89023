"""What a run on a remote server shows: the dashboard frame and the plain lines."""
import io
from pathlib import Path

from rich.console import Console

from engine.sampling import SamplingParams
from swarm.agents.agent import Agent, AgentLimits
from swarm.agents.progress import AgentState
from swarm.cli.dashboard import Dashboard
from swarm.cli.plain_view import PlainView
from swarm.run.facts import OPENAI_FACTS
from swarm.run.memory import RunMemory
from swarm.run.server_metrics import ServerMetrics
from swarm.run.summary import RunInfo

INFO = RunInfo("run-1", Path("/runs/run-1"), "swarm.yaml", model="Qwen/Qwen3-8B", device="remote",
               facts=OPENAI_FACTS, base_url="http://gpu:8000/v1")


def agents() -> list[Agent]:
    made = [Agent(name, None, SamplingParams(), AgentLimits(30, 32768), lambda e: None, usage=True)
            for name in ("a1", "a2")]
    first, second = made
    first.state, first.turn, first.last_tool = AgentState.TOOL, 2, "read_file"
    first.usage.prompt_tokens_total, first.usage.cached_tokens_total = 3000, 2400
    first.usage.last_prompt_tokens, first.usage.last_cached_tokens, first.context = 1600, 1200, 1650
    second.state = AgentState.PREFILL
    return made


def server_memory() -> RunMemory:
    return RunMemory(ServerMetrics(), metrics_url="http://gpu:8000/metrics")


def frame(server: RunMemory) -> str:
    dashboard = Dashboard(Console(record=True, width=220))
    dashboard.info, dashboard.agents, dashboard.memory = INFO, agents(), server
    console = Console(record=True, width=220)
    console.print(dashboard.render())
    return console.export_text()


def test_remote_frame_shows_the_server_and_cached_tokens_per_agent():
    server = server_memory()
    server.observe(ServerMetrics("vllm", kv_usage=0.37, kv_used_tokens=12_000, kv_total_tokens=32_768,
                                 prefix_cache_hits=0.0, prefix_cache_queries=0.0, requests_running=2,
                                 requests_waiting=0))
    server.observe(ServerMetrics("vllm", kv_usage=0.25, kv_used_tokens=8_192, kv_total_tokens=32_768,
                                 prefix_cache_hits=2400.0, prefix_cache_queries=3000.0, requests_running=1,
                                 requests_waiting=0))
    text = frame(server)
    assert "run-1 · Qwen/Qwen3-8B · openai server http://gpu:8000/v1" in text
    assert "25% in use (peak 37%) · 8,192 of 32,768 tokens" in text
    assert "prefix hit rate 80% · 1 running · 0 waiting" in text
    assert "2,400 of 3,000 prompt tokens came from the server's cache (80%)" in text
    header = next(line for line in text.splitlines() if "last tool" in line)
    assert header.split()[:6] == ["agent", "state", "turn", "context", "cached", "last"]
    row = next(line for line in text.splitlines() if line.strip().startswith("a1 "))
    assert row.split()[:10] == ["a1", "tool", "3", "1,650", "2,400", "1,200/1,600", "(75%)", "n/a", "n/a", "0.0"]
    assert "█" in row and "▒" in row
    other = next(line for line in text.splitlines() if line.strip().startswith("a2 "))
    assert other.split()[:8] == ["a2", "prefill", "1", "-", "-", "-", "n/a", "n/a"]


def test_without_metrics_every_server_figure_is_unavailable():
    server = server_memory()
    server.observe(None, "the server has no http://gpu:8000/metrics (404)")
    text = frame(server)
    assert "unavailable (the server has no http://gpu:8000/metrics (404))" in text
    assert "prefix hit rate unavailable · unavailable running · unavailable waiting" in text


def test_plain_view_prints_the_server_line_and_the_cached_tokens_at_the_end():
    stream = io.StringIO()
    view = PlainView(stream)
    server = server_memory()
    server.observe(ServerMetrics("sglang", kv_usage=0.28, prefix_hit_rate=0.5, requests_running=4,
                                 requests_waiting=2))
    made = agents()
    view.start(INFO, made, server)
    view.refresh(10.0)
    view.refresh(10.0)  # unchanged, and too soon: not printed again
    made[1].usage.cached_tokens_total, made[1].usage.prompt_tokens_total = None, 500
    view.close({"status": "completed", "run_dir": "/runs/run-1", "backend": {"type": "openai"},
                "agents": [{"name": a.name, "status": "done", "end_reason": "final_answer", "turns": 1,
                            "generated_tokens": 9, "prompt_tokens_total": a.usage.prompt_tokens_total,
                            "cached_tokens_total": a.usage.cached_tokens_total} for a in made]})
    lines = stream.getvalue().splitlines()
    assert lines[0] == ("swarm: run run-1: 2 agents, Qwen/Qwen3-8B on the openai server http://gpu:8000/v1, "
                        "writing to /runs/run-1")
    assert sum("server KV 28% in use" in line for line in lines) == 2  # once while running, once at the end
    assert "prefix hit rate 50% · 4 running · 2 waiting" in lines[1]
    assert lines[2].split()[-2:] == ["cached", "2400"] and lines[3].split()[-2:] == ["cached", "unavailable"]
    assert lines[-1] == ("swarm: completed: 2,400 of 3,500 prompt tokens came from the server's cache (69%); "
                         "summary in /runs/run-1/summary.json")
