"""Holds fake harnesses the way `swarm run` will, for the Ctrl-C and SIGTERM tests:

    python -m tests.helpers.harness_driver RUN_DIR COUNT [--ignore-sigterm]

starts COUNT `fake_harness.py --spawn-child` processes (agents a0, a1, ...) with swarm's StopFlag
installed, waits for SIGINT or SIGTERM, stops them all with stop_all, prints their exit codes as one
JSON line ({"a0": -15, ...}) and exits as a stopped run does (128 + the signal's number).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from swarm.run.harness_process import HarnessProcess, stop_all
from swarm.run.stop_flag import StopFlag

FAKE_HARNESS = Path(__file__).with_name("fake_harness.py")
GRACE = 1.0  # seconds; a tree that ignores SIGTERM is SIGKILLed after it


def main(run_dir: Path, count: int, extra: list[str]) -> int:
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    command = [sys.executable, str(FAKE_HARNESS), "--spawn-child", *extra]
    with StopFlag().installed() as flag:
        harnesses = [HarnessProcess(f"a{i}", command, env, run_dir, run_dir).start() for i in range(count)]
        while not flag.requested:
            time.sleep(0.05)
        with flag.shielded():
            stop_all(harnesses, GRACE)
    print(json.dumps({harness.agent: harness.exit_code for harness in harnesses}), flush=True)
    return flag.exit_code


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
