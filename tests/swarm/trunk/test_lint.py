import os

from swarm.spec.harness import resolve_harness
from swarm.spec.schema import load_spec
from swarm.trunk.lint import find_divergences, lint_trunk
from swarm.trunk.volatile_patterns import Volatiles
from tests.helpers.chat_templates import LLAMA31_TOOLS_IN_USER
from tests.helpers.spec_files import EXAMPLE_SPEC, MINIMAL, default_tokenizer, load, prompts_for, with_template

NO_MACHINE = Volatiles(cwds=(), home="", hostname="", branch="", commit="")


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


def test_a_planted_host_and_short_commit_are_reported_with_their_lines(tmp_path):
    spec_path = tmp_path / "swarm.yaml"
    load(tmp_path, MINIMAL + "extra_rules:\n"
         '  - "Re-run the x86-64 build with utf-8 files."\n'
         '  - "Deploy from host build-07 only."\n'
         '  - "The base is commit 3f2a9c1d."\n')
    prompts, source, variables = prompts_for(load_spec(spec_path))
    findings = lint_trunk(prompts, source, variables, NO_MACHINE)
    assert [(f.kind, f.text, f.source, f.line) for f in findings] == [
        ("hostname", "host build-07", str(spec_path), 6), ("git_hash", "commit 3f2a9c1d", str(spec_path), 7)]


def test_the_example_spec_and_both_harnesses_have_no_findings_on_this_machine():
    for harness in ("coding-agent", "reviewer"):
        spec = load_spec(EXAMPLE_SPEC)
        spec.harness = resolve_harness(harness, EXAMPLE_SPEC.parent)
        prompts, source, variables = prompts_for(spec)
        assert lint_trunk(prompts, source, variables, Volatiles.detect(spec.workspace.path, spec.out)) == []
