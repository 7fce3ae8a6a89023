import json
import subprocess
import sys

import pytest
import torch

from engine.llm_engine import pick_dtype
from swarm.cli.main import main
from swarm.spec.schema import load_spec
from tests.helpers.spec_files import EXAMPLE_SPEC, MINIMAL, REPO, prompts_for, write_spec


@pytest.fixture
def swarm_cli(monkeypatch, capsys):
    """Runs `swarm ARGS...` in this process through the real entry point."""
    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["swarm", *map(str, args)])
        with pytest.raises(SystemExit) as exited:
            main()
        out, err = capsys.readouterr()
        return exited.value.code, out, err
    return run


def test_prints_trunk_agents_lint_and_memory(swarm_cli):
    code, out, err = swarm_cli("inspect-prefix", EXAMPLE_SPEC)
    assert code == 0, err
    trunk = prompts_for(load_spec(EXAMPLE_SPEC))[0].trunk
    assert f"trunk: {len(trunk.token_ids):,} tokens, sha256 {trunk.sha256[:16]}" in out
    dtype = pick_dtype("auto", torch.device("cpu"))
    bytes_per_token = 2 * 30 * 3 * 64 * torch.tensor([], dtype=dtype).element_size()
    for text in ("Agents", "fixer", "reviewer-1", "prefix lint: no findings", "KV memory: 4 agents",
                 f"{bytes_per_token:,} B"):
        assert text in out


def test_json_sizes_the_articles_swarm_for_qwen3_8b(swarm_cli):
    code, out, _ = swarm_cli("inspect-prefix", EXAMPLE_SPEC, "--json", "--model-config", "Qwen3-8B",
                             "--agents", "8", "--budget", "8.09GB")
    assert code == 0
    report = json.loads(out)
    trunk = prompts_for(load_spec(EXAMPLE_SPEC))[0].trunk
    assert report["schema_version"] == 1
    assert report["trunk"]["tokens"] == len(trunk.token_ids)
    assert report["trunk"]["sha256"] == trunk.sha256
    assert report["kv_shape"] == {"layers": 36, "kv_heads": 8, "head_dim": 128, "dtype_bytes": 2}
    memory = report["memory"]
    assert (memory["bytes_per_token"], memory["agents"], memory["budget_bytes"]) == (147_456, 8, 8_090_000_000)
    assert [r["trunk_tokens"] for r in memory["rows"]] == [len(trunk.token_ids), 2000, 3000, 4000, 6000]
    row = memory["rows"][3]
    assert (row["freed_tokens"], row["more_context_per_agent"], row["more_agents"]) == (28_000, 3_500, 9)
    assert [a["in_trunk"] for a in report["agents"]] == [False] * 4
    assert report["findings"] == [] and report["clean"] is True


def test_strict_fails_on_findings(swarm_cli, tmp_path):
    spec = write_spec(tmp_path, MINIMAL + 'extra_rules:\n  - "Today is 2024-05-01."\n')
    assert swarm_cli("inspect-prefix", spec)[0] == 0
    code, out, _ = swarm_cli("inspect-prefix", spec, "--strict")
    assert code == 1
    assert "2024-05-01" in out and "date" in out
    code, out, _ = swarm_cli("inspect-prefix", spec, "--strict", "--json")
    report = json.loads(out)
    assert code == 1 and report["clean"] is False
    assert [(f["kind"], f["line"]) for f in report["findings"]] == [("date", 5)]


@pytest.mark.parametrize("text, key", [
    (MINIMAL + "sampling:\n  temprature: 0.5\n", "sampling.temprature: unknown key; did you mean 'temperature'?"),
    (MINIMAL.replace("agents: 3", "agents: four"), "agents: expected a count"),
    ("task: x\nagents: 2\n", "model: missing required key"),
    (MINIMAL.replace("smollm2-135m-instruct", "no-such-model"), "model: model 'no-such-model' not found"),
    (MINIMAL + "limits: [1\n", "broken YAML"),
])
def test_bad_specs_exit_2_with_one_line(swarm_cli, tmp_path, text, key):
    spec = write_spec(tmp_path, text)
    code, out, err = swarm_cli("inspect-prefix", spec)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {spec}:")
    assert key in err


@pytest.mark.parametrize("args, words", [
    (["--budget", "8 parsecs"], "error: --budget: unknown unit"),
    (["--model-config", "Qwen9-1T"], "error: --model-config: no model config 'Qwen9-1T'"),
    (["--reference-trunks", "a,b"], "error: --reference-trunks:"),
])
def test_bad_options_exit_2_with_one_line(swarm_cli, args, words):
    code, _, err = swarm_cli("inspect-prefix", EXAMPLE_SPEC, *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith(words), err


def test_as_a_real_command_errors_have_no_traceback(tmp_path):
    spec = write_spec(tmp_path, MINIMAL + "agnets: 3\n")
    done = subprocess.run([sys.executable, "-m", "swarm", "inspect-prefix", str(spec)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"error: {spec}:4: agnets: unknown key; did you mean 'agents'?\n"
    assert "Traceback" not in done.stdout + done.stderr


def test_help_names_every_option(swarm_cli):
    code, out, _ = swarm_cli("inspect-prefix", "--help")
    assert code == 0
    for option in ("--model-config", "--agents", "--budget", "--strict", "--json", "Qwen3-8B"):
        assert option in out
