"""Which build of csrc/quant_matmul.c (the decode steps' matmuls) a process loads on a CPU with AVX-512: the
-march=native one, or the same without AVX-512, whose AVX2 code takes one column a vector where the AVX-512
code takes two. Both give the same bits (tests/kernels/cpu/test_quant_matmul.py); which one is faster depends
on the CPU. A Zen 4 runs a 512-bit vector as two 256-bit halves: there, side by side in one engine, SmolLM2's
decode steps at T=2048 took 14.9 ms with the AVX2 build against 15.7 (1 agent) and 35.0 against 39.9 (8 agents).
So it is measured, once per machine and build: decode-shaped products (1 and 8 rows) of Q4_1 weights larger
than the caches, each build in turn, the best of a few rounds; the narrower build wins only where it is
MARGIN faster. The choice, with its timings, is cached in build-choice.json beside the builds
($SWARM_CACHE_DIR/kernels) under the native build's file name, which names the source, flags, compiler and CPU.

kernels/cpu/native.py asks this module which flags to build with, and hands it the function that builds.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from kernels.cpu.signatures import SIGNATURES, declare

CHOSEN_FOR = ("quant_matmul",)
NARROWER = ("-mno-avx512f",)
MARGIN = 0.95            # the narrower build's time over the native one's, at most
ROWS = (1, 8)
WEIGHTS, WEIGHT_ROWS, COLS = 24, 1536, 2048   # Q4_1: 47 MB, past a desktop CPU's L3
ROUNDS = 3
Q4_1_CODE, Q4_1_BYTES = 3, 20                 # GGML's type code, bytes a block of 32 values
CACHE_FILE = "build-choice.json"


def extra_flags(name: str, cpu_flags: str, build: Callable[[tuple[str, ...]], Path | None]) -> tuple[str, ...]:
    """The flags to add to the native ones for csrc/<name>.c on a CPU with these /proc/cpuinfo flags: NARROWER
    where measured faster. build(extra flags): that build's library file, built first if need be; None if not."""
    if name not in CHOSEN_FOR or "avx512f" not in cpu_flags.split():
        return ()
    wide = build(())
    if wide is None:
        return ()
    path = choice_file(wide.parent)
    with _one_process_at_a_time(path):   # two processes measuring at once could each choose a different build
        choices = _read(path)
        if wide.name not in choices:
            narrow = build(NARROWER)
            choices[wide.name] = {"build": "native"} if narrow is None else measured_choice(wide, narrow)
            _write(path, choices)
    return NARROWER if choices[wide.name].get("build") == "avx2" else ()


def choice_file(build_folder: Path) -> Path:
    return build_folder / CACHE_FILE


def measured_choice(wide: Path, narrow: Path) -> dict:
    """{"build": "native" or "avx2", "seconds": each build's best pass over the weights at each row count}"""
    generator = torch.Generator().manual_seed(0)
    weights = [_q4_1_blocks(generator) for _ in range(WEIGHTS)]
    libraries = {"native": _declared(wide), "avx2": _declared(narrow)}
    best = {build: math.inf for build in libraries}
    for _ in range(ROUNDS):   # the builds take turns, so a busy moment costs both
        for build, library in libraries.items():
            best[build] = min(best[build], _pass_s(library, weights))
    chosen = "avx2" if best["avx2"] <= MARGIN * best["native"] else "native"
    return {"build": chosen, "seconds": best}


def _pass_s(library: ctypes.CDLL, weights: list[torch.Tensor]) -> float:
    """Seconds to multiply each row count's x by every weight in turn, one call a weight."""
    total = 0.0
    for rows in ROWS:
        x, y = torch.randn(rows, COLS), torch.empty(rows, WEIGHT_ROWS)
        start = time.perf_counter()
        for blocks in weights:
            library.swarm_quant_matmul(x.data_ptr(), rows, COLS, blocks.data_ptr(), Q4_1_CODE, WEIGHT_ROWS, None,
                                       y.data_ptr(), torch.get_num_threads())
        total += time.perf_counter() - start
    return total


def _q4_1_blocks(generator: torch.Generator) -> torch.Tensor:
    """A random Q4_1 weight: random 4-bit values under small finite fp16 scales (0.01) and minima (-0.08)."""
    blocks = torch.randint(0, 256, (WEIGHT_ROWS, COLS // 32, Q4_1_BYTES), dtype=torch.uint8, generator=generator)
    blocks[:, :, :4] = torch.tensor([0.01, -0.08], dtype=torch.float16).view(torch.uint8)
    return blocks.view(WEIGHT_ROWS, -1)


def _declared(path: Path) -> ctypes.CDLL:
    return declare(ctypes.CDLL(str(path)), SIGNATURES["quant_matmul"])


@contextmanager
def _one_process_at_a_time(path: Path):
    """An exclusive lock on a file beside path while inside: a process that finds no choice measures while the
    others wait, and they then read its choice. Without the lock (no fcntl, a folder it cannot write), inside
    anyway."""
    try:
        import fcntl
        handle = open(path.with_suffix(".lock"), "a")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _read(path: Path) -> dict[str, dict]:
    try:
        choices = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return choices if isinstance(choices, dict) else {}


def _write(path: Path, choices: dict[str, dict]) -> None:
    """Best effort: a choice that cannot be stored is measured again by the next process."""
    try:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(choices, indent=2) + "\n")
        temporary.replace(path)
    except OSError:
        pass
