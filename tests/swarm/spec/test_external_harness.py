import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import SpecError
from swarm.spec.external_harness import (
    ExternalHarness,
    check_installed,
    is_external_file,
    load_external_harness,
    render,
)
from swarm.spec.harness import TEMPLATES_DIR, available_harnesses, resolve_harness
from tests.helpers.runs import ENV
from tests.helpers.spec_files import MINIMAL, REPO, load, spec_error, write_spec

NAMED = ["claude-code", "codex", "opencode", "aider", "mini-swe-agent"]
PLACEHOLDER = re.compile(r"\{[a-z][a-z0-9_]*\}")
VALUES = dict(task="Add a subtract function to calc.py", model="qwen3-8b", base_url="http://127.0.0.1:8123",
              api_key="swarm-agent-1", context_tokens=40960, output_tokens=2048)
INLINE = MINIMAL + """\
harness:
  name: fake-cli
  api: openai-chat
  command: [fake-cli, --task, "{task}", --url, "{base_url}/v1"]
  env: {FAKE_KEY: "{api_key}", FAKE_LEVEL: 3}
  files: {settings.json: '{"model": "{model}"}'}
  install: pip install fake-cli
"""


def launch(name: str, tmp_path: Path):
    harness = load_external_harness(resolve_harness(name, TEMPLATES_DIR))
    return harness, render(harness, **VALUES, home=tmp_path / "home", workspace=tmp_path / "ws")


def every_text(launched) -> list[str]:
    return [*launched.argv, *launched.env.values(), *launched.files.values()]


@pytest.mark.parametrize("name", NAMED)
def test_each_named_template_renders_with_every_placeholder_filled(tmp_path, name):
    harness, launched = launch(name, tmp_path)
    assert name in available_harnesses() and harness.name == name and harness.install
    assert harness.path == TEMPLATES_DIR / f"{name}.yaml"
    # OpenCode's first request asks for a session title, without tools: its trunk is its first with them
    assert harness.trunk == ("first-request-with-tools" if name == "opencode" else "first-request")
    assert not [text for text in every_text(launched) if PLACEHOLDER.search(text)]
    assert VALUES["task"] in launched.argv   # one argument, never split by a shell
    joined = "\n".join(every_text(launched))
    assert VALUES["model"] in joined and VALUES["base_url"] in joined and VALUES["api_key"] in joined
    assert launched.env["HOME"] == str(tmp_path / "home")
    assert all(path.is_relative_to(tmp_path / "home") for path in launched.files)


def test_claude_code_keeps_its_prompt_shareable_and_its_traffic_local(tmp_path):
    harness, launched = launch("claude-code", tmp_path)
    assert harness.api == "anthropic" and launched.argv[:3] == ["claude", "-p", VALUES["task"]]
    assert launched.env["ANTHROPIC_BASE_URL"] == VALUES["base_url"]   # no /v1: the client adds it
    assert launched.env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    for name in ["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "CLAUDE_CODE_DISABLE_AUTO_MEMORY", "DISABLE_TELEMETRY",
                 "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING"]:
        assert launched.env[name] == "1", name


def test_codex_gets_a_provider_config_pointing_at_swarm(tmp_path):
    harness, launched = launch("codex", tmp_path)
    config = launched.files[tmp_path / "home" / "config.toml"].splitlines()   # TOML; tomllib needs Python 3.11
    assert harness.api == "openai-responses" and launched.env["CODEX_HOME"] == str(tmp_path / "home")
    assert {'model = "qwen3-8b"', 'model_provider = "swarm"', "[model_providers.swarm]",
            'base_url = "http://127.0.0.1:8123/v1"', "model_context_window = 40960",
            'env_key = "SWARM_API_KEY"'} <= set(config)
    assert launched.env["SWARM_API_KEY"] == VALUES["api_key"]


def test_opencode_gets_the_models_real_context_and_output_limits(tmp_path):
    harness, launched = launch("opencode", tmp_path)
    config = json.loads(launched.files[tmp_path / "home" / ".config" / "opencode" / "opencode.json"])
    provider = config["provider"]["swarm"]
    assert harness.api == "openai-chat" and launched.env["XDG_CONFIG_HOME"] == str(tmp_path / "home" / ".config")
    assert provider["options"] == {"baseURL": VALUES["base_url"] + "/v1", "apiKey": VALUES["api_key"]}
    assert provider["models"][VALUES["model"]]["limit"] == {"context": 40960, "output": 2048}
    assert config["model"] == config["small_model"] == f"swarm/{VALUES['model']}"


@pytest.mark.parametrize("name", NAMED)
def test_every_variable_a_template_sets_says_why(name):
    lines = (TEMPLATES_DIR / f"{name}.yaml").read_text().splitlines()
    harness = load_external_harness(TEMPLATES_DIR / f"{name}.yaml")
    for variable in harness.env:
        [line] = [line for line in lines if line.strip().startswith(f"{variable}:")]
        assert "#" in line, line


def test_built_in_harnesses_stay_built_in(tmp_path):
    spec = load(tmp_path, MINIMAL)
    assert spec.external is None and spec.harness == TEMPLATES_DIR / "coding-agent.json"
    assert not is_external_file(spec.harness)


