import os
import socket
from pathlib import Path

import pytest

from swarm.prefix_lint import find_divergences, lint_trunk
from swarm.spec import load_spec
from swarm.volatile_patterns import Volatiles, find_volatile
from tests.swarm.chat_templates import LLAMA31_TOOLS_IN_USER
from tests.swarm.spec_files import (EXAMPLE_SPEC, MINIMAL, REPO, default_tokenizer, load, prompts_for,
                                    with_template)

NO_MACHINE = Volatiles(cwds=(), home="", hostname="", branch="", commit="")


def kinds(text: str, volatiles: Volatiles = NO_MACHINE) -> list[tuple[str, str]]:
    return [(text[start:end], kind) for start, end, kind in find_volatile(text, volatiles)]


@pytest.mark.parametrize("text, expected", [
    ("Today is 2024-05-01.", [("2024-05-01", "date")]),
    ("Built 26 Jul 2024 and May 1, 2024", [("26 Jul 2024", "date"), ("May 1, 2024", "date")]),
    ("at 2024-05-01T10:00:00Z", [("2024-05-01T10:00:00Z", "timestamp")]),
    ("It is 14:03 now", [("14:03", "time")]),
    ("run 3f2a9c1e-1b2c-4d5e-8f90-0123456789ab", [("3f2a9c1e-1b2c-4d5e-8f90-0123456789ab", "uuid")]),
    ("build 9f8e7d6c5b4a39281726", [("9f8e7d6c5b4a39281726", "hex_id")]),
    ("commit 0123456789abcdef0123456789abcdef01234567", [("0123456789abcdef0123456789abcdef01234567", "git_hash")]),
    ("work in /home/bob/proj.", [("/home/bob/proj", "home_dir")]),
    ("or ~/proj", [("~/proj", "home_dir")]),
    ("see /usr/lib/x.so", [("/usr/lib/x.so", "abs_path")]),
    ("on branch feature/login-fix.", [("on branch feature/login-fix", "git_branch")]),
    ("pid 4242 died", [("pid 4242", "pid")]),
])
def test_volatile_shapes(text, expected):
    assert kinds(text) == expected


@pytest.mark.parametrize("text", [
    "paths like src/app.py or tests/test_parser.py", "see https://example.com/a/b", "use a ~ b and/or c",
    "print 'file:line: text'", "create a branch for each fix", "version 3.10 and 2 of 3",
])
def test_ordinary_rule_text_is_not_volatile(text):
    assert kinds(text) == []


def test_the_shipped_harnesses_are_clean():
    for name in ("coding-agent", "reviewer"):
        text = (REPO / "harness_templates" / f"{name}.json").read_text()
        assert kinds(text, Volatiles.detect()) == [], name


def test_this_machines_values_are_found():
    here = Volatiles.detect(Path("/tmp/some-workspace"))
    text = f"cwd {os.getcwd()}/src host {socket.gethostname()} ws /tmp/some-workspace/a"
    found = dict((kind, value) for value, kind in kinds(text, here))
    assert found["cwd"] in (f"{os.getcwd()}/src", "/tmp/some-workspace/a")
    if len(socket.gethostname()) >= 3 and socket.gethostname() != "localhost":
        assert found["hostname"] == socket.gethostname()


def test_planted_date_cwd_and_uuid_are_reported_with_file_line_and_token(tmp_path):
    cwd = os.getcwd()
    spec_path = tmp_path / "swarm.yaml"
    load(tmp_path, MINIMAL + "extra_rules:\n"
         '  - "Keep it short."\n'
         '  - "Today is 2024-05-01."\n'
         f'  - "Work in {cwd}."\n'
         "  - |\n"
         "    Two lines, the second\n"
         "    names run 3f2a9c1e-1b2c-4d5e-8f90-0123456789ab.\n")
    spec = load_spec(spec_path)
    prompts, source, variables = prompts_for(spec)
    findings = lint_trunk(prompts, source, variables, Volatiles.detect(spec.workspace.path))
    got = [(f.kind, f.text, f.source, f.line) for f in findings]
    assert got == [("date", "2024-05-01", str(spec_path), 6), ("cwd", cwd, str(spec_path), 7),
                   ("uuid", "3f2a9c1e-1b2c-4d5e-8f90-0123456789ab", str(spec_path), 10)]
    tokenizer = default_tokenizer()
    for finding in findings:
        window = prompts.trunk.token_ids[finding.token_index:finding.token_index + 8]
        assert finding.text[:4] in tokenizer.decode(window)


def test_per_agent_variables_are_findings_and_divergences(tmp_path):
    spec = load(tmp_path, "model: smollm2-135m-instruct\nagents:\n"
                "  - {name: alice, task: a, context: {team: red, site: x}}\n"
                "  - {name: bob, task: b, context: {team: blue, site: x}}\n"
                "extra_rules:\n  - \"Static.\"\n  - \"You are on team {{ team }} at {{ site }}.\"\n")
    prompts, source, variables = prompts_for(spec)
    findings = lint_trunk(prompts, source, variables, NO_MACHINE)
    assert [(f.kind, f.text, f.line) for f in findings] == [("template_var", "{{ team }}", 7)]
    divergences = find_divergences(default_tokenizer(), prompts, source, variables)
    assert [(d.agent, d.other, d.in_trunk) for d in divergences] == [("alice", "bob", True), ("bob", "alice", True)]
    assert divergences[0].token_index == len(prompts.trunk.token_ids)
    assert "swarm.yaml:7" in divergences[0].reason and "{{ team }}" in divergences[0].reason


def test_clean_agents_diverge_after_the_trunk_at_their_name():
    prompts, source, variables = prompts_for(load_spec(EXAMPLE_SPEC))
    divergences = find_divergences(default_tokenizer(), prompts, source, variables)
    assert len(divergences) == 4
    for d in divergences:
        assert not d.in_trunk and d.token_index > len(prompts.trunk.token_ids)
        assert "'Name'" in d.reason


def test_a_date_the_chat_template_writes_is_attributed_to_the_template(tmp_path):
    prompts, source, variables = prompts_for(load(tmp_path, MINIMAL), with_template(LLAMA31_TOOLS_IN_USER))
    findings = lint_trunk(prompts, source, variables, NO_MACHINE)
    assert [(f.kind, f.text, f.source, f.line) for f in findings] == [("date", "26 Jul 2024", "chat template", None)]


def test_a_finding_in_a_harness_file_names_its_line(tmp_path):
    harness = tmp_path / "h.json"
    harness.write_text('{"name": "h",\n "rules": [\n  "Fine.",\n  "Logs go to /var/log/agent."\n ],\n "tools": []}\n')
    prompts, source, variables = prompts_for(load(tmp_path, MINIMAL + "harness: h.json\n"))
    findings = lint_trunk(prompts, source, variables, NO_MACHINE)
    assert [(f.kind, f.source, f.line) for f in findings] == [("abs_path", str(harness), 4)]
