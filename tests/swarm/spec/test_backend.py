"""swarm.yaml's `backend:` key: a remote OpenAI-compatible server instead of the local engine."""
import pytest

from engine.errors import SpecError
from swarm.spec.backend import BACKEND_KEYS
from swarm.spec.schema import load_spec
from swarm.trunk.report import inspect_prefix
from tests.helpers.spec_files import EXAMPLE_SPEC, MINIMAL, REPO, load, spec_error, write_spec

REMOTE = """\
task: fix the failing test
agents: 2
backend:
  type: openai
  base_url: http://gpu-box:8000/v1/
  model: Qwen/Qwen3-8B
"""


def test_local_is_the_default_and_can_be_named(tmp_path):
    assert not load(tmp_path, MINIMAL).backend.is_remote
    assert not load(tmp_path, MINIMAL + "backend: local\n").backend.is_remote
    assert not load(tmp_path, MINIMAL + "backend: {type: local}\n").backend.is_remote


def test_openai_backend_needs_no_local_model(tmp_path):
    spec = load(tmp_path, REMOTE)
    backend = spec.backend
    assert backend.is_remote and spec.model == ""
    assert backend.base_url == "http://gpu-box:8000/v1" and backend.model == "Qwen/Qwen3-8B"
    assert backend.metrics_url == "http://gpu-box:8000/metrics"
    assert backend.api_key_env is None and backend.api_key == "EMPTY"


def test_a_local_model_is_kept_but_not_loaded_and_engine_keys_are_noted(tmp_path):
    spec = load(tmp_path, "model: /nowhere/Qwen3-8B\ndevice: cuda\nkv_budget: 8GB\n" + REMOTE)
    assert spec.model == "/nowhere/Qwen3-8B"
    assert spec.ignored_keys == ["device", "kv_budget"]


def test_the_api_key_comes_from_the_named_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_TEST_KEY", "sk-123")
    spec = load(tmp_path, REMOTE + "  api_key_env: SWARM_TEST_KEY\n")
    assert spec.backend.api_key == "sk-123"


@pytest.mark.parametrize("text, line, key, words", [
    (REMOTE + "  api_key_env: SWARM_UNSET_KEY_VAR\n", 7, "backend.api_key_env",
     "$SWARM_UNSET_KEY_VAR is not set; export it"),
    (REMOTE + "  api_key_env: sk-abc123\n", 7, "backend.api_key_env", "not an environment variable name"),
    (REMOTE.replace("http://gpu-box:8000/v1/", "gpu-box:8000"), 5, "backend.base_url", "is not an http(s) URL"),
    (REMOTE.replace("  model: Qwen/Qwen3-8B\n", ""), 4, "backend.model", "missing required key"),
    (REMOTE.replace("model: Qwen/Qwen3-8B", "model: ''"), 6, "backend.model", "is empty"),
    (REMOTE.replace("type: openai", "type: vllm"), 4, "backend.type", "'vllm' is not one of local, openai"),
    (REMOTE + "  base_ulr: x\n", 7, "backend.base_ulr", "did you mean 'base_url'"),
    (MINIMAL + "backend: openai\n", 4, "backend", "openai needs a mapping"),
    (MINIMAL + "backend: remote\n", 4, "backend", "is not one of local, openai"),
    (MINIMAL + "backend: {type: local, model: x}\n", 4, "backend.model", "only applies to type: openai"),
    ("task: x\nagents: 2\n", 1, "model", "missing required key"),
])
def test_each_backend_mistake_is_one_line_naming_file_line_and_key(tmp_path, monkeypatch, text, line, key, words):
    monkeypatch.delenv("SWARM_UNSET_KEY_VAR", raising=False)
    message, found_line, found_key, _ = spec_error(tmp_path, text)
    assert (found_line, found_key) == (line, key), message
    assert words in message


def test_inspect_prefix_asks_for_a_local_model_with_a_remote_backend(tmp_path):
    with pytest.raises(SpecError, match="set model: to a local copy of 'Qwen/Qwen3-8B'"):
        inspect_prefix(write_spec(tmp_path, REMOTE))


def test_every_backend_key_is_documented_and_the_example_still_runs_locally():
    readme, example = (REPO / "README.md").read_text(), EXAMPLE_SPEC.read_text()
    assert "| `backend` |" in readme and "## Remote backends: vLLM, SGLang, or swarm serve" in readme
    for key in BACKEND_KEYS:
        assert f"| `backend.{key}` |" in readme and f"#   {key}:" in example
    assert not load_spec(EXAMPLE_SPEC).backend.is_remote
