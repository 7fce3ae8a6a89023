import json
import os
import time
from pathlib import Path

import pytest

import harness_templates
from swarm.agents.tool_calls import ToolCall
from swarm.agents.tools import JSON_TYPE_NAMES, TOOLS, ToolBox, tool_params
from swarm.agents.workspace import Workspace
from tests.helpers.processes import (
    BIG_FILE_LINES,
    HANG_GUARD,
    call_with_guard,
    peak_growth_of_tool_call,
    write_big_text_file,
)

TEMPLATES_DIR = Path(harness_templates.__file__).parent
READ_ONLY_TOOLS = ("list_dir", "read_file", "search")   # the reviewer harness's tools


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    return 1\n")
    (root / "src" / "pkg" / "util.py").write_text("def helper():\n    pass\n")
    (root / "README.md").write_text("# demo\ncall main()\n")
    (root / "data.bin").write_bytes(b"main\x00\x01\x02")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.py").write_text("def main(): pass\n")
    (root / "escape").symlink_to(tmp_path / "outside")
    (root / "escape.py").symlink_to(tmp_path / "outside" / "secret.py")
    return root


def run(root, name, read_only=False, **arguments):
    box = ToolBox(Workspace(root, read_only=read_only), allow_commands=not read_only)
    return box.run(ToolCall(name, arguments, raw=""))


def test_list_dir_marks_directories(root):
    result = run(root, "list_dir")
    assert result.ok and not result.truncated
    assert result.output.splitlines() == ["README.md", "data.bin", "escape/", "escape.py", "src/"]
    assert run(root, "list_dir", path="src").output.splitlines() == ["app.py", "pkg/"]


def test_list_dir_of_a_file_or_missing_path_explains(root):
    assert "use read_file" in run(root, "list_dir", path="README.md").output
    result = run(root, "list_dir", path="nope")
    assert not result.ok and "does not exist" in result.output


def test_read_file_numbers_lines_and_honours_an_inclusive_range(root):
    assert run(root, "read_file", path="src/app.py").output.splitlines()[0] == "   1 | import os"
    result = run(root, "read_file", path="src/app.py", start_line=3, end_line=4)
    assert result.output.splitlines() == ["   3 | def main():", "   4 |     return 1"]
    assert run(root, "read_file", path="src/app.py", start_line=4, end_line=99).output == "   4 |     return 1"


@pytest.mark.parametrize("start, end, message", [
    (0, None, "must be 1 or more"), (9, None, "past the end"), (3, 2, "before start_line")])
def test_read_file_bad_ranges_explain(root, start, end, message):
    result = run(root, "read_file", path="src/app.py", start_line=start, end_line=end)
    assert not result.ok and message in result.output


def test_read_file_refuses_binary_files_and_directories(root):
    assert "binary" in run(root, "read_file", path="data.bin").output
    assert "is a directory" in run(root, "read_file", path="src").output


def test_search_reports_file_line_text_and_skips_binary_and_outside_links(root):
    result = run(root, "search", pattern=r"main\(")
    assert result.ok
    assert result.output.splitlines() == ["README.md:2: call main()", "src/app.py:3: def main():"]


def test_search_with_path_and_glob(root):
    assert run(root, "search", pattern="def", path="src/pkg").output == "src/pkg/util.py:1: def helper():"
    assert run(root, "search", pattern="def", glob="util.py").output == "src/pkg/util.py:1: def helper():"
    assert run(root, "search", pattern="def", glob="src/*.py").output.count("\n") == 1
    assert "no matches" in run(root, "search", pattern="def", glob="*.md").output


def test_search_with_a_bad_regex_explains(root):
    result = run(root, "search", pattern="(unclosed")
    assert not result.ok and "not a valid Python regular expression" in result.output


def test_write_file_creates_parent_directories(root):
    result = run(root, "write_file", path="new/deep/file.txt", content="one\ntwo\n")
    assert result.ok and "wrote 2 lines" in result.output
    assert (root / "new" / "deep" / "file.txt").read_text() == "one\ntwo\n"


def test_read_only_workspace_refuses_writes(root):
    result = run(root, "write_file", read_only=True, path="x.txt", content="x")
    assert not result.ok and "read-only" in result.output
    assert not (root / "x.txt").exists()


