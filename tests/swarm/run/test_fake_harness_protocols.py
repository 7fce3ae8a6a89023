"""tests/helpers/fake_harness.py against a real swarm server on the tiny model, for each of the three
APIs: a streamed first request with its cwd and tools, a tool call, its result, a second turn, exit 0."""
import json
import os
import subprocess

import pytest

from tests.helpers.processes import HANG_GUARD, PYTHON, REPO
from tests.helpers.runs import tiny_model
from tests.helpers.serving import MODEL, ServerThread, scripted, start_engine

FAKE_HARNESS = REPO / "tests" / "helpers" / "fake_harness.py"
API_KEY = "agent-a-key"
FILE_TEXT = "def add(a, b):\n    return a - b\n"
READ_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
ROUTES = {"anthropic": ("", "messages"), "openai-responses": ("/v1", "responses"),
          "openai-chat": ("/v1", "chat-completions")}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    return tmp_path_factory.mktemp("captured")


@pytest.fixture(scope="module")
def server(tmp_path_factory, captured):
    engine = start_engine(tiny_model(tmp_path_factory.getbasetemp()))
    with ServerThread(engine, api_key=API_KEY, capture_dir=captured) as running:
        yield running


def run_fake_harness(server: ServerThread, api: str, cwd, api_key: str = API_KEY) -> subprocess.CompletedProcess:
    """(A wrong key is a 401 in each API's shape: tests/swarm/server/test_agent_keys.py, with the same SDKs.)"""
    suffix, _ = ROUTES[api]
    command = [PYTHON, str(FAKE_HARNESS), "--api", api, "--base-url", server.url + suffix, "--api-key", api_key,
               "--model", MODEL, "--task", "Fix the bug in a.py."]
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}   # as a harness gets it: nothing of the tests'
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_GUARD * 4,
                          check=False)


def bodies(folder) -> list[tuple[str, dict]]:
    files = sorted(f for f in folder.glob("*.json") if not f.name.endswith(".meta.json"))
    return [(f.stem.split("-", 1)[1], json.loads(f.read_text())) for f in files]


def tool_result_of(api: str, body: dict):
    if api == "anthropic":
        block = body["messages"][-1]["content"][0]
        return block["type"], block["content"]
    if api == "openai-responses":
        item = body["input"][-1]
        return item["type"], item["output"]
    message = body["messages"][-1]
    return message["role"], message["content"]


def system_of(api: str, body: dict) -> str:
    if api == "anthropic":
        return body["system"][0]["text"]
    return body["instructions"] if api == "openai-responses" else body["messages"][0]["content"]


@pytest.mark.parametrize("api", sorted(ROUTES))
def test_the_fake_harness_makes_a_tool_round_trip_and_exits_0(server, captured, tmp_path, api):
    (tmp_path / "a.py").write_text(FILE_TEXT)
    seen = len(bodies(captured))
    with scripted(server, f"Let me look.\n{READ_CALL}", "Fixed it."):
        done = run_fake_harness(server, api, tmp_path)
    assert done.returncode == 0, done.stderr
    turns = [json.loads(line) for line in done.stdout.splitlines()]
    assert [t["calls"] for t in turns] == [[{"name": "read_file", "arguments": {"path": "a.py"}}], []]
    assert turns[1]["text"] == "Fixed it." and done.stderr == ""
    requests = bodies(captured)[seen:]
    assert [route for route, _ in requests] == [ROUTES[api][1]] * 2
    first, second = (body for _, body in requests)
    assert first["stream"] is second["stream"] is True and len(first["tools"]) == 4
    assert system_of(api, first).endswith(f"Working directory: {tmp_path}\n</env>")
    expected_kind = {"anthropic": "tool_result", "openai-responses": "function_call_output"}.get(api, "tool")
    assert tool_result_of(api, second) == (expected_kind, FILE_TEXT)
