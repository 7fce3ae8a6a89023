"""swarm/run/harness_process.py on real process trees: fake_harness.py --spawn-child starts a sleep in
its group, one in a session of its own and one orphaned in a session of its own; a stop leaves none."""
import json
import os
import signal
import subprocess
import sys

import pytest

from swarm.run.harness_process import HarnessProcess, harness_log_paths, stop_all
from tests.helpers.processes import (
    HANG_GUARD,
    PYTHON,
    REPO,
    is_running,
    kill_leftover_sleeps,
    python_child_env,
    wait_for_pids,
)

FAKE_HARNESS = REPO / "tests" / "helpers" / "fake_harness.py"
ENV = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
TREE_SIZE = 4  # the fake harness and its three sleeps

# Exits 3 on SIGTERM, but only once every one of COUNT such processes got its SIGTERM: it marks its
# own in FLAGS, then waits for the others' marks. A stop that SIGKILLs one before it SIGTERMs the next
# never lets them all through.
BARRIER = """
import os, signal, sys, time
flags, count = sys.argv[1], int(sys.argv[2])
def on_sigterm(*_):
    open(os.path.join(flags, str(os.getpid())), "w").close()
    while len(os.listdir(flags)) < count:
        time.sleep(0.01)
    sys.exit(3)
signal.signal(signal.SIGTERM, on_sigterm)
print(os.getpid(), flush=True)
while True:
    signal.pause()
"""


def spawn_tree(tmp_path, agent="a", *extra) -> tuple[HarnessProcess, list[int]]:
    harness = HarnessProcess(agent, [PYTHON, str(FAKE_HARNESS), "--spawn-child", *extra], ENV, tmp_path,
                             tmp_path).start()
    return harness, wait_for_pids(harness.stdout_path, TREE_SIZE)


@pytest.fixture
def leftovers():
    pids: list[int] = []
    yield pids
    kill_leftover_sleeps(pids)


@pytest.mark.parametrize("extra, exit_code", [((), -signal.SIGTERM), (("--ignore-sigterm",), -signal.SIGKILL)],
                         ids=["sigterm", "sigterm-ignored"])
def test_stop_ends_the_whole_tree_even_what_left_its_group_or_its_parent(tmp_path, leftovers, extra, exit_code):
    harness, pids = spawn_tree(tmp_path, "a", *extra)
    leftovers += pids
    assert all(map(is_running, pids)) and harness.running_tree() == set(pids)
    assert harness.stop(grace=0.5) == exit_code == harness.exit_code
    assert not any(map(is_running, pids))
    assert harness.stop() == exit_code and harness.running_tree() == set()   # again: nothing left to do


def test_the_logs_beside_the_transcript_hold_stdout_and_stderr_and_the_env_is_only_what_was_given(tmp_path):
    script = ("import json, os, sys; print(json.dumps(sorted(os.environ))); print(os.getcwd()); "
              "print('oops', file=sys.stderr)")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    harness = HarnessProcess("reader", [PYTHON, "-c", script], ENV, workspace, tmp_path).start()
    assert harness.wait(HANG_GUARD) == 0 == harness.exit_code
    assert harness_log_paths(tmp_path, "reader") == (tmp_path / "agent-reader.stdout.log",
                                                     tmp_path / "agent-reader.stderr.log")
    names, cwd = harness.stdout_path.read_text().splitlines()
    assert json.loads(names) == sorted([*ENV, "SWARM_HARNESS_ID"]) and cwd == str(workspace)
    assert harness.stderr_path.read_text() == "oops\n"
    assert harness.stop() == 0   # after it exited: nothing to stop, the code stays


def test_exit_codes_are_the_harnesses_own(tmp_path):
    harness = HarnessProcess("failing", [PYTHON, "-c", "import sys; sys.exit(7)"], ENV, tmp_path, tmp_path).start()
    assert harness.poll() in (None, 7) and harness.wait(HANG_GUARD) == 7 == harness.stop()
    unstarted = HarnessProcess("never", [PYTHON, "-c", "pass"], ENV, tmp_path, tmp_path)
    assert unstarted.exit_code is None and unstarted.stop() is None


def test_stop_all_sigterms_every_harness_before_it_kills_any(tmp_path):
    flags = tmp_path / "sigterms"
    flags.mkdir()
    count = 3
    harnesses = [HarnessProcess(f"b{i}", [PYTHON, "-c", BARRIER, str(flags), str(count)], ENV, tmp_path,
                                tmp_path).start() for i in range(count)]
    pids = [wait_for_pids(harness.stdout_path)[0] for harness in harnesses]
    assert stop_all(harnesses, grace=HANG_GUARD) == set()
    assert [harness.exit_code for harness in harnesses] == [3] * count   # none needed a SIGKILL
    assert sorted(int(flag.name) for flag in flags.iterdir()) == sorted(pids)


def test_stop_all_kills_trees_that_ignore_sigterm_and_survives_a_second_call(tmp_path, leftovers):
    trees = [spawn_tree(tmp_path, f"c{i}", "--ignore-sigterm") for i in range(3)]
    leftovers += [pid for _, pids in trees for pid in pids]
    harnesses = [harness for harness, _ in trees]
    assert stop_all(harnesses, grace=0.2) == set()
    assert not any(map(is_running, leftovers))
    assert [h.exit_code for h in harnesses] == [-signal.SIGKILL] * 3
    assert stop_all(harnesses, grace=0.2) == set()


@pytest.mark.parametrize("stop_signal, extra", [(signal.SIGINT, []), (signal.SIGTERM, ["--ignore-sigterm"])],
                         ids=["ctrl-c", "sigterm-to-trees-that-ignore-it"])
def test_a_signal_to_the_run_leaves_no_harness_process(tmp_path, leftovers, stop_signal, extra):
    count = 2
    driver = subprocess.Popen([sys.executable, "-m", "tests.helpers.harness_driver", str(tmp_path), str(count),
                               *extra], cwd=REPO, env=python_child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for agent in (f"a{i}" for i in range(count)):
            leftovers += wait_for_pids(harness_log_paths(tmp_path, agent)[0], TREE_SIZE)
        os.killpg(driver.pid, stop_signal)   # as a terminal's Ctrl-C does: to the run's whole group
        stdout, stderr = driver.communicate(timeout=HANG_GUARD)
    finally:
        driver.kill()
    assert driver.returncode == 128 + stop_signal, stderr
    expected = -signal.SIGKILL if extra else -signal.SIGTERM
    assert json.loads(stdout) == {f"a{i}": expected for i in range(count)}
    assert not any(map(is_running, leftovers)), "a harness process survived"
