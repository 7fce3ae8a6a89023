"""swarm/run/workspace_mount.py for real: each agent's workspace at AGENT_WORKSPACE in a mount namespace
of its own, the harness keeping its pid, uid, exit code and stop; skipped where `unshare` cannot."""
import os
import sys

import pytest

from swarm.run.harness_process import HarnessProcess
from swarm.run.workspace_mount import (
    AGENT_HOME,
    AGENT_WORKSPACE,
    MOUNT_NAMESPACE,
    NO_CONFINEMENT,
    confine,
    mount_namespace_available,
)
from tests.helpers.processes import HANG_GUARD, PYTHON, REPO, is_running, kill_leftover_sleeps, wait_for, wait_for_pids

ENV = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
FAKE_HARNESS = REPO / "tests" / "helpers" / "fake_harness.py"
needs_mount_namespace = pytest.mark.skipif(
    not mount_namespace_available(),
    reason="no mount namespace here: `unshare --user --map-root-user --mount` or its bind mount fails")


def workspace(tmp_path, name: str):
    """A workspace and a home beside it, each saying whose it is."""
    folder = tmp_path / name
    for place in (folder, tmp_path / f"{name}-home"):
        place.mkdir()
        (place / "who").write_text(name)
    return folder


def launch(tmp_path, agent: str, argv: list[str], folder) -> HarnessProcess:
    confined = confine(argv, folder, folder.with_name(folder.name + "-home"))
    assert confined.method == MOUNT_NAMESPACE and confined.workspace == AGENT_WORKSPACE
    return HarnessProcess(agent, confined.argv, ENV, confined.cwd, tmp_path).start()


@needs_mount_namespace
def test_two_agents_see_their_own_workspace_at_the_same_path_at_the_same_time(tmp_path):
    go = tmp_path / "go"
    script = (f'pwd; cat who; echo; while [ ! -e "{go}" ]; do sleep 0.01; done; cat who; echo; '
              f'cat {AGENT_HOME}/who; echo; id -u')
    harnesses = [launch(tmp_path, name, ["sh", "-c", script], workspace(tmp_path, name)) for name in ("a", "b")]
    for harness in harnesses:
        assert wait_for(lambda: len(harness.stdout_path.read_text().split()) == 2), harness.stderr_path.read_text()
    go.touch()   # both are running, each in its namespace, when they read `who` the second time
    for harness, name in zip(harnesses, ("a", "b")):
        assert harness.wait(HANG_GUARD) == 0, harness.stderr_path.read_text()
        assert harness.stdout_path.read_text().split() == [AGENT_WORKSPACE, name, name, name, str(os.getuid())]
    assert "who" not in os.listdir(AGENT_WORKSPACE) + os.listdir(AGENT_HOME)   # the mounts stayed in their namespaces


@needs_mount_namespace
def test_the_harness_keeps_its_pid_and_its_exit_code(tmp_path):
    script = "import os, sys; print(os.getpid(), flush=True); sys.exit(7)"
    harness = launch(tmp_path, "a", [PYTHON, "-c", script], workspace(tmp_path, "a"))
    assert harness.wait(HANG_GUARD) == 7
    assert harness.stdout_path.read_text().split() == [str(harness.pid)]


@needs_mount_namespace
def test_a_stop_ends_a_confined_tree(tmp_path):
    harness = launch(tmp_path, "a", [PYTHON, str(FAKE_HARNESS), "--spawn-child", "--ignore-sigterm"],
                     workspace(tmp_path, "a"))
    pids = wait_for_pids(harness.stdout_path, 4)
    try:
        assert harness.running_tree() == set(pids)
        assert harness.stop(grace=0.2) < 0 and not any(map(is_running, pids))
    finally:
        kill_leftover_sleeps(pids)


def test_without_unshare_the_command_runs_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # no unshare, no mount
    mount_namespace_available.cache_clear()
    try:
        confined = confine([sys.executable, "-V"], tmp_path, tmp_path / "home")
        assert (confined.argv, confined.cwd, confined.method) == ([sys.executable, "-V"], tmp_path, NO_CONFINEMENT)
        assert confined.workspace == str(tmp_path)
    finally:
        mount_namespace_available.cache_clear()
