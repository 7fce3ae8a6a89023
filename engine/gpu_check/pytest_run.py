"""Runs a selection of the test suite in a child process under a time limit and sums it up from pytest's
JUnit XML: counts, and each failing test with the last lines of its message."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from engine.gpu_check.context import REPO_ROOT, last_lines

MESSAGE_LINES = 8
OUTPUT_LINES = 20
VERBOSE_OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}
_RUNNING: set[subprocess.Popen] = set()    # each pytest started here and not yet ended, in a session of its own


@dataclass(slots=True)
class PytestRun:
    args: list[str]
    seconds: float
    returncode: int | None        # None: killed at its time limit
    counts: dict[str, int] = field(default_factory=dict)    # passed, failed, errors, skipped
    failures: list[dict] = field(default_factory=list)      # {"test", "message"}
    output_tail: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.returncode == 0 or (self.returncode == 5 and not self.failures)   # 5: nothing collected

    @property
    def failed_ids(self) -> list[str]:
        return [failure["test"] for failure in self.failures]

    def to_json(self) -> dict:
        summary = {"args": self.args, "seconds": round(self.seconds, 2), "returncode": self.returncode,
                   "timed_out": self.returncode is None, "counts": self.counts, "failures": self.failures}
        if not self.passed:
            summary["output_tail"] = self.output_tail
        return summary


def run_pytest_parallel(args: list[str], env: dict[str, str | None], seconds: float, workers: int,
                        cwd: Path = REPO_ROOT) -> PytestRun:
    """run_pytest over the tests ARGS select, in `workers` processes at once, each a contiguous share (the
    cases of one kernel stay together, so each process compiles its kernels once): Triton compiling a
    kernel for the card is CPU work, which the card's host has cores for."""
    began = time.monotonic()
    ids = collect(args, env, seconds, cwd)
    if workers < 2 or len(ids) < 2:
        return run_pytest(args, env, seconds - (time.monotonic() - began), cwd)
    left = seconds - (time.monotonic() - began)
    size = -(-len(ids) // workers)
    groups = [ids[start:start + size] for start in range(0, len(ids), size)]   # never an empty one: that runs all
    with ThreadPoolExecutor(workers) as pool:
        runs = list(pool.map(lambda group: run_pytest(group, env, left, cwd), groups))
    return _merged(args, runs, time.monotonic() - began)


def collect(args: list[str], env: dict[str, str | None], seconds: float, cwd: Path = REPO_ROOT) -> list[str]:
    """The node ids ARGS select, relative to `cwd` ([] where collecting fails: the caller then runs ARGS)."""
    output, returncode = _pytest(["--collect-only", "-q", *args], env, seconds, cwd)
    if returncode != 0:
        return []
    listing = output.strip().split("\n\n")[0]     # the ids, then a blank line and the summary
    return [line for line in listing.splitlines() if "::" in line]


def run_pytest(args: list[str], env: dict[str, str | None], seconds: float, cwd: Path = REPO_ROOT) -> PytestRun:
    """`python -m pytest -v ARGS` in `cwd` (the repository), with `env` changed (None removes a variable)."""
    with tempfile.TemporaryDirectory(prefix="gpu_check_pytest_") as folder:
        junit = Path(folder) / "junit.xml"
        began = time.monotonic()
        output, returncode = _pytest(["-v", f"--junitxml={junit}", *args], env, seconds, cwd)
        run = PytestRun(args, time.monotonic() - began, returncode,
                        output_tail=last_lines(output, OUTPUT_LINES))
        if junit.exists():
            run.counts, run.failures = _read_junit(junit)
        else:    # killed before pytest wrote its report: count what its verbose lines say finished
            run.counts = {kind: len(re.findall(rf"::\S+ {word}\b", output)) for word, kind in VERBOSE_OUTCOMES.items()}
    return run


def _pytest(args: list[str], env: dict[str, str | None], seconds: float, cwd: Path) -> tuple[str, int | None]:
    """(output, exit status), the status None where it ran past `seconds` and was killed with its children."""
    child_env = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    for name in [k for k, v in env.items() if v is None]:
        child_env.pop(name, None)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    process = subprocess.Popen(command, cwd=cwd, env=child_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _RUNNING.add(process)
    try:
        output, _ = process.communicate(timeout=max(seconds, 1))
        return output, process.returncode
    except subprocess.TimeoutExpired:
        _kill(process)
        return process.communicate()[0], None
    finally:
        _RUNNING.discard(process)


def kill_running() -> None:
    """Kills every pytest this process started that is still running, with what they started."""
    for process in list(_RUNNING):
        _kill(process)


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _merged(args: list[str], runs: list[PytestRun], seconds: float) -> PytestRun:
    counts = {kind: sum(run.counts.get(kind, 0) for run in runs) for kind in VERBOSE_OUTCOMES.values()}
    tail = [line for run in runs if not run.passed for line in run.output_tail]
    return PytestRun(args, seconds, _merged_status([run.returncode for run in runs]), counts,
                     [failure for run in runs for failure in run.failures], tail)


def _merged_status(codes: list[int | None]) -> int | None:
    """None if any run was killed, else the worst failing status, else 0 (5 where none collected a test)."""
    if None in codes:
        return None
    failing = [code for code in codes if code not in (0, 5)]
    return max(failing) if failing else (0 if 0 in codes else 5)


def _read_junit(path: Path) -> tuple[dict[str, int], list[dict]]:
    counts = dict.fromkeys(VERBOSE_OUTCOMES.values(), 0)
    failures = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        kind = {"failure": "failed", "error": "errors", "skipped": "skipped"}.get(getattr(outcome, "tag", ""), "passed")
        counts[kind] += 1
        if kind in ("failed", "errors"):
            text = (outcome.get("message") or "") + "\n" + (outcome.text or "")
            failures.append({"test": _test_id(case), "kind": kind,
                             "message": last_lines(text, MESSAGE_LINES)})
    return counts, failures


def _test_id(case) -> str:
    """tests/engine/test_llm.py::test_x[llama] from JUnit's classname tests.engine.test_llm and name."""
    classname, name = case.get("classname", ""), case.get("name", "")
    parts = classname.split(".")
    for split in range(len(parts), 0, -1):
        path = Path(*parts[:split]).with_suffix(".py")
        if (REPO_ROOT / path).exists():
            return "::".join([path.as_posix(), *parts[split:], name])
    return f"{classname}::{name}"
