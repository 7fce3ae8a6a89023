
import pytest

from engine.errors import SpecError
from swarm.spec.schema import load_spec
from tests.helpers.spec_files import EXAMPLE_SPEC, MINIMAL, REPO, alias_bomb_tool, load, spec_error


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


def test_weights_default_to_auto_and_a_checkpoint_may_be_quantized_at_load(tmp_path):
    assert load(tmp_path, MINIMAL).weights == "auto"
    assert load(tmp_path, MINIMAL + "weights: float\n").weights == "float"
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}")   # the spec reads no further than this
    assert load(tmp_path, MINIMAL.replace("smollm2-135m-instruct", "checkpoint") + "weights: q8_0\n").weights == "q8_0"


def test_decode_graphs_default_on_and_graphs_false_turns_them_off(tmp_path):
    assert load(tmp_path, MINIMAL).graphs is True
    assert load(tmp_path, MINIMAL + "graphs: false\n").graphs is False


def test_canonicalize_is_off_unless_the_spec_turns_it_on(tmp_path):
    assert load(tmp_path, MINIMAL).canonicalize is False
    assert load(tmp_path, MINIMAL + "canonicalize: true\n").canonicalize is True


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
    (MINIMAL + "weights: q8\n", 4, "weights", "did you mean 'q8_0'"),
    (MINIMAL + "weights: q8_0\n", 4, "weights", "is a GGUF file, which keeps its own formats"),
    ("task: x\nagents: 2\n", 1, "model", "missing required key"),
    (MINIMAL.replace("task: fix the failing test\n", ""), 2, "task", "missing required key"),
    ("model: smollm2-135m-instruct\nagents:\n  - name: a\n", 3, "agents[0].task", "missing required key"),
    (MINIMAL.replace("smollm2-135m-instruct", "no-such-model"), 1, "model", "not found"),
    (MINIMAL + "harness: coding-agnt\n", 4, "harness", "did you mean 'coding-agent'"),
    (MINIMAL + "kv_budget: 8 parsecs\n", 4, "kv_budget", "unknown unit"),
    (MINIMAL + "graphs: sometimes\n", 4, "graphs", "expected true or false"),
    (MINIMAL + "canonicalize: yes please\n", 4, "canonicalize", "expected true or false"),
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


@pytest.mark.parametrize("section, value", [
    ("sampling:\n  temperature: {}\n", "NaN"), ("sampling:\n  temperature: {}\n", ".nan"),
    ("sampling:\n  top_p: {}\n", ".NaN"), ("sampling:\n  top_k: {}\n", ".nan"),
    ("sampling:\n  max_tokens: {}\n", ".inf"), ("limits:\n  max_tokens: {}\n", "-.inf"),
    ("limits:\n  max_turns: {}\n", "inf"), ("limits:\n  wall_time: {}\n", ".inf"),
    ("run_command:\n  timeout: {}\n", ".nan"), ("kv_budget: {}\n", ".nan"), ("kv_budget: {}\n", "Infinity"),
])
def test_nan_and_infinity_are_not_numbers(tmp_path, section, value):
    message, line, _, rest = spec_error(tmp_path, MINIMAL + section.format(value))
    assert line == 4 + section.count("\n") - 1, message
    assert rest == f"expected a finite number, got {value!r}", message


@pytest.mark.parametrize("section, key", [
    ("sampling:\n  temperature: true\n", "sampling.temperature"), ("limits:\n  wall_time: false\n", "limits.wall_time"),
    ("limits:\n  max_turns: true\n", "limits.max_turns"), ("kv_budget: true\n", "kv_budget"),
])
def test_booleans_are_not_numbers(tmp_path, section, key):
    message, _, found_key, rest = spec_error(tmp_path, MINIMAL + section)
    assert found_key == key and rest.startswith("expected ") and "got a boolean" in rest, message


def test_a_missing_workspace_is_named_with_its_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    for text, key, words in [("workspace: {path: nowhere}\n", "workspace.path", "no folder"),
                             ("workspace: nowhere\n", "workspace", "no folder"),
                             ("workspace:\n  path: a-file\n", "workspace.path", "is a file, not a folder")]:
        message, line, found_key, rest = spec_error(tmp_path, MINIMAL + text)
        assert (line, found_key) == (3 + text.count("\n"), key), message
        assert words in rest and str(tmp_path) in rest, message


@pytest.mark.parametrize("tools, line, key, words", [
    ("  - {name: read_file}\n", 5, "extra_tools[0]", "the harness already has a tool named 'read_file'"),
    ("  - {name: open_ticket}\n  - {name: close_ticket}\n  - {name: open_ticket}\n", 7, "extra_tools[2]",
     "extra_tools[0] is already named 'open_ticket'; tool names must differ"),
])
def test_duplicate_tool_names_are_spec_errors(tmp_path, tools, line, key, words):
    message, found_line, found_key, rest = spec_error(tmp_path, MINIMAL + "extra_tools:\n" + tools)
    assert (found_line, found_key) == (line, key) and words in rest, message


def test_shared_readonly_refuses_the_run_command_tool(tmp_path):
    shared = MINIMAL + "workspace:\n  path: .\n  mode: shared-readonly\n"
    message, line, key, rest = spec_error(tmp_path, shared + "run_command: {enabled: true}\n")
    assert (line, key) == (6, "workspace.mode") and "run_command.enabled: false" in rest, message
    assert load(tmp_path, shared + "run_command: {enabled: false}\n").workspace.mode == "shared-readonly"
    reviewer = load(tmp_path, shared + "harness: reviewer\nrun_command: {enabled: true}\n")  # has no run_command
    assert reviewer.run_command.enabled


def test_out_naming_a_file_is_a_spec_error(tmp_path):
    (tmp_path / "taken").write_text("")
    for out in ("taken", "taken/runs"):
        message, line, key, rest = spec_error(tmp_path, MINIMAL + f"out: {out}\n")
        assert (line, key) == (4, "out") and f"{tmp_path / 'taken'} is a file" in rest, message


@pytest.mark.parametrize("key", ["out"])   # a mapping under harness: is an inline external harness
def test_a_mapping_where_a_name_belongs_is_refused_not_taken_for_the_default(tmp_path, key):
    message, line, found_key, rest = spec_error(tmp_path, MINIMAL + f"{key}: {{name: x}}\n")
    assert (line, found_key, rest) == (4, key, "expected a string, got a mapping"), message


def test_aliases_that_stay_small_still_load(tmp_path):
    """A real bomb is refused in test_run_cmd.py, in a subprocess that a regression cannot hang."""
    spec = load(tmp_path, MINIMAL + alias_bomb_tool(levels=3, width=3))
    assert spec.extra_tools[0]["function"]["parameters"]["properties"]["l2"] == [[["lol"] * 3] * 3] * 3


def test_an_alias_to_itself_and_deep_nesting_are_refused(tmp_path):
    message, line, key, rest = spec_error(tmp_path, MINIMAL + "extra_tools:\n  - &me {name: me, parameters: *me}\n")
    assert (line, key) == (5, "extra_tools[0].parameters") and "holds itself" in rest, message
    message, line, key, rest = spec_error(tmp_path, MINIMAL + "extra_rules: " + "[" * 200 + "]" * 200 + "\n")
    assert line == 4 and "nested more than 64 levels deep" in rest, message
