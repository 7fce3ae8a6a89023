"""`swarm run` with `backend: openai`, end to end against a real `swarm serve` on a local port:
the CLI against the served CLI, and in process against a server whose engine plays scripted
turns, so the tool loop runs through the HTTP API too."""
import asyncio
import io
import json
import re
import signal
import sys
import time

import httpx
import pytest

from engine.sampling import SamplingParams
from swarm.cli.main import main
from swarm.cli.plain_view import PlainView
from swarm.cli.serve import pin_trunk, spec_trunk_ids
from swarm.run.local_backend import LocalBackend
from swarm.run.openai_backend import OpenAIBackend
from swarm.run.openai_client import AssistantReply, ChatClient, ContextFullError, RemoteError
from swarm.run.phases import SwarmRun, backend_for
from swarm.server.app import ServedModel
from swarm.spec.backend import BackendSpec
from swarm.spec.schema import load_spec
from tests.helpers.runs import (
    ENV,
    EOS_ID,
    READER_EVENTS,
    ScriptedSampler,
    interrupt_once_decoding,
    read_transcript,
    swarm,
    tiny_model,
    write_run_spec,
)
from tests.helpers.serving import MODEL, ServerThread, metric, parse_metrics, serve_cli, start_engine, wait_for


def remote_spec(folder, model, base_url: str, served_model: str, **options):
    spec = write_run_spec(folder, model, **options)
    spec.write_text(spec.read_text() + f"backend:\n  type: openai\n  base_url: {base_url}\n  model: {served_model}\n")
    return spec


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def served(model):
    with serve_cli("--model", str(model), "--device", "cpu", "--dtype", "float32") as (info, _):
        yield info


def run_dir_of(folder):
    [run_dir] = [p for p in (folder / "runs").iterdir() if p.is_dir()]
    return run_dir


