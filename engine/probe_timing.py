"""How the machine probe times a run: the fastest of a few after an untimed one, runs compared with each other timed
side by side."""
from __future__ import annotations

import math
import time
from typing import Callable

REPEATS = 3
SIDE_BY_SIDE_ROUNDS = 8   # of runs compared with each other (fastest_each)


def fastest_s(run: Callable[[], object], budget_s: float) -> float:
    """Seconds of the fastest of up to REPEATS timed runs after an untimed one; at least one, fewer once
    `budget_s` is spent."""
    return fastest_each({"run": run}, budget_s, REPEATS)["run"]


def fastest_each(runs: dict[str, Callable[[], object]], budget_s: float,
                 rounds: int = SIDE_BY_SIDE_ROUNDS) -> dict[str, float]:
    """Seconds of each run's fastest, the runs timed in turn, a round at a time: one untimed round, then up to
    `rounds`, fewer once `budget_s` is spent. Runs compared with each other so see the same load: timed one after
    the other on a busy 2-core VM, a burst of another process's work during the second made bfloat16's attention
    measure 0.89x float32's, where side by side it measured 1.3x."""
    began = time.perf_counter()
    for run in runs.values():
        run()
    best = {name: math.inf for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
        if time.perf_counter() - began >= budget_s:
            break
    return best
