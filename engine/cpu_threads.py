"""The CPU threads the engine computes with, and how they wait for each other.

torch's own ops, oneDNN's matmuls and swarm's prompt kernels run on one OpenMP runtime (torch's
libgomp; kernels/cpu/native.py links the kernels to it). That runtime reads its settings once, as it
loads, which is when torch is imported: `configure_openmp()` runs before that (engine/__init__.py
calls it first) and sets, where the user has not set them:

    OMP_NUM_THREADS   the cores this process may use: its CPU affinity (taskset, cpusets),
                      capped by a cgroup CPU quota (docker --cpus)
    OMP_WAIT_POLICY   PASSIVE: a thread left without work sleeps at once

libgomp's default is to spin first (GOMP_SPINCOUNT 300,000 rounds) so that the next parallel
region starts a few microseconds sooner. On a machine where other programs hold a core, the spinning
thread holds a core another thread of the same step needs: on a loaded 2-core machine a lone agent
decoded at 0.5-1 token/s spinning against 4-20 token/s sleeping (README, "Benchmarks", `--busy`).
Waking a sleeping thread costs tens of µs a region (40-80 on a 2-vCPU VM), and a decode step runs about
a hundred short ones: so the decode kernels (matmuls of a few rows, decode and trunk attention) run on
threads of their own, kernels/cpu/csrc/task_pool.c's, which spin while the machine is quiet and sleep
while it is busy; OpenMP's threads keep the prompts' GEMMs and attention, long calls where a wake is
nothing. Any of OMP_WAIT_POLICY, GOMP_SPINCOUNT or KMP_BLOCKTIME set by the user keeps the runtime's own
waiting; OMP_NUM_THREADS or MKL_NUM_THREADS keeps its thread count (both pools take torch's count). The
variables stay in this process's environment, so programs it starts inherit them;
`environment_without_ours` is the environment as the user gave it.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
CGROUP_ROOT = Path("/sys/fs/cgroup")

_ours: dict[str, str] = {}   # what configure_openmp added to os.environ


def configure_openmp() -> bool:
    """Sets the OpenMP variables the user left unset, before the runtime starts. False, with
    nothing changed, where torch (and so its runtime) was loaded already."""
    if "torch" in sys.modules:
        return False
    for name, value in openmp_settings(os.environ, usable_cores()).items():
        os.environ[name] = _ours[name] = value
    return True


def openmp_settings(environ, cores: int) -> dict[str, str]:
    """The variables to add to `environ` for a process that may use `cores` cores."""
    settings = {}
    if not any(environ.get(name) for name in THREAD_VARIABLES):
        settings["OMP_NUM_THREADS"] = str(cores)
    if not any(environ.get(name) for name in WAIT_VARIABLES):
        settings["OMP_WAIT_POLICY"] = "PASSIVE"
    return settings


def environment_without_ours() -> dict[str, str]:
    """os.environ less what configure_openmp set: for a process that should run as its users run it."""
    return {name: value for name, value in os.environ.items() if _ours.get(name) != value}


def wait_settings() -> dict[str, str]:
    """The variables that choose how the runtime's idle threads wait; {} for its default (spinning)."""
    return {name: os.environ[name] for name in WAIT_VARIABLES if os.environ.get(name)}


def usable_cores() -> int:
    """The cores this process may run on, capped by its cgroup's CPU quota; at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        cores = os.cpu_count() or 1
    return capped_by_quota(cores, cgroup_cpu_limit())


def capped_by_quota(cores: int, cpu_limit: float | None) -> int:
    """A quota is rounded up: 1.5 CPUs' time runs 2 threads."""
    return max(1, min(cores, math.ceil(cpu_limit)) if cpu_limit else cores)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPUs' worth of time a cgroup quota allows this process (1.5 for `docker --cpus 1.5`),
    the tightest along its cgroup's path; None where no quota is set or cgroups are not there."""
    limits = [limit for folder in _cgroup_folders(root, membership) if (limit := _quota(folder))]
    return min(limits, default=None)


def _cgroup_folders(root: Path, membership: Path) -> list[Path]:
    """The folders of this process's cgroup and its ancestors, for cgroup v2 and v1's cpu controller."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers and "cpu" not in controllers.split(","):
            continue
        base = root / controllers if controllers else root
        folder = base / path.lstrip("/")
        folders += [folder, *[parent for parent in folder.parents if parent.is_relative_to(base)]]
    return folders


def _quota(folder: Path) -> float | None:
    try:
        if (folder / "cpu.max").exists():   # v2: "max 100000" or "150000 100000"
            quota, period = (folder / "cpu.max").read_text().split()
        else:                               # v1: a quota of -1 for none
            quota, period = ((folder / name).read_text().strip() for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        if quota in ("max", "-1") or int(period) <= 0:
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None
