"""engine/cpu_threads.py: the OpenMP settings a swarm process starts its runtime with, read back
from the runtime itself (OMP_DISPLAY_ENV makes libgomp print what it took, as it loads) in real
subprocesses of `python` and of the installed `swarm` command; and the cgroup quota, from real files."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cpu_threads import capped_by_quota, cgroup_cpu_limit

ROOT = Path(__file__).parents[2]
OURS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
HANG_GUARD_S = 300   # seconds; reaching it means a hang, never a slow machine
PRINT_THREADS = "import engine, torch; print(torch.get_num_threads())"
LOAD_RUNTIME = "import engine, torch"   # engine first, as swarm's modules do; torch loads the runtime
INSPECT = ["inspect-prefix", "swarm.yaml.example", "--json"]   # a command that loads torch, not the weights


def user_environment(**settings: str) -> dict[str, str]:
    """This environment without any OpenMP setting (the test process may hold swarm's), plus `settings`."""
    env = {name: value for name, value in os.environ.items() if name not in OURS}
    return {**env, "OMP_DISPLAY_ENV": "VERBOSE", **settings}


def run(args: list[str], env: dict[str, str], cores: set[int] | None = None) -> subprocess.CompletedProcess:
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S,
                          preexec_fn=pin)
    assert done.returncode == 0, done.stderr
    return done


def runtime_settings(stderr: str) -> dict[str, str]:
    """What the first OpenMP runtime to load printed it runs with (torch's: torch loads first)."""
    block = stderr.split("OPENMP DISPLAY ENVIRONMENT BEGIN", 1)[1].split("OPENMP DISPLAY ENVIRONMENT END", 1)[0]
    pairs = (line.split("=", 1) for line in block.splitlines() if "=" in line)
    return {name.strip(): value.strip().strip("'") for name, value in pairs}


def test_idle_threads_sleep_at_once_instead_of_spinning():
    settings = runtime_settings(run([sys.executable, "-c", LOAD_RUNTIME], user_environment()).stderr)
    assert settings["OMP_WAIT_POLICY"] == "PASSIVE"
    assert settings["GOMP_SPINCOUNT"] == "0"   # libgomp's own default: 300000 rounds


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_the_swarm_command_runs_one_thread_per_core_it_may_use():
    swarm = shutil.which("swarm")
    assert swarm, "the swarm command is not installed (pip install -e .)"
    first = min(os.sched_getaffinity(0))
    settings = runtime_settings(run([swarm, *INSPECT], user_environment(), cores={first}).stderr)
    assert (settings["OMP_NUM_THREADS"], settings["GOMP_SPINCOUNT"]) == ("1", "0")
    everything = runtime_settings(run([swarm, *INSPECT], user_environment()).stderr)
    assert everything["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_torch_computes_on_the_cores_the_affinity_mask_allows():
    first = min(os.sched_getaffinity(0))
    done = run([sys.executable, "-c", PRINT_THREADS], user_environment(), cores={first})
    assert done.stdout.split() == ["1"]


def test_the_users_own_settings_win():
    env = user_environment(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE")
    done = run([sys.executable, "-c", PRINT_THREADS], env)
    settings = runtime_settings(done.stderr)
    assert (settings["OMP_NUM_THREADS"], settings["OMP_WAIT_POLICY"]) == ("1", "ACTIVE")
    assert done.stdout.split() == ["1"]
    spin = runtime_settings(run([sys.executable, "-c", LOAD_RUNTIME], user_environment(GOMP_SPINCOUNT="1000")).stderr)
    assert spin["GOMP_SPINCOUNT"] == "1000"   # a spin count of the user's keeps the runtime's own waiting


def test_programs_started_for_the_user_get_the_users_environment():
    code = ("import json, engine; from engine.cpu_threads import environment_without_ours\n"
            f"print(json.dumps({{k: v for k, v in environment_without_ours().items() if k in {OURS!r}}}))")
    done = run([sys.executable, "-c", code], user_environment(OMP_WAIT_POLICY="active"))
    assert json.loads(done.stdout) == {"OMP_WAIT_POLICY": "active"}


def test_nothing_is_set_once_torch_has_started_its_runtime():
    code = ("import os, torch; before = dict(os.environ)\n"
            "from engine.cpu_threads import configure_openmp\n"
            "assert configure_openmp() is False and dict(os.environ) == before, 'changed'")
    run([sys.executable, "-c", code], user_environment())


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cgroup_v2_quota_caps_the_threads_and_the_tightest_ancestor_counts(tmp_path):
    root, membership = tmp_path / "cgroup", tmp_path / "self_cgroup"
    write(membership, "0::/user.slice/app\n")
    write(root / "user.slice" / "app" / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(root, membership) == 1.5
    write(root / "user.slice" / "cpu.max", "50000 100000\n")
    assert cgroup_cpu_limit(root, membership) == 0.5
    write(root / "user.slice" / "cpu.max", "max 100000\n")
    write(root / "user.slice" / "app" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(root, membership) is None


def test_a_cgroup_v1_cpu_quota_is_read_and_other_controllers_are_not(tmp_path):
    root, membership = tmp_path / "cgroup", tmp_path / "self_cgroup"
    write(membership, "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    write(root / "memory" / "docker" / "abc" / "cpu.max", "10000 100000\n")   # not a cpu controller's
    folder = root / "cpu,cpuacct" / "docker" / "abc"
    write(folder / "cpu.cfs_quota_us", "200000\n")
    write(folder / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(root, membership) == 2.0
    write(folder / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(root, membership) is None


def test_no_cgroups_no_quota(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "cgroup", tmp_path / "missing") is None


def test_a_quota_rounds_up_and_never_exceeds_the_cores():
    assert capped_by_quota(8, 1.5) == 2
    assert capped_by_quota(2, 0.2) == 1
    assert capped_by_quota(2, 16.0) == 2
    assert capped_by_quota(3, None) == 3