def test_agents_run_on_swarm_serve_and_the_trunk_hits_its_cache(tmp_path, model, served):
    spec = remote_spec(tmp_path, model, served["url"], served["model"], agents=3, max_tokens=24)
    process = swarm("run", spec, "--no-tui", "--json")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["status"] == "completed" and summary["backend"]["base_url"] == served["url"]
    assert "device, dtype, kv_budget: ignored with backend openai" in stderr
    followers = summary["agents"][1:]
    for agent in summary["agents"]:
        events = read_transcript(run_dir_of(tmp_path) / agent["transcript"])
        assert [e["event"] for e in events[:3]] == ["message", "message", "prefilled"]
        assert events[-1]["event"] == "end" and events[-1]["status"] == agent["status"] == "done"
        turns = [e for e in events if e["event"] == "assistant"]
        assert agent["generated_tokens"] == sum(e["tokens"] for e in turns) > 0
        assert agent["prompt_tokens_total"] == sum(e["prompt_tokens"] for e in turns)
        assert agent["shared_bytes"] is None and agent["peak_private_bytes"] is None
    system_messages = {read_transcript(run_dir_of(tmp_path) / a["transcript"])[0]["content"] for a in summary["agents"]}
    assert len(system_messages) == 1  # the same system message from every agent: the trunk
    for agent in followers:  # they start once the leader's prompt is computed: the trunk is cached
        assert agent["first_turn_cached_tokens"] >= agent["prompt_tokens"] // 2, agent
    assert summary["tokens"]["cached"] == sum(a["cached_tokens_total"] for a in summary["agents"]) > 0
    memory = summary["memory"]
    assert memory["source"] == "swarm" and memory["available"] and memory["samples"] >= 2
    assert memory["pool_bytes"] > 0 and memory["pool_tokens"] == served["kv_tokens"] and memory["prefix_hit_rate"] > 0.3
    assert memory["final"]["requests_running"] == 0 and memory["bytes_saved"] is None
    assert "server KV" in stderr and "came from the server's cache" in stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_cancels_the_requests_on_the_server_and_exits_with_its_code(tmp_path, model, served, sig, code):
    spec = remote_spec(tmp_path, model, served["url"], served["model"], agents=2, max_tokens=900,
                       temperature=0, max_turns=30)
    cancelled_before = cancelled_requests(served)
    code_seen, stdout, stderr = interrupt_once_decoding(["-m", "swarm", "run", str(spec), "--no-tui"], ENV,
                                                        sig=sig)
    assert code_seen == code, stderr
    assert "Traceback" not in stderr and "swarm: interrupted:" in stdout
    summary = json.loads((run_dir_of(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    for agent in summary["agents"]:
        assert agent["status"] == "interrupted" and agent["end_reason"] == "interrupted"
        events = read_transcript(run_dir_of(tmp_path) / agent["transcript"])
        assert events[-1]["event"] == "end" and events[-1]["reason"] == "interrupted"
        partial = [e for e in events if e["event"] == "assistant"]
        assert partial and partial[-1]["partial"] and partial[-1]["tokens"] > 0
        assert agent["turns"] == len(partial)  # the cut turn counts
    samples = wait_for(lambda: (s := server_metrics(served)) and metric(s, "swarm_num_requests_running") == 0 and s)
    assert samples and metric(samples, "swarm_requests_total", finish_reason="cancelled") >= cancelled_before + 2


def server_metrics(served: dict) -> dict[str, float]:
    return parse_metrics(httpx.get(served["url"].removesuffix("/v1") + "/metrics").text)


def cancelled_requests(served: dict) -> float:
    return server_metrics(served).get('swarm_requests_total{finish_reason="cancelled"}', 0.0)


def test_a_server_that_is_not_there_is_one_line_and_a_failed_summary(tmp_path, model, monkeypatch, capsys):
    spec = remote_spec(tmp_path, model, "http://127.0.0.1:9/v1", "tiny", agents=2)
    monkeypatch.setattr(sys, "argv", ["swarm", "run", str(spec), "--no-tui"])
    with pytest.raises(SystemExit) as exit_code:
        main()  # the CLI's own entry point, in this process
    stderr = capsys.readouterr().err
    assert exit_code.value.code == 1
    assert stderr.strip().count("\n") == 0 and "Traceback" not in stderr
    assert re.fullmatch(r"error: cannot reach http://127.0.0.1:9/v1 \(connection refused\): start the server "
                        r".* or fix backend.base_url", stderr.strip()), stderr
    summary = json.loads((run_dir_of(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "failed" and "connection refused" in summary["error"]


class AgentScriptedSampler(ScriptedSampler):
    """The scripted sampler behind a server: requests carry no agent name, their prompts do."""

    def agent_of(self, seq_id: int) -> str:
        seq = self.engine.live[seq_id]
        prompt = self.engine.tokenizer.decode(seq.token_ids[:seq.num_prompt_tokens])
        return re.search(r"Name: (\S+)", prompt).group(1)


# A turn that ends in a call ends with a newline, so the sampler ends it with EOS as a model would.
SCRIPTS = {
    "reader": ['<tool_call>{"name": "read_file", "arguments": {"path": "textkit/__init__.py"}}</tool_call>\n',
               '<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>\n',
               '<tool_call>{"name": "write_file", "arguments": {"path": "textkit/temperature.py", '
               '"content": "FIXED"}}</tool_call>\n',
               "Fixed the formula in textkit/temperature.py."],
    "writer": ['<tool_call>{"name": "write_file", "arguments": {"path": "notes.txt", "content": "hi"}}</tool_call>\n',
               "Wrote notes.txt."],
    "quick": ["Nothing to do."],
}


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory, model):
    """Served like `swarm serve SPEC`: the local run's trunk for this harness prefilled and pinned."""
    engine = start_engine(model, kv_budget_tokens=16000)
    local_spec = load_spec(write_run_spec(tmp_path_factory.mktemp("trunk"), model))
    trunk_tokens, trunk_blocks = pin_trunk(engine, spec_trunk_ids(local_spec, engine))
    engine.sampler = AgentScriptedSampler(engine, SCRIPTS)
    with ServerThread(engine, ServedModel(MODEL, trunk_tokens=trunk_tokens, trunk_blocks=trunk_blocks)) as server:
        yield server


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory, model, scripted_server):
    folder = tmp_path_factory.mktemp("remote-scripted")
    spec = load_spec(remote_spec(folder, model, scripted_server.url + "/v1", MODEL,
                                 agents=[{"name": name} for name in SCRIPTS], max_tokens=160))
    run_dir = folder / "runs" / "scripted"
    run_dir.mkdir(parents=True)
    run = SwarmRun(spec, run_dir, PlainView(open(folder / "log.txt", "w")))
    return run, run.run()


def transcript(run, name):
    return read_transcript(run.info.run_dir / f"agent-{name}.jsonl")


def test_the_tool_loop_runs_through_the_server(scripted_run):
    run, summary = scripted_run
    agents = {a["name"]: a for a in summary["agents"]}
    assert {name: (a["status"], a["end_reason"], a["turns"], a["tool_calls"]) for name, a in agents.items()} == {
        "reader": ("done", "final_answer", 4, 2), "writer": ("done", "final_answer", 2, 1),
        "quick": ("done", "final_answer", 1, 0)}
    assert (run.info.run_dir / "workspaces" / "reader" / "textkit" / "temperature.py").read_text() == "FIXED"
    assert (run.info.run_dir / "workspaces" / "writer" / "notes.txt").read_text() == "hi"
    events = transcript(run, "reader")
    assert [e["event"] for e in events] == READER_EVENTS
    assert events[3]["tool_calls"][0]["function"]["name"] == "read_file"  # the server parsed the call
    assert "tool_calls" not in events[7] and "<tool_call>" in events[7]["content"]  # malformed: left as text
    assert events[5]["output"] == "'textkit/__init__.py' is empty"


def test_each_turn_hits_the_previous_one_and_the_first_hits_the_local_trunk(scripted_run, scripted_server):
    run, summary = scripted_run
    turns = [e for e in transcript(run, "reader") if e["event"] == "assistant"]
    for before, after in zip(turns, turns[1:]):
        assert after["prompt_tokens"] > before["prompt_tokens"]
        assert after["cached_tokens"] >= before["prompt_tokens"] - 16  # all but a partly filled block
    trunk_tokens = scripted_server.served.trunk_tokens
    for agent in summary["agents"]:  # the pinned trunk of the local run is a prefix of every prompt
        assert agent["first_turn_cached_tokens"] >= trunk_tokens // 16 * 16 > 0
    reader = summary["agents"][0]
    assert reader["tool_result_tokens"] > 0 and reader["cached_tokens_total"] > reader["prompt_tokens"]


class HoldSlowMidTurn(AgentScriptedSampler):
    """'quick' gives its final answer; 'slow' writes a long reply, and once 'quick' has ended, the
    sampler holds 'slow' mid-turn and makes the run's clock jump an hour ahead: the run's wall
    time then cuts 'slow' short, as it would a turn that takes too long."""

    def __init__(self, engine, run: SwarmRun, late: list):
        super().__init__(engine, {"quick": ["Nothing to do."], "slow": ["word " * 500]})
        self.run, self.late = run, late
        self.quick_answered, self.slow_tokens = False, 0

    def sample(self, logits, rows) -> list[int]:
        agents = [self.agent_of(seq_id) for seq_id, _ in rows]
        if "slow" in agents and self.slow_tokens and self.quick_answered and not self.late:
            self._hold_slow()  # both replies' tokens so far were delivered after the steps before
        tokens = super().sample(logits, rows)
        for agent, token in zip(agents, tokens):
            self.quick_answered |= agent == "quick" and token == EOS_ID
            self.slow_tokens += agent == "slow"
        return tokens

    def _hold_slow(self) -> None:
        quick, slow = self.run.agents
        assert wait_for(lambda: quick.ended and (turn := self.run.backend.partial(slow)) is not None and turn.tokens,
                        timeout=60)
        self.late.append(True)
        assert wait_for(lambda: slow.ended, timeout=60)


def test_the_wall_time_cuts_a_turn_short_and_the_run_says_wall_time(tmp_path, model):
    engine = start_engine(model, kv_budget_tokens=16000)
    with ServerThread(engine) as server:
        spec = load_spec(remote_spec(tmp_path, model, server.url + "/v1", MODEL,
                                     agents=[{"name": "quick"}, {"name": "slow"}], max_tokens=1000))
        (tmp_path / "run").mkdir()
        run = SwarmRun(spec, tmp_path / "run", PlainView(io.StringIO()))
        late = []
        run.clock = lambda: time.monotonic() + (3600 if late else 0)
        engine.sampler = HoldSlowMidTurn(engine, run, late)
        summary = run.run()
    assert summary["status"] == "wall_time"
    agents = {a["name"]: a for a in summary["agents"]}
    assert (agents["quick"]["status"], agents["quick"]["end_reason"], agents["quick"]["turns"]) == (
        "done", "final_answer", 1)
    assert (agents["slow"]["status"], agents["slow"]["end_reason"], agents["slow"]["turns"]) == ("done", "wall_time", 1)
    events = read_transcript(tmp_path / "run" / "agent-slow.jsonl")
    [turn] = [e for e in events if e["event"] == "assistant"]
    assert turn["partial"] and turn["tokens"] > 0
    assert events[-1]["event"] == "end" and (events[-1]["reason"], events[-1]["turns"]) == ("wall_time", 1)


def test_the_local_backend_stays_the_default(tmp_path, model):
    local = load_spec(write_run_spec(tmp_path / "local", model))
    remote = load_spec(remote_spec(tmp_path / "remote", model, "http://127.0.0.1:9/v1", "tiny"))
    assert type(backend_for(local)) is LocalBackend
    assert type(backend_for(remote)) is OpenAIBackend


def test_the_servers_refusals_become_errors_that_say_what_to_fix(scripted_server):
    url = scripted_server.url + "/v1"

    async def ask(model: str, content: str):
        client = ChatClient(BackendSpec("openai", url, model), max_retries=0)
        try:
            await client.check_model()
            await client.stream_turn([{"role": "user", "content": content}], [], SamplingParams(max_tokens=8),
                                     AssistantReply(), lambda count: None)
        finally:
            await client.close()
    with pytest.raises(RemoteError, match=f"^{url} serves 'tiny', not 'qwen'; set backend.model to one of them$"):
        asyncio.run(ask("qwen", "hi"))
    with pytest.raises(ContextFullError, match="no longer fits the model's context"):
        asyncio.run(ask(MODEL, "x" * 3000))  # the tiny model's context is 2,048 tokens


def test_a_keyed_swarm_serve_takes_the_key_from_the_variable_the_spec_names(tmp_path, model, monkeypatch, capsys):
    with ServerThread(start_engine(model), api_key="s3cret") as keyed:
        spec = remote_spec(tmp_path, model, keyed.url + "/v1", MODEL, agents=2, max_tokens=8)
        spec.write_text(spec.read_text() + "  api_key_env: SWARM_TEST_KEY\n")
        monkeypatch.setattr(sys, "argv", ["swarm", "run", str(spec), "--no-tui"])
        monkeypatch.setenv("SWARM_TEST_KEY", "wrong")
        with pytest.raises(SystemExit) as refused:
            main()
        stderr = capsys.readouterr().err.strip()
        assert refused.value.code == 1 and stderr.count("\n") == 0, stderr
        assert stderr == f"error: {keyed.url}/v1 refused the API key (401): set $SWARM_TEST_KEY to the server's key"
        monkeypatch.setenv("SWARM_TEST_KEY", "s3cret")
        with pytest.raises(SystemExit) as accepted:
            main()
        assert accepted.value.code == 0, capsys.readouterr().err
