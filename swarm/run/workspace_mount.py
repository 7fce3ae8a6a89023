"""Every agent's workspace at one absolute path, AGENT_WORKSPACE, and its home at another, AGENT_HOME, so
that harnesses whose prompts name their cwd (Claude Code's environment block does) or their home (Codex
lists its skills under CODEX_HOME) send the same prompt and share one trunk.

Where the system allows it, the harness runs in a private mount namespace (util-linux `unshare`, no
root needed) in which its own workspace and home are bind-mounted over AGENT_WORKSPACE and AGENT_HOME:

    unshare --user --map-root-user --mount      a user and mount namespace, as its root
      sh -c 'mount --bind WORKSPACE AGENT_WORKSPACE && mount --bind HOME AGENT_HOME
             && cd AGENT_WORKSPACE && exec ...'
        unshare --user --map-user=UID --map-group=GID    back to the caller's own uid and gid
          HARNESS ARGV...

Every step execs, so the harness keeps the pid swarm started, its exit status and its signals. It
runs as the caller's uid again (Claude Code refuses to skip permissions as root), sees the rest of
the file system as before, and files of users other than the caller show as `nobody`. This moves
the workspace; it does not confine what the harness's commands can reach. Where it is not
available, `confine` leaves the command as it is ("none"), and the run canonicalizes the requests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

AGENT_WORKSPACE = "/tmp/swarm-agent"
AGENT_HOME = "/tmp/swarm-agent-home"
MOUNT_NAMESPACE, NO_CONFINEMENT = "mount-namespace", "none"
MOUNT_FAILED = 125  # the exit code when a bind mount or the cd fails
_MOUNT_SCRIPT = (f'"$1" --bind "$2" "$3" && "$1" --bind "$4" "$5" && cd "$3" || exit {MOUNT_FAILED}; '
                 'shift 5; exec "$@"')
_PROBE_FILE = "swarm-mount-probe"


@dataclass(frozen=True, slots=True)
class ConfinedCommand:
    argv: list[str]
    cwd: Path  # where to start argv; in a mount namespace the harness then works in AGENT_WORKSPACE
    method: str  # MOUNT_NAMESPACE or NO_CONFINEMENT, for the run's summary
    workspace: str  # the path the harness sees as its workspace


def confine(argv: Sequence[str], workspace: Path, home: Path) -> ConfinedCommand:
    """`argv` run with `workspace` at AGENT_WORKSPACE and `home` at AGENT_HOME where this system can, else as it is."""
    workspace = Path(workspace).resolve()
    if not mount_namespace_available():
        return ConfinedCommand(list(argv), workspace, NO_CONFINEMENT, str(workspace))
    for mount_point in (AGENT_WORKSPACE, AGENT_HOME):   # a tmp cleaner may take them
        Path(mount_point).mkdir(parents=True, exist_ok=True)
    return ConfinedCommand(mounted_argv(argv, workspace, Path(home).resolve()), workspace, MOUNT_NAMESPACE,
                           AGENT_WORKSPACE)


def seen_paths(workspace: Path, home: Path) -> tuple[str, str]:
    """The paths a confined command sees `workspace` and `home` at: AGENT_WORKSPACE and AGENT_HOME where
    confine mounts them there, else their own."""
    if mount_namespace_available():
        return AGENT_WORKSPACE, AGENT_HOME
    return str(Path(workspace).resolve()), str(Path(home).resolve())


def mounted_argv(argv: Sequence[str], workspace: Path, home: Path) -> list[str]:
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    assert unshare and mount, "mount_namespace_available() said yes"
    return [unshare, "--user", "--map-root-user", "--mount", "/bin/sh", "-c", _MOUNT_SCRIPT, "swarm-mount",
            mount, str(workspace), AGENT_WORKSPACE, str(home), AGENT_HOME,
            unshare, "--user", f"--map-user={os.getuid()}", f"--map-group={os.getgid()}", "--", *argv]


@lru_cache(maxsize=1)
def mount_namespace_available() -> bool:
    """Whether `mounted_argv` works here: tried once, on a scratch workspace."""
    if not (shutil.which("unshare") and shutil.which("mount")):
        return False
    try:
        for mount_point in (AGENT_WORKSPACE, AGENT_HOME):
            Path(mount_point).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="swarm-mount-probe-") as scratch:
            (Path(scratch) / _PROBE_FILE).touch()
            probe = mounted_argv(["test", "-f", f"{AGENT_HOME}/{_PROBE_FILE}"], Path(scratch), Path(scratch))
            done = subprocess.run(probe, cwd=scratch, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
