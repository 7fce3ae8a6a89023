"""The parts that run the test suite on the card:

    triton_tests   tests/kernels/triton with TRITON_INTERPRET unset: each kernel compiled for the card and
                   run on cuda tensors (the tests pick the device from TRITON_INTERPRET). With --allow-cpu
                   on a CPU they run interpreted, as everywhere else.
    equivalence    the sharing on / off / alone tests (tests/engine/test_llm.py, test_kquant_models.py, and
                   the hybrid's on a pinned trunk, test_hybrid_prefix_sharing.py)
                   with the engine's device left to "auto", so the card, in its dtype (bfloat16). Where
                   bfloat16 rounding flips a near-tie, the failed tests run again in float32 on the card
                   (tests/engine/conftest.py reads DTYPE_ENV), and the report says which dtype passed.

Both deal their tests to several pytest processes at once (pytest_run.run_pytest_parallel). With --quick
each runs a few of its tests, so that a first run on a new card shows in about a minute whether the check
itself works there.
"""
from __future__ import annotations

import os

from engine.gpu_check.context import REPO_ROOT, PartContext, PartFailed, PartSkipped
from engine.gpu_check.pytest_run import PytestRun, run_pytest_parallel

DTYPE_ENV = "SWARM_TEST_DTYPE"
TRITON_TESTS = {False: ["tests/kernels/triton"],     # --quick: float32, and Q4_K of the block formats
                True: ["tests/kernels/triton", "-k", "Q4_K or float32 or dtype0"]}
# the Qwen3.5 hybrid's (float32, on fla's kernels where fla-core is installed) beside the full-attention models'
EQUIVALENCE_FILES = ["tests/engine/test_llm.py", "tests/engine/test_kquant_models.py",
                     "tests/engine/test_hybrid_prefix_sharing.py"]
EQUIVALENCE_TESTS = {False: [*EQUIVALENCE_FILES, "-k", "sharing_on_off or pinned_trunk"],   # --quick: Qwen3, Q4_K_M
                     True: [*EQUIVALENCE_FILES, "-k", "sharing_on_off and (qwen3 or q4_k_m)"]}
MARGIN_SECONDS = 5      # left to the part to write its report after pytest
GPU_WORKERS = 8         # pytest processes at once on a card's host (Triton compiles on its CPU cores)


def triton_tests(context: PartContext) -> dict:
    _require_tests()
    interpret = None if context.on_gpu else "1"
    run = _pytest(context, TRITON_TESTS[context.quick], {"TRITON_INTERPRET": interpret})
    details = {"interpreted": interpret is not None, "pytest": run.to_json()}
    if not run.passed:
        raise PartFailed(_summary(run), details)
    return details


def equivalence(context: PartContext) -> dict:
    _require_tests()
    first = _pytest(context, EQUIVALENCE_TESTS[context.quick], {DTYPE_ENV: None})
    details = {"device": context.device, "dtype": _auto_dtype(context.device), "runs": {"auto": first.to_json()}}
    if first.passed:
        return details
    if not context.on_gpu or not first.failed_ids:
        raise PartFailed(_summary(first), details)
    again = _pytest(context, first.failed_ids, {DTYPE_ENV: "float32"})
    details["runs"]["float32"] = again.to_json()
    details["bfloat16_failed"] = first.failed_ids
    if not again.passed:
        raise PartFailed(f"float32 too: {_summary(again)}", details)
    details["dtype"] = "float32"
    return details


def _pytest(context: PartContext, args: list[str], env: dict[str, str | None]) -> PytestRun:
    workers = min(GPU_WORKERS, os.cpu_count() or 1) if context.on_gpu else 2
    return run_pytest_parallel(args, env, context.seconds_left() - MARGIN_SECONDS, workers)


def _auto_dtype(device: str) -> str:
    import torch

    from engine.llm_engine import pick_dtype
    return str(pick_dtype("auto", torch.device(device))).removeprefix("torch.")


def _require_tests() -> None:
    if not (REPO_ROOT / "tests").is_dir():
        raise PartSkipped(f"no tests/ folder beside the engine ({REPO_ROOT}): run the check from a checkout")


def _summary(run: PytestRun) -> str:
    if run.returncode is None:
        return f"pytest ran past its time limit ({run.seconds:.0f} s); counts so far {run.counts}"
    failed = ", ".join(run.failed_ids[:5]) or "see output_tail"
    return f"pytest exit {run.returncode}: {run.counts}; failing: {failed}"
