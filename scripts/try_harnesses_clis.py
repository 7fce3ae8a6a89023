"""How scripts/try_harnesses.py starts each coding-agent CLI against a loopback `swarm serve`: its command,
its environment (a dummy key, telemetry off, a private HOME) and config files, and the tool call the
scripted sampler makes it run (a read of calc.py) before its final answer."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

QUIET = {"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
         "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
         "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
         "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors"}
FINAL = "Done: calc.py holds add(); subtract() goes next to it."
AIDER_EDIT = ("calc.py\n```python\n<<<<<<< SEARCH\ndef add(a, b):\n    return a + b\n=======\ndef add(a, b):\n"
              "    return a + b\n\n\ndef subtract(a, b):\n    return a - b\n>>>>>>> REPLACE\n```\n")


@dataclass(frozen=True, slots=True)
class Harness:
    name: str
    api: str
    command: Callable  # (project, port, home, task, args) -> argv
    env: Callable      # (port, home, args) -> variables; writes the CLI's config files under home
    call: Callable     # project -> the tool call of the first turn ({"name", "arguments"}), or None
    final: Callable    # project -> the last reply: a text, or one more call

    def script(self, project: Path) -> dict:
        return {"call": self.call(project), "final": self.final(project), "title": "Add subtract"}


def _npm_bin(args, name: str) -> str:
    return str(Path(args.clis) / "node_modules" / ".bin" / name)


def _claude_env(port: int, home: Path, args) -> dict:
    return {**QUIET, "HOME": str(home), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
            "ANTHROPIC_AUTH_TOKEN": "dummy", "ANTHROPIC_MODEL": "tiny", "ANTHROPIC_SMALL_FAST_MODEL": "tiny",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": "tiny"}


CODEX_CONFIG = """\
model = "tiny"
model_provider = "swarm"

[model_providers.swarm]
name = "swarm"
base_url = "http://127.0.0.1:{port}/v1"
wire_api = "responses"
env_key = "SWARM_API_KEY"
"""


def _codex_env(port: int, home: Path, args) -> dict:
    (home / "config.toml").write_text(CODEX_CONFIG.format(port=port))
    return {**QUIET, "HOME": str(home), "CODEX_HOME": str(home), "SWARM_API_KEY": "dummy"}


def _opencode_env(port: int, home: Path, args) -> dict:
    """No `limit.output`: OpenCode then asks for 32,000 output tokens, which serve must clamp."""
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "swarm",
                "options": {"baseURL": f"http://127.0.0.1:{port}/v1", "apiKey": "dummy"},
                "models": {"tiny": {"name": "tiny", "limit": {"context": 65536, "output": 32000}}}}
    config = {"$schema": "https://opencode.ai/config.json", "provider": {"swarm": provider}, "model": "swarm/tiny",
              "small_model": "swarm/tiny", "autoupdate": False, "share": "disabled"}
    folder = home / ".config" / "opencode"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "opencode.json").write_text(json.dumps(config, indent=1))
    return {**QUIET, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}


def _python_env(port: int, home: Path, args) -> dict:
    return {**QUIET, "HOME": str(home)}


def _aider_command(project, port, home, task, args) -> list[str]:
    return [str(Path(args.venv) / "bin" / "aider"), "--model", "openai/tiny", "--edit-format", "diff",
            "--openai-api-base", f"http://127.0.0.1:{port}/v1", "--openai-api-key", "dummy", "--no-auto-commits",
            "--no-gitignore", "--yes-always", "--no-check-update", "--analytics-disable", "--no-show-model-warnings",
            "--no-pretty", "--message", task, "calc.py"]


def _mini_command(project, port, home, task, args) -> list[str]:
    settings = [f"model.model_kwargs.api_base=http://127.0.0.1:{port}/v1", "model.model_kwargs.api_key=dummy",
                "agent.step_limit=4", "agent.cost_limit=0"]
    return [str(Path(args.venv) / "bin" / "mini"), "-m", "openai/tiny", "-y", "--exit-immediately", "-t", task,
            "-c", "mini.yaml", *[part for setting in settings for part in ("-c", setting)],
            "-o", str(home / f"{project.name}.traj.json")]


HARNESSES = {harness.name: harness for harness in [
    Harness("claude-code", "messages",
            lambda project, port, home, task, args: [_npm_bin(args, "claude"), "-p", task, "--output-format", "json"],
            _claude_env, lambda project: {"name": "Read", "arguments": {"file_path": str(project / "calc.py")}},
            lambda project: FINAL),
    Harness("codex", "responses",
            lambda project, port, home, task, args: [_npm_bin(args, "codex"), "exec", "--skip-git-repo-check", task],
            _codex_env, lambda project: {"name": "exec_command", "arguments": {"cmd": "cat calc.py"}},
            lambda project: FINAL),
    Harness("opencode", "chat completions",
            lambda project, port, home, task, args: [_npm_bin(args, "opencode"), "run", task],
            _opencode_env, lambda project: {"name": "read", "arguments": {"filePath": str(project / "calc.py")}},
            lambda project: FINAL),
    Harness("aider", "chat completions", _aider_command, _python_env, lambda project: None,
            lambda project: AIDER_EDIT),
    Harness("mini-swe-agent", "chat completions", _mini_command, _python_env,
            lambda project: {"name": "bash", "arguments": {"command": "cat calc.py"}},
            lambda project: {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}),
]}
