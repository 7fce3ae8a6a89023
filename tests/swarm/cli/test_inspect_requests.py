"""`swarm inspect-prefix --requests`: request bodies of all three APIs rendered as `swarm serve` renders
them (checked against what the server itself counts), their trunk, where each diverges, and errors."""
import json

import pytest

from swarm.server.canonicalize import canonicalize
from swarm.server.captured_requests import chat_inputs, read_requests, render
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.protocol import ChatMessage
from swarm.trunk.canonical import token_ids_sha256
from swarm.trunk.canonicalize import MOVED_HEADER
from tests.helpers.runs import REPO, tiny_model, tiny_tokenizer
from tests.helpers.serving import MODEL, ServerThread, start_engine

RULES = "You are a coding agent. Keep answers short."
USER = "Add a subtract function to calc.py"


def system(cwd: str) -> str:
    return f"{RULES}\nWorking directory: {cwd}\nIs a git repository: yes"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def two_agents(model_dir, tmp_path_factory):
    """Two agents' first requests through a real `swarm serve --capture`: (folder, the server's usages)."""
    folder = tmp_path_factory.mktemp("captures")
    with ServerThread(start_engine(model_dir), capture_dir=folder) as server:
        usages = [server.client().chat.completions.create(
            model=MODEL, max_tokens=1, temperature=0,
            messages=[{"role": "system", "content": system(cwd)}, {"role": "user", "content": USER}]).usage
            for cwd in ("/srv/alpha", "/srv/beta")]
    return folder, usages


def rendered_ids(cwd: str) -> list[int]:
    messages = [ChatMessage(role="system", content=system(cwd)), ChatMessage(role="user", content=USER)]
    return ChatPrompter(tiny_tokenizer()).build(messages).token_ids


def inspect_json(swarm_cli, model_dir, *paths) -> dict:
    code, out, err = swarm_cli("inspect-prefix", "--requests", *paths, "--model", model_dir, "--json")
    assert code == 0, err
    return json.loads(out)


def test_two_agents_diverge_where_their_cwd_starts(swarm_cli, model_dir, two_agents):
    folder, usages = two_agents
    report = inspect_json(swarm_cli, model_dir, folder)
    first, second = report["requests"]
    assert [r["prompt_tokens"] for r in report["requests"]] == [u.prompt_tokens for u in usages]
    at = first["diverges_at"]
    assert second["diverges_at"] == at and (first["diverges_from"], second["diverges_from"]) == (
        second["name"], first["name"])
    alpha, beta = rendered_ids("/srv/alpha"), rendered_ids("/srv/beta")
    assert alpha[:at] == beta[:at] and alpha[at] != beta[at]
    shared = tiny_tokenizer().decode(alpha[:at], skip_special_tokens=False)
    cut_points = [f"Working directory:{tail}" for tail in ("", " ", " /", " /srv", " /srv/")]
    assert shared.endswith(tuple(cut_points)), shared[-40:]
    assert report["trunk"] == {"tokens": at, "sha256": token_ids_sha256(alpha[:at])}
    assert shared.endswith(first["before"]) and first["before"]
    assert (first["before"] + first["after"]) in tiny_tokenizer().decode(alpha, skip_special_tokens=False)
    assert "alpha" in shared[-10:] + first["after"] and "beta" in second["after"] + shared[-10:]
    assert first["other_after"] == second["after"]


def test_a_hybrid_model_config_sizes_the_kv_of_its_full_attention_layers_and_the_state(swarm_cli, model_dir,
                                                                                     two_agents):
    folder, _ = two_agents
    report = inspect_json(swarm_cli, model_dir, folder, "--model-config", "Qwen3.5-9B")
    assert report["kv_shape"] == {"layers": 8, "kv_heads": 4, "head_dim": 256, "dtype_bytes": 2, "linear_layers": 24}
    memory = report["memory"]
    assert (memory["bytes_per_token"], memory["state_bytes_per_agent"]) == (32_768, 51_511_296)
    trunk = memory["rows"][0]
    assert trunk["one_copy_bytes"] == trunk["trunk_tokens"] * 32_768 + 51_511_296


