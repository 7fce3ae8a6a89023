"""swarm/run/harness_agents.py: each state of a harness agent, from a real CLI process and the exchange log's
counts as the server's records make them."""
import sys

from swarm.run.exchange_log import ExchangeLog
from swarm.run.harness_agents import agent_row
from swarm.run.harness_process import HarnessProcess
from swarm.run.memory import AgentMemory
from swarm.server.exchanges import ExchangeFinished, ExchangeStarted

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def started(request_id: str, prompt: int) -> ExchangeStarted:
    return ExchangeStarted("a", "messages", request_id, {"stream": True}, prompt, 0.0)


def finished(request_id: str, prompt: int, cached: int, generated: int) -> ExchangeFinished:
    return ExchangeFinished("a", "messages", request_id, "end_turn", prompt, cached, generated, "ok", [], None, 0.0)


def test_an_agent_goes_through_every_state(tmp_path):
    log = ExchangeLog(tmp_path, ["a"], max_requests=5, max_generated=100)
    counts, kv = log.counts["a"], AgentMemory()
    process = HarnessProcess("a", SLEEPER, {}, tmp_path, tmp_path)
    row = lambda end=None: agent_row("a", process, counts, kv, end)   # noqa: E731
    assert row().state == "queued"
    process.start()
    assert row().state == "starting" and row().context_tokens == 0 and row().last_cached is None
    log.started(started("r1", 100))
    assert row().state == "waiting on the model" and row().context_tokens == 100
    kv.shared_tokens, kv.private_tokens, kv.shared_bytes, kv.private_bytes = 96, 4, 6000, 1000
    assert row().state == "waiting on the model"   # prefilled, no reply token yet
    kv.private_tokens = 7
    assert (row().state, row().context_tokens, row().shared_bytes) == ("generating", 103, 6000)
    kv.peak_shared_bytes, kv.peak_private_bytes = 6000, 1500
    kv.shared_tokens = kv.private_tokens = kv.shared_bytes = kv.private_bytes = 0   # answered: blocks given back
    log.finished(finished("r1", 100, 64, 9))
    now = row()
    assert (now.state, now.requests, now.answered, now.context_tokens) == ("waiting on its harness", 1, 1, 109)
    assert (now.last_cached, now.cached_tokens, now.generated_tokens) == ((64, 100), 64, 9)
    assert (now.shared_bytes, now.private_bytes) == (6000, 1500)   # between requests: the most it held
    process.stop(grace=5)
    assert row("max_turns").state == "stopped (max_turns)" and row().exit_code == row("max_turns").exit_code


def test_a_cli_that_exits_by_itself_shows_its_code(tmp_path):
    log = ExchangeLog(tmp_path, ["a"], max_requests=5, max_generated=100)
    process = HarnessProcess("a", [sys.executable, "-c", "raise SystemExit(3)"], {}, tmp_path, tmp_path).start()
    assert process.wait(60) == 3
    row = agent_row("a", process, log.counts["a"], AgentMemory(), None)
    assert (row.state, row.exit_code) == ("exited (3)", 3)
