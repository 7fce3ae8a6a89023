"""Runs one part of the GPU check in this process and writes its result file (engine.gpu_check.parts
starts it; not meant to be run by hand):

    python -m engine.gpu_check.part_main NAME --device cuda --seconds 110 --result FILE --inputs FILE [--quick]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import time
import traceback
from pathlib import Path

from engine.gpu_check.context import PartContext, PartFailed, PartSkipped, last_lines
from engine.gpu_check.parts import FAIL_ENV, HANG_ENV, PARTS
from engine.gpu_check.pytest_run import kill_running


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    part = next(p for p in PARTS if p.name == args.name)
    context = PartContext(args.device, args.quick, args.seconds, Path(args.result),
                          json.loads(Path(args.inputs).read_text()))
    context.save("running", {"pid": os.getpid()})   # a part killed at its time box reports this much
    signal.signal(signal.SIGTERM, _stop)
    try:
        _injected(part.name)
        module, function = part.function.split(":")
        details = getattr(importlib.import_module(module), function)(context)
        context.save("ok", details)
    except PartSkipped as skip:
        context.save("skipped", skip.details, str(skip))
    except PartFailed as failure:
        context.save("failed", failure.details, str(failure))
    except Exception:   # a bug in the part, or in what it checks: reported, the other parts go on
        context.save("failed", {}, "\n".join(last_lines(traceback.format_exc())))
    return 0


def _stop(signum, frame) -> None:
    """At the time box (SIGTERM from engine.gpu_check.parts): the pytest runs end with this process, though
    each has a session of its own."""
    kill_running()
    os._exit(128 + signum)


def _injected(name: str) -> None:
    if name in _listed(FAIL_ENV):
        raise RuntimeError(f"injected failure ({FAIL_ENV} names {name})")
    if name in _listed(HANG_ENV):
        time.sleep(3600)


def _listed(variable: str) -> set[str]:
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.gpu_check.part_main")
    parser.add_argument("name", choices=[p.name for p in PARTS])
    parser.add_argument("--device", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--quick", action="store_true")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
