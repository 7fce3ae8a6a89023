"""`swarm serve --capture DIR`: the bodies clients send, one file each in arrival order, as received;
a folder that cannot be written never fails a request."""
import json
import logging
import os

import httpx
import openai
import pytest

from tests.helpers.serving import MODEL, ServerThread, serve_cli, start_engine

GREEDY = dict(temperature=0, max_tokens=2, extra_body={"ignore_eos": True})
SYSTEM = "You are a coding agent. Working directory: /srv/alpha — naïve café"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "def add(a, b):"}]
SMALL_BODY_CAP = 4096


def captured(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_serve_capture_writes_every_v1_post_body_as_received_in_arrival_order(model_dir, tmp_path):
    folder = tmp_path / "captures"
    with serve_cli("--model", str(model_dir), "--served-model-name", MODEL, "--capture", str(folder)) as (ready, _):
        client = openai.OpenAI(base_url=ready["url"], api_key="sk-dummy-secret", max_retries=0,
                               default_headers={"x-harness": "tests"})
        chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
        client.completions.create(model=MODEL, prompt="def add(a, b):", **GREEDY)
        missing = httpx.post(ready["url"] + "/no_such/route?beta=true", content=b'{"model": "tiny"}',
                             headers={"x-api-key": "sk-ant-dummy", "content-type": "application/json"})
        not_json = httpx.post(ready["url"] + "/chat/completions", content=b"\xff not json")
        httpx.get(ready["url"] + "/models")
    assert chat.choices[0].message.content is not None
    assert (missing.status_code, not_json.status_code) == (404, 400)
    assert captured(folder) == ["000001-chat-completions.json", "000001-chat-completions.meta.json",
                                "000002-completions.json", "000002-completions.meta.json",
                                "000003-no_such-route.json", "000003-no_such-route.meta.json",
                                "000004-chat-completions.body", "000004-chat-completions.meta.json"]
    body = json.loads((folder / "000001-chat-completions.json").read_text(encoding="utf-8"))
    assert body["messages"] == MESSAGES and body["model"] == MODEL and body["max_tokens"] == 2
    assert SYSTEM in (folder / "000001-chat-completions.json").read_text(encoding="utf-8")  # as sent, unescaped
    assert json.loads((folder / "000002-completions.json").read_text())["prompt"] == "def add(a, b):"
    assert (folder / "000004-chat-completions.body").read_bytes() == b"\xff not json"


def test_the_sidecar_says_how_it_came_without_the_keys(model_dir, tmp_path):
    folder = tmp_path / "captures"
    with ServerThread(start_engine(model_dir), capture_dir=folder) as server:
        httpx.post(server.url + "/v1/messages?beta=true", json={"model": MODEL, "max_tokens": 1},
                   headers={"authorization": "Bearer sk-1", "x-api-key": "sk-2", "anthropic-beta": "tools-1"})
    meta = json.loads((folder / "000001-messages.meta.json").read_text())
    assert (meta["method"], meta["path"], meta["query"]) == ("POST", "/v1/messages", "beta=true")
    assert meta["headers"]["anthropic-beta"] == "tools-1" and meta["headers"]["content-type"] == "application/json"
    assert meta["dropped_headers"] == ["authorization", "x-api-key"]
    assert "sk-1" not in json.dumps(meta) and "sk-2" not in json.dumps(meta)
    assert meta["body_file"] == "000001-messages.json"
    assert meta["body_bytes"] == len(json.dumps({"model": MODEL, "max_tokens": 1}, separators=(",", ":")))
    assert meta["received_at"].endswith("+00:00")


def test_numbers_go_on_after_the_files_already_there(model_dir, tmp_path):
    folder = tmp_path / "captures"
    folder.mkdir()
    (folder / "000041-responses.json").write_text("{}")
    with ServerThread(start_engine(model_dir), capture_dir=folder) as server:
        server.client().chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    assert "000042-chat-completions.json" in captured(folder)


def test_a_body_over_the_limit_is_refused_as_before_and_not_written(model_dir, tmp_path):
    folder = tmp_path / "captures"
    with ServerThread(start_engine(model_dir), capture_dir=folder, max_body_bytes=SMALL_BODY_CAP) as server:
        big = [{"role": "user", "content": "x" * SMALL_BODY_CAP}]
        with pytest.raises(openai.APIStatusError) as refused:
            server.client().chat.completions.create(model=MODEL, messages=big, **GREEDY)
        chunked = httpx.post(server.url + "/v1/chat/completions", content=iter([b"{" + b" " * SMALL_BODY_CAP] * 2))
        reply = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    assert refused.value.status_code == 413 and chunked.status_code == 413
    assert reply.choices[0].finish_reason == "length"
    assert captured(folder) == ["000001-chat-completions.json", "000001-chat-completions.meta.json"]


@pytest.mark.parametrize("unwritable", ["read-only folder", "folder under a file"])
def test_a_folder_that_cannot_be_written_never_fails_a_request(model_dir, tmp_path, caplog, unwritable):
    if unwritable == "read-only folder":
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
    else:
        (tmp_path / "a-file").write_text("")
        folder = tmp_path / "a-file" / "captures"
    try:
        with caplog.at_level(logging.WARNING, logger="swarm.serve"), \
                ServerThread(start_engine(model_dir), capture_dir=folder) as server:
            reply = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
            streamed = list(server.client().chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                                                    **GREEDY))
    finally:
        folder.chmod(0o755) if folder.is_dir() else None
    assert reply.choices[0].finish_reason == "length" and streamed[-1].choices[0].finish_reason == "length"
    if unwritable == "folder under a file" or os.geteuid() != 0:  # root writes into a read-only folder
        assert [r.getMessage() for r in caplog.records if "--capture" in r.getMessage()][0].startswith(
            "--capture: cannot write request 000001-chat-completions")
