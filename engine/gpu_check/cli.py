"""The command line of `python -m engine.gpu_check`: which parts, the budget, the one JSON document."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from engine.gpu_check.parts import BUDGET_SECONDS, FAIL_ENV, HANG_ENV, PART_NAMES, PARTS, PartReport, run_part

SCHEMA_VERSION = 1
NO_GPU = ("error: no GPU: torch sees none (torch.cuda.is_available() is False); run this on a machine with a card, "
          "or add --allow-cpu to check the script itself on this CPU")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(NO_GPU, file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    document = run_check(args.parts, device, args.quick, args.budget_s)
    document["command"] = " ".join(["python -m engine.gpu_check", *(argv if argv is not None else sys.argv[1:])])
    text = json.dumps(document, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if document["ok"] else 1


def run_check(names: list[str], device: str, quick: bool, budget: float) -> dict:
    """Runs the parts named, in PARTS' order; the report of all of them. The budget is shared among them
    in proportion to their shares (Part.seconds), and what one leaves unused goes to those after it."""
    chosen = [part for part in PARTS if part.name in names]
    scale = budget / sum(part.seconds for part in chosen)
    started, began = datetime.now(timezone.utc), time.monotonic()
    reports: dict[str, PartReport] = {}
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as work_dir:
        for index, part in enumerate(chosen):
            left = budget - (time.monotonic() - began)
            seconds = left - sum(later.seconds for later in chosen[index + 1:]) * scale
            if seconds < 1:
                reports[part.name] = PartReport(part.name, "skipped", 0.0, {}, "no time left in the budget")
                continue
            print(f"gpu_check: {part.name} ({part.what}), up to {seconds:.0f} s ...", file=sys.stderr, flush=True)
            reports[part.name] = run_part(part, seconds, device, quick, Path(work_dir), reports)
            print(f"gpu_check: {part.name} {reports[part.name].status} in {reports[part.name].seconds:.1f} s",
                  file=sys.stderr, flush=True)
    return {"schema_version": SCHEMA_VERSION, "device": device, "quick": quick,
            "started_at": started.isoformat(timespec="seconds"), "budget_s": budget,
            "seconds": round(time.monotonic() - began, 2),
            "ok": all(report.status != "failed" for report in reports.values()),
            "parts": {name: report.to_json() for name, report in reports.items()}}


def _part_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PART_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(f"no part {', '.join(unknown)}; the parts are {', '.join(PART_NAMES)}")
    return names


def _parser() -> argparse.ArgumentParser:
    parts = "\n".join(f"  {part.name:13} {part.what}" for part in PARTS)
    parser = argparse.ArgumentParser(
        prog="python -m engine.gpu_check", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Checks swarm's GPU path on this machine's card in at most 8 minutes and prints one JSON "
                    "document: a report per part (status ok, skipped or failed; seconds; details or the "
                    "error's last lines). Each part runs in its own process and time box: one failing "
                    "stops none of the others. Exit 0: no part failed; 1: one did; 2: no GPU.",
        epilog=f"parts, in the order they run:\n{parts}\n\n"
               "A first run on a new card: --quick (about a minute), then without.\n"
               f"For testing the check itself: {FAIL_ENV}=a,b makes those parts fail at once, "
               f"{HANG_ENV}=a makes them hang until their time box.")
    parser.add_argument("--parts", type=_part_list, default=list(PART_NAMES),
                        help="comma-separated subset to run (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny random model instead of the Qwen3-8B shape, and a few of each suite's tests")
    parser.add_argument("--out", metavar="FILE", help="also write the JSON document to FILE")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run on a machine without a GPU: the Triton tests interpreted, timings on the CPU")
    parser.add_argument("--budget-s", type=float, default=BUDGET_SECONDS,
                        help=f"seconds for the whole check, shared among the parts run (default {BUDGET_SECONDS})")
    return parser
