"""The installed `swarm` command, run as a user runs it: a usage error is one line on stderr,
`error: ...`, with exit code 2; a failure while running exits 1; never a traceback."""
import os
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.helpers.spec_files import MINIMAL, write_spec

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GUARD = 120  # seconds: a bound on a hang, never reached by a working command


def swarm_command() -> list[str]:
    """The `swarm` script pip installed beside this Python (the entry point users run)."""
    installed = Path(sys.executable).with_name("swarm")
    found = str(installed) if installed.exists() else shutil.which("swarm")
    assert found, "the swarm command is not installed; run pip install -e ."
    return [found]


def swarm(*args, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([*swarm_command(), *map(str, args)], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=GUARD)


def assert_one_error_line(result: subprocess.CompletedProcess, exit_code: int) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.returncode == exit_code, result.stderr
    return lines[0]


def test_no_arguments_prints_the_help_and_exits_0():
    result = swarm()
    assert result.returncode == 0 and result.stderr == ""
    assert "Usage" in result.stdout
    for command in ("run", "serve", "inspect-prefix", "bench", "--version"):
        assert command in result.stdout


def test_version_comes_from_the_installed_package():
    result = swarm("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"swarm {metadata.version('swarm-llm')}\n"


@pytest.mark.parametrize("args, words", [
    (["run"], ["Missing argument 'spec'", "swarm run --help"]),
    (["inspect-prefix"], ["give a swarm.yaml to inspect, or --model-config"]),
    (["--bogus"], ["No such option: --bogus", "swarm --help"]),
    (["models", "--bogus"], ["No such option: --bogus", "swarm models --help"]),
    (["no-such-command"], ["No such command 'no-such-command'"]),
    (["serve", "--port", "99999"], ["'--port'", "65535"]),
    (["generate", "hi", "--max-tokens", "many"], ["'--max-tokens'"]),
    (["generate", "hi", "--temperature", "nan"], ["temperature must be a number"]),
    (["generate", "hi", "--dtype", "fp8"], ["dtype 'fp8'"]),
    (["serve", "--kv-budget", "lots"], ["--kv-budget: 'lots'"]),
    (["serve", "--log-level", "loud"], ["--log-level: 'loud'"]),
    (["bench", "--agents", "x"], ["--agents"]),
    (["bench-decode", "--agents", "1"], ["--agents must be at least 2"]),
    (["bench", "--out", "/no-such-folder/bench.json"], ["--out: /no-such-folder/bench.json"]),
    (["bench-decode", "--out", "/no-such-folder/decode.json"], ["--out: /no-such-folder/decode.json"]),
    (["bench-arrival", "--agents", "8", "--chunk", "8"], ["--chunk must be larger than --agents"]),
    (["bench-arrival", "--out", "/no-such-folder/arrival.json"], ["--out: /no-such-folder/arrival.json"]),
])
def test_usage_errors_are_one_line_and_exit_2(args, words):
    line = assert_one_error_line(swarm(*args), 2)
    for word in words:
        assert word.lower() in line.lower()  # click writes 'SPEC', typer's own click 'spec'


def test_run_out_naming_a_file_is_a_usage_error_and_leaves_nothing(tmp_path):
    spec = write_spec(tmp_path, MINIMAL + "workspace: {path: project}\n")
    (tmp_path / "project").mkdir()
    (tmp_path / "taken").write_text("not a folder")
    before = sorted(tmp_path.rglob("*"))
    line = assert_one_error_line(swarm("run", spec, "--out", tmp_path / "taken"), 2)
    assert "'--out'" in line and "is a file" in line
    assert sorted(tmp_path.rglob("*")) == before


def test_serve_on_a_taken_port_is_one_line_and_exits_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        line = assert_one_error_line(swarm("serve", "--host", "127.0.0.1", "--port", port), 1)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line
