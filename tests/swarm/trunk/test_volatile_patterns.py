import os
import socket
from pathlib import Path

import pytest

from swarm.spec.schema import load_spec
from swarm.trunk.volatile_patterns import Volatiles, find_volatile
from tests.helpers.spec_files import EXAMPLE_SPEC, REPO

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
    ("checked at commit 3f2a9c1d.", [("commit 3f2a9c1d", "git_hash")]),
    ("Revision: 0a1b2c3 is the base", [("Revision: 0a1b2c3", "git_hash")]),
    ("commit 9f8e7d6c5b4a39281726", [("commit 9f8e7d6c5b4a39281726", "git_hash")]),
    ("commit 2024-05-01", [("2024-05-01", "date")]),
])
def test_volatile_shapes(text, expected):
    assert kinds(text) == expected


@pytest.mark.parametrize("text", [
    "paths like src/app.py or tests/test_parser.py", "see https://example.com/a/b", "use a ~ b and/or c",
    "print 'file:line: text'", "create a branch for each fix", "version 3.10 and 2 of 3",
])
def test_ordinary_rule_text_is_not_volatile(text):
    assert kinds(text) == []


@pytest.mark.parametrize("text, host", [
    ("Deploy from host build-07 only.", "host build-07"),
    ("hostname: ci-runner3", "hostname: ci-runner3"),
    ("ssh to server `10.0.0.5` first", "server `10.0.0.5"),
    ("the cache lives on machine gpu7", "machine gpu7"),
    ("logs are on web-01", "web-01"),
    ("copy it to gpu-box-3 when done", "gpu-box-3"),
    ("the runner is ip-10-0-0-1.ec2.internal", "ip-10-0-0-1.ec2.internal"),
    ("push to build-07.ci.example.com", "build-07.ci.example.com"),
    ("open http://gpu1.local:8000/", "gpu1.local"),
    ("or on Johns-MacBook.local", "Johns-MacBook.local"),
    ("the database is db.prod.corp", "db.prod.corp"),
    ("the cache is at 192.168.1.20:6379", "192.168.1.20"),
])
def test_hostname_shapes(text, host):
    assert kinds(text) == [(host, "hostname")]


@pytest.mark.parametrize("text", [
    "re-run the tests on x86-64 with utf-8 files", "compare with gpt-4 and gpt-3.5-turbo", "build for py311",
    "decode as iso-8859-1 or latin-1; hash with sha-256", "load Meta-Llama-3-8B-Instruct or llama-3",
    "the server runs on port 8000", "start server.py, then the server v2 API", "machine: x86-64, server: arm64",
    "machine learning on the host machine", "host-side code, server-side checks",
    "bind the server to 127.0.0.1 or 8.8.8.8", "read docs.python.org and https://pypi.org/project/x",
    "copy .env.local to config.local.json", "use threading.local() and check err.internal",
    "follow https://peps.python.org/pep-0008/", "the top-5 and step-2 results", "version 10.2.1 of numpy",
    "commit your changes", "commit 3 files", "pick claude-sonnet-5 or claude-fable-5", "qwen-coder-3 and gpt-5-codex-2",
    "an example path: C:\\repo\\project\\main.py",
])
def test_technical_words_are_not_hostnames_or_commits(text):
    assert kinds(text) == []


def test_the_shipped_harnesses_are_clean():
    for name in ("coding-agent", "reviewer"):
        text = (REPO / "harness_templates" / f"{name}.json").read_text()
        assert kinds(text, Volatiles.detect()) == [], name


def test_the_example_specs_rules_and_tasks_are_clean():
    spec = load_spec(EXAMPLE_SPEC)
    texts = [*spec.extra_rules, *(agent.task for agent in spec.agents)]
    assert [kinds(text, Volatiles.detect()) for text in texts] == [[] for _ in texts]


def test_this_machines_values_are_found():
    here = Volatiles.detect(Path("/tmp/some-workspace"))
    text = f"cwd {os.getcwd()}/src host {socket.gethostname()} ws /tmp/some-workspace/a"
    found = dict((kind, value) for value, kind in kinds(text, here))
    assert found["cwd"] in (f"{os.getcwd()}/src", "/tmp/some-workspace/a")
    if len(socket.gethostname()) >= 3 and socket.gethostname() != "localhost":
        assert found["hostname"] == socket.gethostname()
