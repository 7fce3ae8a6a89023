"""swarm/cli/harness_dashboard.py: the live table of an external harness's agents in a real terminal (pexpect),
and its header, rows and plain lines from the figures a run makes."""
import io
import re

from rich.console import Console

from swarm.cli.harness_dashboard import HarnessDashboard, HarnessLines, header_rows
from swarm.run.harness_agents import HarnessAgentRow, HarnessFigures, HarnessRunInfo
from swarm.run.memory import MemorySnapshot, RunMemory
from tests.helpers.external_specs import write_external_spec
from tests.helpers.runs import swarm_in_terminal

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
INFO = HarnessRunInfo("run-1", "tiny", "cpu", "float32", "weights 1.00 MB · F32", "fake", "anthropic", 2,
                      "http://127.0.0.1:4000", "one path (mount namespace)")


def figures() -> HarnessFigures:
    memory = RunMemory(MemorySnapshot(), ["a1", "a2"])
    memory.observe(MemorySnapshot(used_bytes=20_000, total_bytes=100_000, shared_bytes=16_000, private_bytes=4_000,
                                  bytes_without_sharing=36_000, bytes_saved=16_000, agents_with_kv=2,
                                  agents_sharing=2, prefix_hit_rate=0.5))
    rows = [HarnessAgentRow("a1", "generating", 3, 2, 1_210, 2_300, (1_100, 1_150), 16_000, 2_000, 40, None),
            HarnessAgentRow("a2", "exited (0)", 1, 1, 1_090, 1_024, (1_024, 1_040), 16_000, 2_000, 50, 0)]
    memory.set_trunk(1_024, 16)
    memory.block_bytes = 1_000
    return HarnessFigures(rows, memory)


def test_the_frame_has_the_header_figures_and_a_row_per_agent():
    console = Console(file=io.StringIO(), width=200, record=True)
    dashboard = HarnessDashboard(console)
    dashboard.info, dashboard.figures = INFO, figures()
    console.print(dashboard.render())
    text = console.export_text()
    assert "fake (anthropic) · 2 agents · http://127.0.0.1:4000 · one path (mount namespace)" in text
    assert "1,024 tokens pinned · 16.00 KB · shared by 2 of 2 agents in flight" in text
    assert "holding 20.00 KB for what would be 36.00 KB without it" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip().startswith(("a1 ", "a2 "))}
    assert rows["a1"][1:6] == ["generating", "3", "1,210", "2,300", "1,100/1,150"]
    assert rows["a2"][1:3] == ["exited", "(0)"] and rows["a2"][-2] == "0"


def test_the_header_says_when_no_trunk_is_pinned_yet():
    empty = HarnessFigures([], RunMemory(MemorySnapshot(), []))
    assert dict(header_rows(INFO, empty))["trunk"].startswith("not pinned yet")


def test_plain_lines_say_each_answered_request_once_and_each_exit():
    stream = io.StringIO()
    lines = HarnessLines(stream)
    lines.update(figures())
    lines.update(figures())   # nothing new: nothing printed
    text = stream.getvalue()
    assert text.count("a1 request 2 answered: 1,100 of 1,150 prompt tokens cached") == 1
    assert text.count("a2 exited (0)") == 1 and "a1 exited" not in text


def test_swarm_run_of_an_external_harness_in_a_terminal_shows_the_live_table(tmp_path):
    spec, _ = write_external_spec(tmp_path, "openai-chat")
    status, screen = swarm_in_terminal("run", spec, columns=200, timeout=180)
    assert status == 0, screen[-2000:]
    assert "KV pool (host memory)" in screen and "fake (openai-chat) · 2 agents" in screen
    header = next(line for line in screen.splitlines() if "last request cached" in line)
    assert header.split()[:4] == ["agent", "state", "requests", "context"]
    rows = [line.split() for line in screen.splitlines() if line.strip().startswith("agent-")]
    assert {row[0] for row in rows} == {"agent-1", "agent-2"}
    assert {"agent-1", "agent-2"} <= {row[0] for row in rows if row[1:3] == ["exited", "(0)"]}
    assert "completed: 2 agents, a trunk of" in screen