@pytest.mark.parametrize("name, arguments", [
    ("read_file", {"path": "../outside/secret.py"}),
    ("read_file", {"path": "/etc/passwd"}),
    ("read_file", {"path": "escape.py"}),
    ("read_file", {"path": "escape/secret.py"}),
    ("list_dir", {"path": "escape"}),
    ("search", {"pattern": "main", "path": "escape"}),
    ("write_file", {"path": "escape/planted.py", "content": "x"}),
    ("write_file", {"path": "../planted.py", "content": "x"}),
])
def test_escapes_are_refused_by_every_tool(root, name, arguments):
    result = run(root, name, **arguments)
    assert not result.ok
    assert "leaves the workspace" in result.output or "outside the workspace" in result.output \
        or "is absolute" in result.output
    assert not (root.parent / "outside" / "planted.py").exists()
    assert not (root.parent / "planted.py").exists()


def test_run_command_runs_in_the_workspace_and_reports_exit_code_and_streams(root):
    result = run(root, "run_command", command="ls src; echo oops >&2; exit 3")
    assert result.ok
    assert result.output.splitlines() == ["exit code: 3", "--- stdout ---", "app.py", "pkg",
                                          "--- stderr ---", "oops"]


def test_run_command_is_killed_at_its_timeout(root):
    started = time.monotonic()
    result = run(root, "run_command", command="echo started; sleep 30", timeout=2)
    assert time.monotonic() - started < HANG_GUARD
    assert not result.ok and "timed out after 2 s" in result.output and "started" in result.output


def test_run_command_timeout_is_capped_by_the_toolbox(root):
    box = ToolBox(Workspace(root), allow_commands=True, max_command_timeout=0.3)
    result = box.run(ToolCall("run_command", {"command": "sleep 30", "timeout": 100}, raw=""))
    assert "timed out after 0.3 s" in result.output


def test_run_command_disabled_explains(root):
    result = ToolBox(Workspace(root)).run(ToolCall("run_command", {"command": "touch x"}, raw=""))
    assert not result.ok and "run_command is disabled" in result.output
    assert "run_command" not in result.output.split("can call are:")[1]
    assert not (root / "x").exists()


def test_tools_outside_the_agents_set_are_not_available(root):
    box = ToolBox(Workspace(root), READ_ONLY_TOOLS)
    result = box.run(ToolCall("write_file", {"path": "x", "content": ""}, raw=""))
    assert not result.ok and "not available to you" in result.output and "list_dir, read_file, search" in result.output


@pytest.mark.parametrize("name, arguments, message", [
    ("delete_file", {"path": "a"}, "unknown tool 'delete_file'; the tools you can call are: list_dir"),
    ("read_file", {}, "missing the required argument 'path'"),
    ("read_file", {"path": "a", "lines": 3}, "read_file has no argument 'lines'"),
    ("read_file", {"path": 3}, "argument 'path' of read_file must be string, not integer 3"),
    ("read_file", {"path": "README.md", "start_line": "2"}, "must be integer or null, not string '2'"),
    ("read_file", {"path": "README.md", "start_line": True}, "must be integer or null, not boolean"),
    ("run_command", {"command": "true", "timeout": "10"}, "must be number, not string"),
    ("list_dir", ["src"], "must be a JSON object"),
])
def test_malformed_calls_become_errors_with_usage(root, name, arguments, message):
    result = ToolBox(Workspace(root), allow_commands=True).run(ToolCall(name, arguments, raw=""))
    assert not result.ok and result.output.startswith("error: ")
    assert message in result.output


def test_usage_is_shown_in_argument_errors(root):
    output = run(root, "read_file").output
    assert 'read_file {"path": <string>, "start_line": <integer or null, optional>' in output


def test_large_read_is_truncated_with_a_note_saying_where_to_continue(root):
    (root / "big.txt").write_text("".join(f"line {n}\n" for n in range(1, 2001)))
    box = ToolBox(Workspace(root), max_output_chars=1000)
    result = box.run(ToolCall("read_file", {"path": "big.txt", "start_line": 11}, raw=""))
    assert result.truncated and len(result.output) < 1300
    body, note = result.output.rsplit("\n", 1)
    last_shown = int(body.splitlines()[-1].split("|")[0])
    assert f"start_line={last_shown + 1}" in note
    assert f"Lines up to {last_shown} were shown" in note and "characters were cut" in note