def test_a_spec_names_a_template_or_holds_an_inline_block(tmp_path):
    spec = load(tmp_path, MINIMAL + "harness: codex\n")
    assert spec.harness is None and spec.external.name == "codex"
    spec = load(tmp_path, INLINE)
    harness = spec.external
    assert spec.harness is None and harness.path is None
    assert (harness.name, harness.api, harness.install) == ("fake-cli", "openai-chat", "pip install fake-cli")
    launched = render(harness, **VALUES, home=tmp_path / "h", workspace=tmp_path)
    assert launched.argv == ["fake-cli", "--task", VALUES["task"], "--url", VALUES["base_url"] + "/v1"]
    assert launched.env == {"FAKE_KEY": VALUES["api_key"], "FAKE_LEVEL": "3"}
    assert launched.files == {tmp_path / "h" / "settings.json": '{"model": "qwen3-8b"}'}


def test_a_program_path_is_relative_to_the_template_file(tmp_path):
    (tmp_path / "clis").mkdir()
    (tmp_path / "clis" / "mine.yaml").write_text("external:\n  api: anthropic\n  command: [./bin/mine, '{task}']\n")
    spec = load(tmp_path, MINIMAL + "harness: clis/mine.yaml\n")
    assert spec.external.name == "mine" and spec.external.command[0] == str(tmp_path / "clis" / "bin" / "mine")


@pytest.mark.parametrize("change, line, key, words", [
    (lambda t: t.replace("  command:", "  comand:"), 7, "harness.comand", "did you mean 'command'?"),
    (lambda t: t.replace("api: openai-chat", "api: openai"), 6, "harness.api",
     "'openai' is not one of anthropic, openai-responses, openai-chat"),
    (lambda t: t.replace('"{task}"', '"{taks}"'), 7, "harness.command[2]", "unknown placeholder {taks}; known: {task}"),
    (lambda t: t.replace("[fake-cli,", "['{home}/fake-cli',"), 7, "harness.command[0]",
     "the program cannot hold a placeholder"),
    (lambda t: t.replace("{settings.json:", "{../settings.json:"), 9, "harness.files.../settings.json",
     "name a path inside the agent's home"),
    (lambda t: t.replace("FAKE_LEVEL: 3", "FAKE_LEVEL: true"), 8, "harness.env.FAKE_LEVEL",
     "expected a string or an integer"),
    (lambda t: t.replace("  api: openai-chat\n", ""), 5, "harness.api", "missing required key"),
    (lambda t: MINIMAL + "harness: {name: x}\n", 4, "harness.api", "missing required key"),   # never the default
    (lambda t: t + "extra_rules: [Be brief.]\n", 11, "extra_rules",
     "the external harness fake-cli keeps its own prompt and tools, so swarm cannot add rules to it"),
])
def test_a_bad_inline_block_is_one_line_naming_its_line_and_key(tmp_path, change, line, key, words):
    message, found_line, found_key, _ = spec_error(tmp_path, change(INLINE))
    assert (found_line, found_key) == (line, key) and words in message, message


def test_a_template_file_error_names_the_template_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("external:\n  api: anthropic\n  command: [mine]\n  trunk: dry-request\n")
    with pytest.raises(SpecError, match=rf"^{re.escape(str(path))}:4: external.trunk: 'dry-request' is not one of"):
        load_external_harness(path)


def test_render_refuses_a_placeholder_it_cannot_fill(tmp_path):
    harness = ExternalHarness(name="mine", api="anthropic", command=["mine", "{prompt}"])
    with pytest.raises(SpecError, match=r"^mine: command\[1\]: unknown placeholder \{prompt\}; known: \{task\}"):
        render(harness, **VALUES, home=tmp_path, workspace=tmp_path)


def test_check_installed_finds_a_real_program_and_names_the_install_command_of_a_missing_one(tmp_path):
    assert Path(check_installed(ExternalHarness(name="py", api="openai-chat", command=["python3"]))).name \
        == "python3"
    missing = ExternalHarness(name="claude-code", api="anthropic", command=["claude"],
                              install="npm install -g @anthropic-ai/claude-code")
    with pytest.raises(SpecError) as caught:
        check_installed(missing, search_path=str(tmp_path))
    assert str(caught.value) == ("claude-code: `claude` is not installed; "
                                 "install it with: npm install -g @anthropic-ai/claude-code")
    program = tmp_path / "claude"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert check_installed(missing, search_path=str(tmp_path)) == str(program)


def test_swarm_run_with_a_missing_harness_stops_with_one_line_before_the_model_loads(tmp_path):
    spec = write_spec(tmp_path, INLINE.replace("fake-cli,", "swarm-test-no-such-cli,"))
    result = subprocess.run([sys.executable, "-m", "swarm", "run", str(spec)], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.splitlines() == ["error: fake-cli: `swarm-test-no-such-cli` is not installed; "
                                          "install it with: pip install fake-cli"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swarm.yaml"]   # no run folder: nothing started


def test_inspect_prefix_on_an_external_harness_says_in_one_line_to_capture_its_requests(tmp_path):
    spec = write_spec(tmp_path, INLINE.replace("fake-cli,", f"{sys.executable},"))
    result = subprocess.run([sys.executable, "-m", "swarm", "inspect-prefix", str(spec)], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "fake-cli is an external CLI" in result.stderr
    assert "swarm inspect-prefix --requests" in result.stderr
