"""A spec whose harness is the fake CLI (tests/helpers/fake_harness.py), on the tiny model: `swarm run`
with an external harness as the tests run it."""
from pathlib import Path

from tests.helpers.processes import PYTHON, REPO
from tests.helpers.runs import tiny_model

FAKE = REPO / "tests" / "helpers" / "fake_harness.py"
SPEC = """\
model: {model}
task: Fix the bug in a.py.
agents: {agents}
workspace: {project}
out: {out}
sampling: {{max_tokens: 8}}
harness:
  name: fake
  api: {api}
  command: [{python}, {fake}, --api, {api}, --base-url, "{{base_url}}{suffix}", --api-key, "{{api_key}}",
            --model, "{{model}}", --task, "{{task}}"{extra}]
  files: {{settings.json: '{{"workspace": "{{workspace}}"}}'}}
"""


def write_external_spec(tmp_path, api: str = "openai-chat", agents: int = 2, extra: str = "") -> tuple:
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("def add(a, b):\n    return a - b\n")
    spec = tmp_path / "swarm.yaml"
    suffix = "" if api == "anthropic" else "/v1"
    spec.write_text(SPEC.format(model=tiny_model(tmp_path), agents=agents, project=project, out=tmp_path / "runs",
                                api=api, python=PYTHON, fake=FAKE, suffix=suffix, extra=extra))
    return spec, tmp_path / "runs"


def only_run(runs: Path) -> Path:
    [run_dir] = list(runs.iterdir())
    return run_dir
