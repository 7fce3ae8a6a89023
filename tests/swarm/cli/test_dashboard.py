import io
import re
import time

import pytest
from rich.console import Console

from engine.llm_engine import EngineOptions, LLMEngine
from engine.weight_memory import WeightMemory
from swarm.agents.agent import Agent, AgentLimits, AgentState, ToolJob
from swarm.cli.dashboard import Dashboard, header_rows, memory_bar, pool_label
from swarm.run.local_backend import LocalBackend
from swarm.run.memory import MemorySnapshot, RunMemory
from swarm.run.phases import SwarmRun
from swarm.run.summary import RunInfo
from swarm.spec.kv_budget import format_bytes
from swarm.spec.schema import load_spec
from tests.helpers.runs import REPO, ScriptedSampler, swarm_in_terminal, tiny_model, write_run_spec


def test_swarm_run_in_a_terminal_shows_the_live_table_with_a_row_per_agent(tmp_path, tmp_path_factory):
    spec = write_run_spec(tmp_path, tiny_model(tmp_path_factory.getbasetemp()),
                          agents=[{"name": "alpha"}, {"name": "beta"}], max_tokens=24)
    status, screen = swarm_in_terminal("run", spec, columns=180, timeout=120)
    assert status == 0, screen[-2000:]
    assert "KV pool (host memory)" in screen
    header = next(line for line in screen.splitlines() if "last tool" in line)
    assert header.split()[:3] == ["agent", "state", "turn"]
    rows = [line.split() for line in screen.splitlines() if line.strip().startswith(("alpha ", "beta "))]
    assert {row[0] for row in rows} == {"alpha", "beta"}
    last_frame = [row for row in rows if row[1] == "done"]
    assert {"alpha", "beta"} <= {row[0] for row in last_frame}
    for row in last_frame:  # why it ended, and the KV it held rather than the zero it holds now
        assert row[2].startswith("(") and row[2].endswith(")") and "0 B" not in " ".join(row), row
    assert "completed" in screen


@pytest.fixture
def dashboard_parts():
    memory = RunMemory(MemorySnapshot(), ["a1", "a2"])
    memory.set_trunk(100, 7)
    memory.block_bytes = 1000
    memory.latest = MemorySnapshot(used_bytes=12_000, total_bytes=100_000, shared_bytes=6000, bytes_saved=6000,
                                   agents_sharing=2, prefix_hit_rate=0.75)
    memory.agents["a1"].shared_bytes, memory.agents["a1"].private_bytes = 6000, 2000
    agents = [Agent(name, None, None, AgentLimits(5, 100, 1000), lambda e: None, prompt_tokens=3)
              for name in ("a1", "a2")]
    agents[0].state, agents[0].turn, agents[0].last_tool = AgentState.TOOL, 2, "read_file"
    return RunInfo("run-1", REPO, "swarm.yaml", "tiny", "cpu", "float32", 1_000_000), agents, memory


def test_frame_has_the_header_figures_and_a_row_per_agent(dashboard_parts):
    info, agents, memory = dashboard_parts
    dashboard = Dashboard(Console(record=True, width=200))
    dashboard.info, dashboard.agents, dashboard.memory = info, agents, memory
    console = Console(record=True, width=200)
    console.print(dashboard.render())
    text = console.export_text()
    assert "KV pool (host memory)" in text and "12.00 KB used of 100.00 KB" in text
    assert "100 tokens · 7.00 KB · shared by 2 of 2 agents · saved 6.00 KB" in text
    assert "prefix hit rate 75%" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("a1 "))
    assert row.split()[:4] == ["a1", "tool", "3", "3"] and "read_file" in row  # working on its third turn
    assert next(line for line in text.splitlines() if line.strip().startswith("a2 ")).split()[1] == "queued"


def test_the_header_shows_the_engines_weights_and_their_format(dashboard_parts):
    info, agents, memory = dashboard_parts
    info.weights = WeightMemory(4_920_000_000, {"Q4_K": 3_900_000_000, "Q6_K": 1_020_000_000}, "Q4_K_M")
    label, text = header_rows(info, memory, agents)[0]
    assert label == "swarm run" and text == "run-1 · tiny · cpu · float32 · weights 4.92 GB · Q4_K_M"
    info.weights = None   # a RunInfo that only knows the total still shows it
    assert header_rows(info, memory, agents)[0][1].endswith("· weights 1.00 MB")


def test_memory_bar_splits_shared_and_private_to_scale():
    bar = memory_bar(shared=3000, private=1000, scale=4000, width=8)
    assert bar.plain == "█" * 6 + "▒" * 2
    assert [(span.start, span.end, span.style) for span in bar.spans] == [(0, 6, "blue"), (6, 8, "yellow")]
    assert memory_bar(0, 0, 1, width=4).plain == "····"
    assert memory_bar(0, 1, 10_000, width=4).plain == "▒···"  # a little private memory still shows


def test_pool_label_says_where_the_kv_pool_lives():
    assert pool_label("cpu") == "KV pool (host memory)"
    assert pool_label("cuda:0") == "KV pool (GPU memory)"


def test_the_final_frame_shows_each_agents_end_reason_and_peak_memory(tmp_path, tmp_path_factory):
    """A real run on the tiny model: one agent gives its final answer; the other's tool call is
    still running when the wall time is up (the run's clock jumps an hour ahead once the first
    agent has ended), so the run stops it."""
    scripts = {"done": ["Nothing to do."],
               "slow": ['<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>']}
    model = tiny_model(tmp_path_factory.getbasetemp())
    spec = load_spec(write_run_spec(tmp_path, model, agents=[{"name": name} for name in scripts]))
    engine = LLMEngine(str(model), EngineOptions(device="cpu", dtype="float32", kv_budget_tokens=16000))
    engine.sampler = ScriptedSampler(engine, scripts)
    (tmp_path / "run").mkdir()
    dashboard = Dashboard(Console(file=io.StringIO(), width=200))
    run = SwarmRun(spec, tmp_path / "run", dashboard, backend=LocalBackend(spec, engine))
    late = []
    run.clock = lambda: time.monotonic() + (3600 if late else 0)

    def tool_outlasting_the_wall_time(job, toolbox):
        wait_until(lambda: run.agents[0].ended)
        late.append(True)
        return job
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ToolJob, "run", tool_outlasting_the_wall_time)
        summary = run.run()
    assert summary["status"] == "wall_time"
    console = Console(record=True, width=200)
    console.print(dashboard.render())
    text = console.export_text()
    for agent, reason in (("done", "final_answer"), ("slow", "wall_time")):
        figures = next(a for a in summary["agents"] if a["name"] == agent)
        assert figures["end_reason"] == reason and figures["turns"] == 1
        assert figures["shared_bytes"] > 0 and figures["peak_private_bytes"] > 0
        assert dashboard.memory.agents[agent].private_bytes == 0  # its blocks are given back
        row = next(line for line in text.splitlines() if line.strip().startswith(f"{agent} "))
        shared, private = format_bytes(figures["shared_bytes"]), format_bytes(figures["peak_private_bytes"])
        assert row.split()[1:3] == ["done", f"({reason})"], row
        assert re.search(rf"  {re.escape(shared)} +{re.escape(private)}  ", row), row
    assert "An agent that has ended shows the most KV memory it held." in text


def wait_until(condition, timeout: float = 60.0) -> None:
    """A hang guard, not a measure: the condition comes true in milliseconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.01)