def test_json_schema_names_the_trunk_findings_memory_and_canonicalize(swarm_cli, model_dir, two_agents):
    folder, _ = two_agents
    report = inspect_json(swarm_cli, model_dir, folder, "--model-config", "Qwen3-8B", "--budget", "8.09GB")
    assert report["schema_version"] == 1 and report["model"] == str(model_dir)
    assert {"requests", "trunk", "findings", "skipped", "canonicalize", "kv_shape", "memory", "clean"} <= set(report)
    assert set(report["requests"][0]) == {"name", "api", "prompt_tokens", "diverges_at", "diverges_from",
                                          "before", "after", "other_after"}
    assert [r["api"] for r in report["requests"]] == ["chat.completions"] * 2
    paths = {(f["kind"], f["text"]): f for f in report["findings"]}
    alpha = paths[("abs_path", "/srv/alpha")]
    assert alpha["requests"] == [report["requests"][0]["name"]] and (alpha["message"], alpha["line"]) == (0, 2)
    assert alpha["in_trunk"] is (alpha["token_index"] < report["trunk"]["tokens"])
    assert report["clean"] is False
    memory = report["memory"]
    assert (memory["agents"], memory["bytes_per_token"], memory["budget_bytes"]) == (2, 147_456, 8_090_000_000)
    assert memory["rows"][0]["trunk_tokens"] == report["trunk"]["tokens"]
    assert report["kv_shape"] == {"layers": 36, "kv_heads": 8, "head_dim": 128, "dtype_bytes": 2, "linear_layers": 0}
    canonical = report["canonicalize"]
    assert set(canonical) == {"trunk", "requests", "findings", "moved_chars", "gained_tokens"}
    lines = [f"Working directory: {cwd}" for cwd in ("/srv/alpha", "/srv/beta")]
    assert canonical["moved_chars"] == {"lint:abs_path": sum(map(len, lines))}
    assert canonical["gained_tokens"] == canonical["trunk"]["tokens"] - report["trunk"]["tokens"] > 0
    assert canonical["findings"] == []


def write(folder, name: str, body: dict, path: str | None = None):
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(body))
    if path is not None:
        (folder / f"{name}.meta.json").write_text(json.dumps({"method": "POST", "path": path}))
    return folder / f"{name}.json"


