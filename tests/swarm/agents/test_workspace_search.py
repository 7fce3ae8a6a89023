import json
import os
import subprocess

import pytest

from swarm.agents.tool_calls import ToolCall
from swarm.agents.tools import ToolBox
from swarm.agents.workspace import Workspace
from swarm.agents.workspace_search import MAX_SEARCH_HITS
from tests.helpers.processes import (
    BIG_FILE_LINES,
    HANG_GUARD,
    PYTHON,
    call_with_guard,
    peak_growth_of_tool_call,
    python_child_env,
    write_big_text_file,
)


def search(root, **arguments):
    box = ToolBox(Workspace(root))
    return call_with_guard(lambda: box.run(ToolCall("search", arguments, raw="")))




# Each pattern searched in a thread while the main thread counts; in a child Python, so that a
# search holding the GIL for ever (as `re` does) fails by the hang guard instead of freezing pytest.
_SEARCHES_BESIDE_A_COUNTER = """
import json, sys, threading, time
import swarm.agents.workspace_search
from swarm.agents.tool_calls import ToolCall
from swarm.agents.tools import ToolBox
from swarm.agents.workspace import Workspace

swarm.agents.workspace_search.SEARCH_TIME_LIMIT = 2.0
box = ToolBox(Workspace(sys.argv[1]))

def search_beside_a_counter(pattern):
    search = {}
    def run():
        search["start"] = time.monotonic()
        search["output"] = box.run(ToolCall("search", {"pattern": pattern}, raw="")).output
        search["end"] = time.monotonic()
    thread = threading.Thread(target=run)
    thread.start()
    counted, count = [], 0
    while thread.is_alive():
        count += 1
        if count % 1000 == 0:
            counted.append(time.monotonic())
    thread.join()
    return dict(search, counted=counted)

print(json.dumps({pattern: search_beside_a_counter(pattern) for pattern in sys.argv[2:]}))
"""
PATTERNS = ("(a|aa)+$", "(a+)+$")  # catastrophic for `regex` too; the issue's (`regex` optimizes it)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    root = tmp_path_factory.mktemp("catastrophic")
    (root / "input.txt").write_text("a" * 34 + "!\n")
    done = subprocess.run([PYTHON, "-c", _SEARCHES_BESIDE_A_COUNTER, str(root), *PATTERNS], capture_output=True,
                          text=True, env=python_child_env(), timeout=HANG_GUARD + 30, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_a_catastrophic_pattern_ends_with_an_error_while_other_threads_run(searched):
    measured = searched["(a|aa)+$"]
    assert "search stopped after 2 s: the pattern '(a|aa)+$' took too long; simplify it" in measured["output"]
    # the GIL was free during the match: the counting thread ran in its middle half, too
    quarter = (measured["end"] - measured["start"]) / 4
    assert any(measured["start"] + quarter < moment < measured["end"] - quarter for moment in measured["counted"])


def test_the_pattern_of_the_issue_finishes_at_once(searched):
    assert searched["(a+)+$"]["output"].startswith("no matches for '(a+)+$'")


def test_search_over_a_126_mb_file_streams_it(tmp_path):
    write_big_text_file(tmp_path / "big.txt")
    measured = peak_growth_of_tool_call(tmp_path, "search", {"pattern": "NEEDLE"})
    assert measured["output"].startswith(f"big.txt:{BIG_FILE_LINES}: NEEDLExxx")
    assert measured["grown_mb"] < 100, measured["grown_mb"]


def test_search_skips_a_fifo_and_refuses_one_named_as_its_path(tmp_path):
    (tmp_path / "a.txt").write_text("needle\n")
    os.mkfifo(tmp_path / "pipe")
    assert search(tmp_path, pattern="needle").output == "a.txt:1: needle"
    result = search(tmp_path, pattern="needle", path="pipe")
    assert not result.ok and "'pipe' is a named pipe (FIFO)" in result.output


def test_search_keeps_a_bounded_number_of_hits(tmp_path):
    (tmp_path / "many.txt").write_text("hit\n" * (MAX_SEARCH_HITS * 3))
    box = ToolBox(Workspace(tmp_path), max_output_chars=1_000_000)
    output = box.run(ToolCall("search", {"pattern": "hit"}, raw="")).output.splitlines()
    assert len(output) == MAX_SEARCH_HITS + 1 and output[-1].startswith(f"[stopped after {MAX_SEARCH_HITS} matches")


def test_the_walk_skips_links_to_files_and_folders_outside(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("needle\n")
    (root / "linked.txt").symlink_to(outside / "secret.txt")
    (root / "sub" / "out").symlink_to(outside)
    assert search(root, pattern="needle").output.startswith("no matches")
