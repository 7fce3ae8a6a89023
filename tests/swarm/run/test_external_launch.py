"""Agents of an external harness made ready by swarm/run/external_launch.py and started for real: the
fake harness (tests/helpers/fake_harness.py) as two agents, each in its own copy of the project, with
its own home and key, against one server that attributes every request to its agent."""
import json

from swarm.run.external_launch import agent_keys, prepare_launches
from swarm.run.harness_process import stop_all
from swarm.run.workspace_mount import seen_workspace
from swarm.spec.schema import load_spec
from tests.helpers.processes import HANG_GUARD, PYTHON, REPO
from tests.helpers.runs import tiny_model
from tests.helpers.serving import MODEL, ServerThread, scripted, start_engine

READ_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
SPEC = f"""\
model: {{model}}
task: Fix the bug in a.py.
agents: 2
workspace: {{project}}
harness:
  name: fake
  api: openai-chat
  command: [{PYTHON}, {REPO / "tests/helpers/fake_harness.py"}, --api, openai-chat, --base-url, "{{base_url}}/v1",
            --api-key, "{{api_key}}", --model, "{{model}}", --task, "{{task}}"]
  env: {{FAKE_HOME: "{{home}}"}}
  files: {{settings.json: '{{"workspace": "{{workspace}}", "context": {{context_tokens}}}}'}}
"""


def test_two_agents_start_in_their_own_workspaces_and_homes_and_each_request_is_theirs(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("def add(a, b):\n    return a - b\n")
    model = tiny_model(tmp_path)
    spec_path = tmp_path / "swarm.yaml"
    spec_path.write_text(SPEC.replace("{model}", str(model), 1).replace("{project}", str(project)))
    spec = load_spec(spec_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    keys = agent_keys(spec)
    seen, systems = [], {}

    class Listener:
        def started(self, record):
            seen.append(("started", record.agent, record.api))
            systems.setdefault(record.agent, record.request["messages"][0]["content"])

        def finished(self, record):
            seen.append(("finished", record.agent, record.finish_reason))

    server = ServerThread(start_engine(model), agent_keys={key: name for name, key in keys.items()},
                          exchanges=Listener())
    with server, scripted(server, READ_CALL, "Fixed it.", READ_CALL, "Fixed it."):
        launches = prepare_launches(spec, run_dir, keys, server.url, MODEL, context_tokens=4096, output_tokens=256)
        codes = [launch.process.start().wait(HANG_GUARD * 4) for launch in launches]   # in turn: scripted replies
        stop_all([launch.process for launch in launches], grace=1)
    assert codes == [0, 0], [launch.process.stderr_path.read_text() for launch in launches]
    assert len({launch.key for launch in launches}) == 2
    for launch in launches:
        assert launch.workspace.root == run_dir / "workspaces" / launch.agent
        assert (launch.workspace.root / "a.py").is_file() and launch.home == run_dir / "homes" / launch.agent
        settings = json.loads((launch.home / "settings.json").read_text())
        assert settings == {"workspace": seen_workspace(launch.workspace.root), "context": 4096}
        turns = [json.loads(line) for line in launch.process.stdout_path.read_text().splitlines()]
        assert [t["calls"] for t in turns] == [[{"name": "read_file", "arguments": {"path": "a.py"}}], []]
        mine = [event for event in seen if event[1] == launch.agent]
        assert [event[0] for event in mine] == ["started", "finished"] * 2, seen
    assert {event[1] for event in seen} == {"agent-1", "agent-2"}
    # the system text ends with the cwd: one path for both where a mount namespace puts them there
    same_path = all(launch.confinement == "mount-namespace" for launch in launches)
    assert (systems["agent-1"] == systems["agent-2"]) == same_path
    assert systems["agent-1"].endswith(f"Working directory: {launches[0].seen_workspace}\n</env>")