def test_large_command_output_is_truncated_with_a_hint(root):
    box = ToolBox(Workspace(root), allow_commands=True, max_output_chars=500)
    result = box.run(ToolCall("run_command", {"command": "seq 1 5000"}, raw=""))
    assert result.ok and result.truncated
    assert "output truncated" in result.output and "read_file" in result.output


def test_tool_failures_from_the_os_become_errors(root):
    result = run(root, "write_file", path="README.md/child", content="x")
    assert not result.ok and result.output.startswith("error: write_file failed")


@pytest.mark.parametrize("template, expected_tools", [
    ("coding-agent", list(TOOLS)), ("reviewer", list(READ_ONLY_TOOLS))])
def test_template_schemas_match_the_tool_signatures(template, expected_tools):
    data = json.loads((TEMPLATES_DIR / f"{template}.json").read_text())
    assert {"name", "description", "rules", "tools"} <= data.keys()
    assert all(isinstance(rule, str) and rule for rule in data["rules"])
    assert [tool["function"]["name"] for tool in data["tools"]] == expected_tools
    for tool in data["tools"]:
        assert tool["type"] == "function" and tool["function"]["description"]
        schema, params = tool["function"]["parameters"], tool_params(tool["function"]["name"])
        assert list(schema["properties"]) == [param.name for param in params]
        assert schema["required"] == [param.name for param in params if param.required]
        for param in params:
            json_types = {JSON_TYPE_NAMES[kind] for kind in param.types} - {"null"}
            assert {schema["properties"][param.name]["type"]} == json_types


def test_template_rules_are_static_text():
    for template in ("coding-agent", "reviewer"):
        rules = " ".join(json.loads((TEMPLATES_DIR / f"{template}.json").read_text())["rules"])
        assert "<tool_call>" in rules and "final answer" in rules
        assert "/tmp" not in rules and "/home" not in rules and "{date" not in rules


@pytest.mark.parametrize("name, arguments", [
    ("read_file", {"path": "pipe"}), ("write_file", {"path": "pipe", "content": "x"}),
    ("search", {"pattern": "x", "path": "pipe"})])
def test_a_fifo_is_refused_and_never_hangs_a_tool(root, name, arguments):
    os.mkfifo(root / "pipe")
    result = call_with_guard(lambda: run(root, name, **arguments))
    assert not result.ok and "'pipe' is a named pipe (FIFO); only regular files and folders can be used" \
        in result.output


def test_a_symlink_loop_is_called_a_loop_by_the_tools(root):
    (root / "loop").symlink_to("loop")
    for name in ("read_file", "list_dir"):
        assert "path 'loop' is a symlink loop" in run(root, name, path="loop").output


def test_write_file_through_a_link_to_outside_writes_nothing_there(root):
    result = run(root, "write_file", path="escape/new_dir/planted.py", content="x")
    assert not result.ok and "outside the workspace" in result.output
    assert sorted(os.listdir(root.parent / "outside")) == ["secret.py"]


def test_read_file_cuts_a_very_long_line_and_stops_at_its_bound(root):
    (root / "minified.js").write_bytes(b"x" * (3 << 20) + b"\nsecond\n")
    box = ToolBox(Workspace(root), max_output_chars=4_000_000)
    lines = box.run(ToolCall("read_file", {"path": "minified.js"}, raw="")).output.splitlines()
    assert lines[0] == "   1 | " + "x" * (1 << 20) + f" [... line cut: {(3 << 20) - (1 << 20)} more bytes]"
    assert lines[1].endswith("to see the rest, call read_file with start_line=2]")
    assert box.run(ToolCall("read_file", {"path": "minified.js", "start_line": 2}, raw="")).output == "   2 | second"


def test_read_file_streams_a_126_mb_file(tmp_path):
    write_big_text_file(tmp_path / "big.txt")
    measured = peak_growth_of_tool_call(tmp_path, "read_file", {"path": "big.txt", "start_line": BIG_FILE_LINES})
    assert measured["output"].startswith(f"{BIG_FILE_LINES:>4} | NEEDLExxx")
    assert measured["grown_mb"] < 100, measured["grown_mb"]
