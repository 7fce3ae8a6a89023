import re

import pytest

from engine.errors import SpecError
from swarm.spec import load_spec
from tests.swarm.spec_files import EXAMPLE_SPEC, MINIMAL, REPO, load, write_spec

ONE_LINE = re.compile(r"^(?P<file>\S+):(?P<line>\d+): (?P<key>[^:]+): .+$")


def spec_error(tmp_path, text: str) -> tuple[str, int, str, str]:
    path = write_spec(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "\n" not in message
    assert caught.value.exit_code == 2
    match = ONE_LINE.match(message)
    assert match, message
    assert match["file"] == str(path)
    return message, int(match["line"]), match["key"], message.split(": ", 2)[2]


def test_example_spec_loads_with_every_key():
    spec = load_spec(EXAMPLE_SPEC)
    assert [a.name for a in spec.agents] == ["fixer", "tester", "documenter", "reviewer-1"]
    assert spec.agents[3].task == spec.task
    assert spec.agents[1].context == {"focus": "tests/"}
    assert spec.harness == REPO / "harness_templates" / "coding-agent.json"
    assert spec.kv_budget.bytes == 200_000_000
    assert spec.workspace.path == REPO / "swarm" / "example_workspace"
    assert spec.workspace.mode == "copy"
    assert spec.sampling.seed == 1234 and spec.limits.max_turns == 8
    assert spec.run_command.enabled and spec.run_command.timeout == 30
    assert spec.out == REPO / "runs"


def test_counted_agents_get_names_and_the_default_task(tmp_path):
    spec = load(tmp_path, MINIMAL)
    assert [(a.name, a.task) for a in spec.agents] == [(f"agent-{i}", "fix the failing test") for i in (1, 2, 3)]
    assert spec.kv_budget is None and spec.dtype == "auto" and spec.workspace.path == tmp_path


def test_auto_kv_budget_is_no_budget(tmp_path):
    assert load(tmp_path, MINIMAL + "kv_budget: auto\n").kv_budget is None
    assert load(tmp_path, MINIMAL + "kv_budget: 20000\n").kv_budget.tokens == 20000


def test_lines_of_extra_rules_are_recorded(tmp_path):
    spec = load(tmp_path, MINIMAL + 'extra_rules:\n  - "one"\n  - |\n    two\n    lines\n')
    assert spec.lines["extra_rules[0]"] == (5, 5)
    assert spec.lines["extra_rules[1]"] == (6, 8)


@pytest.mark.parametrize("text, line, key, words", [
    (MINIMAL + "sampling:\n  temprature: 0.5\n", 5, "sampling.temprature", "did you mean 'temperature'"),
    (MINIMAL + "agnets: 3\n", 4, "agnets", "did you mean 'agents'"),
    (MINIMAL + "limits:\n  max_turns: many\n", 5, "limits.max_turns", "expected an integer, got a string 'many'"),
    (MINIMAL + "sampling:\n  top_k: true\n", 5, "sampling.top_k", "expected an integer"),
    (MINIMAL.replace("agents: 3", "agents: four"), 3, "agents", "expected a count like 4"),
    (MINIMAL + "dtype: fp8\n", 4, "dtype", "'fp8' is not one of auto"),
    ("task: x\nagents: 2\n", 1, "model", "missing required key"),
    (MINIMAL.replace("task: fix the failing test\n", ""), 2, "task", "missing required key"),
    ("model: smollm2-135m-instruct\nagents:\n  - name: a\n", 3, "agents[0].task", "missing required key"),
    (MINIMAL.replace("smollm2-135m-instruct", "no-such-model"), 1, "model", "not found"),
    (MINIMAL + "harness: coding-agnt\n", 4, "harness", "did you mean 'coding-agent'"),
    (MINIMAL + "kv_budget: 8 parsecs\n", 4, "kv_budget", "unknown unit"),
    (MINIMAL + "workspace: {path: ., mode: cpy}\n", 4, "workspace.mode", "did you mean 'copy'"),
    (MINIMAL + "model: other\n", 4, "model", "duplicate key"),
    (MINIMAL + "extra_tools:\n  - {name: 'bad name!'}\n", 5, "extra_tools[0]", "must be 1-64 letters"),
    ("model: smollm2-135m-instruct\nagents:\n  - {name: a, task: t}\n  - {name: a, task: t}\n",
     4, "agents", "two agents are named 'a'"),
])
def test_each_mistake_is_one_line_naming_file_line_and_key(tmp_path, text, line, key, words):
    message, found_line, found_key, rest = spec_error(tmp_path, text)
    assert (found_line, found_key) == (line, key), message
    assert words in rest, message


def test_broken_yaml_names_the_line(tmp_path):
    message, line, key, _ = spec_error(tmp_path, MINIMAL + "sampling: [0.5\nlimits: 3\n")
    assert line == 5 and key == "broken YAML"


def test_empty_and_missing_files(tmp_path):
    assert "empty" in spec_error(tmp_path, "")[0]
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


def test_model_path_relative_to_the_spec(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    spec = load(tmp_path, MINIMAL.replace("smollm2-135m-instruct", "m.gguf"))
    assert spec.model == str(tmp_path / "m.gguf")
