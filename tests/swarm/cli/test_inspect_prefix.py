import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import LLM, WEIGHT_FILE_TYPES
from swarm.spec.schema import load_spec
from tests.helpers.spec_files import EXAMPLE_SPEC, MINIMAL, REPO, prompts_for, write_spec


def test_prints_trunk_agents_lint_and_memory(swarm_cli):
    code, out, err = swarm_cli("inspect-prefix", EXAMPLE_SPEC)
    assert code == 0, err
    trunk = prompts_for(load_spec(EXAMPLE_SPEC))[0].trunk
    assert f"trunk: {len(trunk.token_ids):,} tokens, sha256 {trunk.sha256[:16]}" in out
    bytes_per_token = LLM(load_spec(EXAMPLE_SPEC).model).engine.kv_bytes_per_token   # the pool the engine keeps
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
    assert report["kv_shape"] == {"layers": 36, "kv_heads": 8, "head_dim": 128, "dtype_bytes": 2, "linear_layers": 0}
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
    for option in ("--model-config", "--agents", "--budget", "--weights", "--card", "--strict", "--json", "Qwen3-8B"):
        assert option in out
    assert all(file_type in out for file_type in WEIGHT_FILE_TYPES)   # the help lists every type it sizes


SEED_CARD = ["--model-config", "Qwen3-8B", "--weights", "q4_k_m", "--card", "16GB"]


def test_the_seeds_card_gives_the_weights_the_reserve_and_the_budget_without_a_spec(swarm_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")   # one line per figure
    code, out, err = swarm_cli("inspect-prefix", *SEED_CARD)
    assert code == 0, err
    assert "Qwen3-8B: no spec, so the memory table has the reference trunks only" in out
    assert "weights 5.02 GB · Q4_K_M (estimated: llama.cpp's Q4_K_M tensor types on Qwen3-8B's shapes)" in out
    assert ("card 16.00 GB − weights 5.02 GB − runtime reserve 1.31 GB (1.07 GB for the runtime + 234.88 MB of "
            "activations in a 2,048-token prefill step) = KV budget 9.67 GB = 65,575 tokens") in out
    assert "KV memory: 8 agents, budget 9.67 GB = 65,575 tokens" in out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert rows == ["2,000", "3,000", "4,000", "6,000"]   # no trunk of this swarm: there is no spec
    assert "Agents" not in out and "* this swarm's trunk" not in out


def test_qwen35_9b_prints_the_kv_of_its_full_attention_layers_and_each_agents_state(swarm_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = swarm_cli("inspect-prefix", "--model-config", "Qwen3.5-9B", "--budget", "8.09GB")
    assert code == 0, err
    assert ("bytes per token = 2 × 8 full-attention layers × 4 KV heads × 256 head dim × 2 bytes (float16) = "
            "32,768 B, from Qwen3.5-9B") in out
    assert ("linear-attention state = 51,511,296 B (49.1 MiB) per agent (24 Gated DeltaNet layers): 8 agents hold "
            "412.09 MB, shared trunk or not; sharing adds the trunk's snapshot (in one copy)") in out
    assert "KV memory: 8 agents, budget 8.09 GB = 246,887 tokens, + 51.51 MB state per agent" in out
    rows = {line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
            for line in out.splitlines() if line.startswith("│")}
    # 4,000 tokens: one copy 131.07 MB of KV + the 51.51 MB snapshot; 8 copies 8 x 131.07 MB; freed the difference
    assert rows["4,000"] == ["182.58 MB", "1.05 GB", "865.99 MB", "11%", "+3,303", "+0"]


def test_qwen35_9b_json_has_the_kv_layers_and_the_state(swarm_cli):
    code, out, _ = swarm_cli("inspect-prefix", "--json", "--model-config", "Qwen3.5-9B", "--weights", "q4_k_m")
    assert code == 0
    report = json.loads(out)
    assert report["kv_shape"] == {"layers": 8, "kv_heads": 4, "head_dim": 256, "dtype_bytes": 2, "linear_layers": 24}
    assert report["memory"]["bytes_per_token"] == 32_768 and report["memory"]["state_bytes_per_agent"] == 51_511_296
    assert report["weights"]["label"] == "Q4_K_M" and 5.5e9 < report["weights"]["total_bytes"] < 5.8e9


def test_the_json_adds_the_weights_by_format_and_the_card_and_keeps_every_key(swarm_cli):
    code, out, _ = swarm_cli("inspect-prefix", "--json", "--model-config", "Qwen3-8B", "--weights", "Q4_K_M",
                             "--card", "16GiB", "--agents", "4")
    assert code == 0
    report = json.loads(out)
    assert {"schema_version", "spec", "model", "model_config", "harness", "tools", "trunk", "agents", "findings",
            "kv_shape", "memory", "clean", "weights", "card"} == set(report)
    assert (report["spec"], report["trunk"], report["agents"], report["findings"]) == (None, None, [], [])
    weights, card, memory = report["weights"], report["card"], report["memory"]
    assert (weights["label"], weights["source"]) == ("Q4_K_M", "estimate")
    assert set(weights["by_format"]) == {"Q4_K", "Q6_K", "F32"}
    assert sum(weights["by_format"].values()) == weights["total_bytes"] == card["weights_bytes"]
    assert card["card_bytes"] == 16 * 2**30
    assert card["budget_bytes"] == card["card_bytes"] - card["weights_bytes"] - card["reserve_bytes"]
    assert memory["budget_bytes"] == card["budget_bytes"] and memory["budget_tokens"] == card["budget_tokens"]
    assert memory["agents"] == 4 and [row["label"] for row in memory["rows"]] == ["reference"] * 4


def test_with_a_spec_the_card_is_sized_for_its_gguf_files_own_tensors(swarm_cli):
    code, out, _ = swarm_cli("inspect-prefix", EXAMPLE_SPEC, "--json", "--card", "8GB")
    assert code == 0
    report = json.loads(out)
    weights, card = report["weights"], report["card"]
    assert (weights["label"], weights["source"]) == ("Q4_1", "file")   # the SmolLM2 file the spec names
    assert set(weights["by_format"]) == {"Q4_1", "Q8_0", "F32"}
    assert report["kv_shape"]["dtype_bytes"] == 2   # sized for a card: float16, whatever this machine is
    assert report["memory"]["budget_bytes"] == card["budget_bytes"]
    assert report["memory"]["rows"][0]["label"] == "this swarm" and report["trunk"]["tokens"] > 0


@pytest.mark.parametrize("args, words", [
    (["--model-config", "Qwen3-8B", "--budget", "8GB", "--card", "16GB"],
     "error: --budget and --card both set the KV budget; give one of them"),
    (["--model-config", "Qwen3-8B", "--weights", "q3_k_m"], "error: --weights: 'q3_k_m' is not a file type"),
    (["--model-config", "Qwen3-8B", "--card", "16"], "error: --card: '16' is a token count"),
    (["--model-config", "Qwen3-8B", "--card", "8GB"], "error: --card: 8.00 GB holds no KV cache beside the weights"),
])
def test_bad_card_and_weights_options_exit_2_with_one_line(swarm_cli, args, words):
    code, _, err = swarm_cli("inspect-prefix", *args)
    assert code == 2 and err.count("\n") == 1 and err.startswith(words), err


def test_without_a_spec_or_a_model_config_the_installed_command_says_what_to_give():
    done = subprocess.run([str(Path(sys.executable).with_name("swarm")), "inspect-prefix", "--card", "16GB"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: give a swarm.yaml to inspect, or --model-config NAME to size a model without one\n"
