"""The parts of the GPU check, in the order they run, and how one runs: in its own process
(`python -m engine.gpu_check.part_main NAME`), killed with its children at its time box, its report
read from the file it writes as it goes (a part killed at the box keeps what it saved).

A part's time box is its share of the budget (470 s for all six) plus what the parts before it left unused.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.gpu_check.context import REPO_ROOT, last_lines

FAIL_ENV = "SWARM_GPU_CHECK_FAIL"     # parts (comma-separated) that raise at once: shows one failing stops nothing
HANG_ENV = "SWARM_GPU_CHECK_HANG"     # parts that sleep past their time box: shows the box is kept
BUDGET_SECONDS = 470                  # the whole check, leaving half a minute of the 8 minutes for start-up
OUTPUT_LINES = 30                     # of a failed part's own output, kept in its report
STOP_GRACE = 5                        # seconds a part has, once told to stop, before it is killed


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    function: str        # "module:function" taking a PartContext, returning details
    seconds: int         # its share of the budget
    what: str


PARTS = [
    Part("device", "engine.gpu_check.device_info:run", 30, "torch and Triton versions, the card, ROCm or CUDA"),
    Part("triton_tests", "engine.gpu_check.suites:triton_tests", 110,
         "pytest tests/kernels/triton, compiled for the card (TRITON_INTERPRET unset)"),
    Part("equivalence", "engine.gpu_check.suites:equivalence", 90,
         "sharing on, off and alone give the same greedy tokens on the card (bf16, else float32)"),
    Part("graphs", "engine.gpu_check.graphs:run", 60, "decode graphs on and off give the same greedy tokens"),
    Part("timings", "engine.gpu_check.timings:run", 150,
         "prefill and decode of a Qwen3-8B shape, bf16 and Q4_K, N=1 and 8 over a 4,096-token trunk"),
    Part("bandwidth", "engine.gpu_check.bandwidth:run", 30,
         "a decode step's bytes over its time, against the card's measured copy rate and datasheet"),
]
PART_NAMES = [part.name for part in PARTS]


@dataclass(slots=True)
class PartReport:
    name: str
    status: str                     # ok, skipped or failed
    seconds: float
    details: dict = field(default_factory=dict)
    error: str | None = None        # why it failed or was skipped: the error's last lines
    time_box: float = 0.0

    def to_json(self) -> dict:
        return {"status": self.status, "seconds": round(self.seconds, 2), "time_box_s": round(self.time_box, 1),
                "details": self.details, "error": self.error}


def run_part(part: Part, seconds: float, device: str, quick: bool, work_dir: Path,
             reports: dict[str, PartReport]) -> PartReport:
    """Runs `part` in a fresh process given `seconds`; never raises for what happens inside it."""
    result_file, inputs_file = work_dir / f"{part.name}.json", work_dir / f"{part.name}.inputs.json"
    inputs_file.write_text(json.dumps({name: report.to_json() for name, report in reports.items()}))
    command = [sys.executable, "-m", "engine.gpu_check.part_main", part.name, "--device", device,
               "--seconds", f"{seconds:.1f}", "--result", str(result_file), "--inputs", str(inputs_file)]
    began = time.monotonic()
    process = subprocess.Popen(command + (["--quick"] if quick else []), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=seconds)
        timed_out = False
    except subprocess.TimeoutExpired:
        output, timed_out = _stop(process), True
    status, details, error = _outcome(result_file, process.returncode, output,
                                      f"timed out after its time box of {seconds:.0f} s" if timed_out else None)
    return PartReport(part.name, status, time.monotonic() - began, details, error, seconds)


def _stop(process: subprocess.Popen) -> str:
    """SIGTERM to the part's process group (the part then kills the pytest runs it started, each in a
    session of its own), SIGKILL after STOP_GRACE seconds; the part's output."""
    _signal_group(process, signal.SIGTERM)
    try:
        return process.communicate(timeout=STOP_GRACE)[0]
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        return process.communicate()[0]


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:    # it ended meanwhile
        pass


def _outcome(result_file: Path, returncode: int, output: str, timeout: str | None) -> tuple[str, dict, str | None]:
    """(status, details, error) from what the part saved, its exit and its output."""
    saved = json.loads(result_file.read_text()) if result_file.exists() else {}
    status, details, error = saved.get("status", "failed"), saved.get("details", {}), saved.get("error")
    if timeout:
        status, error = "failed", f"{timeout}; {error or 'the details are what it had saved'}"
    elif status not in ("ok", "skipped", "failed"):
        status, error = "failed", f"the part's process ended (exit {returncode}) before it reported"
    if status == "failed" and output.strip():
        details = {**details, "output_tail": last_lines(output, OUTPUT_LINES)}
    return status, details, error
