import subprocess
import sys

import pytest

from engine.errors import SpecError
from swarm.spec.harness import TEMPLATES_DIR, available_harnesses, load_harness, resolve_harness
from tests.helpers.spec_files import REPO, alias_bomb_tool


def test_shipped_harnesses_resolve_by_name():
    assert {"coding-agent", "reviewer"} <= set(available_harnesses())
    coding = load_harness(resolve_harness("coding-agent", TEMPLATES_DIR))
    assert {t["function"]["name"] for t in coding.tools} == {"list_dir", "read_file", "search", "write_file",
                                                             "run_command"}
    reviewer = load_harness(resolve_harness("reviewer", TEMPLATES_DIR))
    assert {t["function"]["name"] for t in reviewer.tools} == {"list_dir", "read_file", "search"}


def test_rule_and_tool_lines_point_into_the_file():
    harness = load_harness(resolve_harness("coding-agent", TEMPLATES_DIR))
    lines = harness.path.read_text().splitlines()
    for rule, line in zip(harness.rules, harness.rule_lines):
        assert rule[:30].replace('"', '\\"')[:20] in lines[line - 1]
    for name, line in harness.tool_lines.items():
        assert f'"{name}"' in lines[line - 1]


def test_unknown_names_get_a_suggestion_and_paths_resolve(tmp_path):
    with pytest.raises(ValueError, match="did you mean 'reviewer'"):
        resolve_harness("reviewr", tmp_path)
    (tmp_path / "mine.yaml").write_text("name: mine\nrules: [Be brief.]\ntools: []\n")
    assert load_harness(resolve_harness("./mine.yaml", tmp_path)).rules == ["Be brief."]
    with pytest.raises(ValueError, match="no harness file"):
        resolve_harness("./other.json", tmp_path)


@pytest.mark.parametrize("text, words", [
    ('{"rules": "one"}', "rules must be a list of strings"),
    ('{"rules": [], "tool": []}', "unknown harness keys"),
    ('{"rules": [], "tools": [{"name": "a b"}]}', "tools: tool name"),
    ('{"rules": [}', "not valid JSON"),
])
def test_malformed_harness_files_name_the_file(tmp_path, text, words):
    path = tmp_path / "h.json"
    path.write_text(text)
    with pytest.raises(SpecError, match=words) as caught:
        load_harness(path)
    assert str(caught.value).startswith(str(path))


def test_a_yaml_alias_bomb_in_a_harness_is_refused(tmp_path):
    """In a subprocess, so that a regression, which would expand 9^9 values, cannot hang the suite."""
    path = tmp_path / "h.yaml"
    path.write_text("name: h\nrules: []\n" + alias_bomb_tool(key="tools"))
    code = f"from pathlib import Path; from swarm.spec.harness import load_harness; load_harness(Path({str(path)!r}))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"SpecError: {path}:13: tools[0].parameters.properties.l5: expands to more than 100,000 values" \
        in result.stderr, result.stderr