def test_the_three_apis_render_one_conversation_to_the_same_prompt(swarm_cli, model_dir, tmp_path):
    chat = {"model": MODEL, "messages": [{"role": "system", "content": RULES}, {"role": "user", "content": USER}]}
    messages = {"model": MODEL, "max_tokens": 64, "system": [{"type": "text", "text": RULES}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": USER}]}]}
    responses = {"model": MODEL, "instructions": RULES, "input": USER}
    write(tmp_path / "by-shape", "chat", chat)
    write(tmp_path / "by-shape", "messages", messages)
    write(tmp_path / "by-shape", "responses", responses)
    write(tmp_path / "by-route", "000001-messages", messages, "/v1/messages/count_tokens")
    report = inspect_json(swarm_cli, model_dir, tmp_path / "by-shape", tmp_path / "by-route")
    expected = ChatPrompter(tiny_tokenizer()).build([ChatMessage(role="system", content=RULES),
                                                     ChatMessage(role="user", content=USER)]).token_ids
    assert [r["api"] for r in report["requests"]] == ["chat.completions", "messages", "responses", "messages"]
    assert report["trunk"]["tokens"] == len(expected)
    assert all(r["diverges_at"] == r["prompt_tokens"] == len(expected) for r in report["requests"])


def test_bodies_serve_refuses_or_cannot_chat_are_skipped_with_why(swarm_cli, model_dir, tmp_path):
    write(tmp_path, "000001-chat-completions", {"model": MODEL, "messages": [{"role": "user", "content": USER}]})
    write(tmp_path, "000002-completions", {"model": MODEL, "prompt": "def add(a, b):"})
    write(tmp_path, "000003-chat-completions", {"model": MODEL, "messages": []}, "/v1/chat/completions")
    write(tmp_path, "000004-models", {}, "/v1/embeddings")
    (tmp_path / "000005-chat-completions.body").write_bytes(b"\xff")
    report = inspect_json(swarm_cli, model_dir, tmp_path)
    assert [r["name"] for r in report["requests"]] == ["000001-chat-completions"]
    reasons = {s["name"]: s["reason"] for s in report["skipped"]}
    assert reasons["000002-completions"] == "a completions prompt has no chat to render"
    assert reasons["000003-chat-completions"].startswith("serve refuses it with a 400: ")
    assert "messages" in reasons["000003-chat-completions"]
    assert reasons["000004-models"] == "POST /v1/embeddings has no chat to render"
    assert reasons["000005-chat-completions"] == "its body is not JSON"


@pytest.mark.parametrize("setup, words", [
    (lambda d: d, "no request bodies in"),
    (lambda d: (d / "x.json").write_text("not json") and d / "x.json", "not a JSON request body"),
    (lambda d: (d / "x.json").write_text('{"foo": 1}') and d / "x.json", "not a request of an API swarm serves"),
    (lambda d: (d / "x.json").write_text("[1]") and d / "x.json", "a request body is a JSON object"),
    (lambda d: d / "missing.json", "no such file or folder"),
    (lambda d: write(d, "p", {"model": MODEL, "prompt": "x"}), "no request to compare"),
])
def test_bad_input_is_one_error_line_and_exit_2(swarm_cli, model_dir, tmp_path, setup, words):
    code, out, err = swarm_cli("inspect-prefix", "--requests", setup(tmp_path), "--model", model_dir)
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err


def test_card_sizing_and_model_belong_to_their_own_modes(swarm_cli, model_dir, tmp_path):
    card = swarm_cli("inspect-prefix", "--requests", tmp_path, "--card", "16GB")
    model = swarm_cli("inspect-prefix", "swarm.yaml.example", "--model", model_dir)
    two_specs = swarm_cli("inspect-prefix", "a.yaml", "b.yaml")
    for (code, _, err), words in zip((card, model, two_specs), ("--card", "--model", "give one swarm.yaml")):
        assert code == 2 and err.startswith("error: ") and words in err


def test_the_human_report_shows_the_trunk_the_divergence_and_the_memory_table(swarm_cli, model_dir, two_agents):
    folder, _ = two_agents
    code, out, err = swarm_cli("inspect-prefix", "--requests", folder, "--model", model_dir)
    assert code == 0, err
    out = " ".join(out.split())  # as wide as the terminal: lines wrap anywhere
    report = inspect_json(swarm_cli, model_dir, folder)
    trunk = report["trunk"]
    assert f"trunk: {trunk['tokens']:,} tokens, sha256 {trunk['sha256'][:16]}" in out
    assert f"part at token {trunk['tokens']:,}" in out
    for text in ("Requests", "Prefix lint", "abs_path", "--canonicalize:", "KV memory: 2 agents"):
        assert text in out
    strict = swarm_cli("inspect-prefix", "--requests", folder, "--model", model_dir, "--strict")
    assert strict[0] == 1


HARNESS_REQUESTS = REPO / "tests" / "data" / "harness_requests"
PROJECTS = {"claude-code": ("messages", "-work-harness-projects-"), "codex": ("responses", "/work/harness-projects/"),
            "opencode": ("chat.completions", "/work/harness-projects/")}


def prompt_ids(folder, canonical: bool) -> list[list[int]]:
    """Each request's prompt as serve renders it, with --canonicalize or without."""
    prompter = ChatPrompter(tiny_tokenizer())
    inputs = [chat_inputs(request) for request in read_requests([folder])]
    return [render(prompter, "", "", canonicalize(i).inputs if canonical else i).token_ids for i in inputs]


@pytest.mark.parametrize("harness", sorted(PROJECTS))
def test_real_harness_agents_in_two_folders_diverge_at_their_folder_until_canonicalized(swarm_cli, model_dir,
                                                                                       harness):
    api, projects = PROJECTS[harness]
    report = inspect_json(swarm_cli, model_dir, HARNESS_REQUESTS / harness)
    alpha, beta = report["requests"]
    assert (alpha["api"], alpha["name"], beta["name"]) == (api, "alpha-1", "beta-1")
    at, shared = alpha["diverges_at"], report["trunk"]["tokens"]
    assert at == beta["diverges_at"] == shared < alpha["prompt_tokens"]
    ids = prompt_ids(HARNESS_REQUESTS / harness, canonical=False)
    assert tiny_tokenizer().decode(ids[0][:at], skip_special_tokens=False).endswith(projects)
    assert alpha["after"].startswith("a") and beta["after"].startswith("b")
    canonical = report["canonicalize"]
    assert canonical["trunk"]["tokens"] > shared and canonical["gained_tokens"] == canonical["trunk"]["tokens"] - shared
    assert sum(canonical["moved_chars"].values()) > 0
    moved_ids = prompt_ids(HARNESS_REQUESTS / harness, canonical=True)
    assert MOVED_HEADER in tiny_tokenizer().decode(moved_ids[0][:canonical["trunk"]["tokens"]])


@pytest.mark.parametrize("harness", ["aider", "mini-swe-agent"])
def test_harnesses_that_name_no_folder_send_two_agents_the_same_prompt(swarm_cli, model_dir, harness):
    report = inspect_json(swarm_cli, model_dir, HARNESS_REQUESTS / harness)
    assert all(r["diverges_at"] == r["prompt_tokens"] == report["trunk"]["tokens"] for r in report["requests"])
