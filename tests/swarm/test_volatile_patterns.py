import os
import socket
from pathlib import Path

import pytest

from swarm.volatile_patterns import Volatiles, find_volatile
from tests.swarm.spec_files import REPO

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
])
def test_volatile_shapes(text, expected):
    assert kinds(text) == expected


@pytest.mark.parametrize("text", [
    "paths like src/app.py or tests/test_parser.py", "see https://example.com/a/b", "use a ~ b and/or c",
    "print 'file:line: text'", "create a branch for each fix", "version 3.10 and 2 of 3",
])
def test_ordinary_rule_text_is_not_volatile(text):
    assert kinds(text) == []


def test_the_shipped_harnesses_are_clean():
    for name in ("coding-agent", "reviewer"):
        text = (REPO / "harness_templates" / f"{name}.json").read_text()
        assert kinds(text, Volatiles.detect()) == [], name


def test_this_machines_values_are_found():
    here = Volatiles.detect(Path("/tmp/some-workspace"))
    text = f"cwd {os.getcwd()}/src host {socket.gethostname()} ws /tmp/some-workspace/a"
    found = dict((kind, value) for value, kind in kinds(text, here))
    assert found["cwd"] in (f"{os.getcwd()}/src", "/tmp/some-workspace/a")
    if len(socket.gethostname()) >= 3 and socket.gethostname() != "localhost":
        assert found["hostname"] == socket.gethostname()
