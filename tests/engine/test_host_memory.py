"""engine/host_memory.py in real processes: page faults counted by the kernel (getrusage) while
activation-sized tensors are made and freed, with glibc's defaults and with freed memory kept."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engine import host_memory
from tests.helpers.tiny_models import make_tiny_model

ROOT = Path(__file__).parents[2]
CHURN = """
import resource, sys, torch
from engine.host_memory import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
elif sys.argv[1] != "default":   # a CPU engine for the model at this path
    from engine.llm_engine import EngineOptions, LLMEngine
    LLMEngine(sys.argv[1], EngineOptions(device="cpu", kv_budget_tokens=64))
sizes = [13 << 20, 5 << 20, 13 << 20, 2 << 20, 20 << 20]   # bytes: one prefill layer's activations
def churn():
    held = [torch.ones(size // 4) for size in sizes]
    del held
    for size in sizes:
        torch.ones(size // 4)
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(12):   # enough rounds that one stray round of fresh pages (seen on a loaded CI box) stays small
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    """Minor faults while tensors are made and freed; mode: default, keep, or a model for an engine.

    "default" pins glibc's mmap threshold at 4 MiB, where its default is a threshold that starts
    there and grows as mapped blocks are freed: left to grow, it made the baseline anything from
    15,000 to 120,000 faults on a loaded machine, and the comparison meaningless."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(4 << 20)} if mode == "default" else None
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's allocator only")
def test_kept_memory_is_reused_instead_of_faulted_in_again():
    default, kept = page_faults("default"), page_faults("keep")
    assert default > 4 * 4096   # glibc's defaults fault in fresh pages for these sizes (4 KB each)
    assert kept * 4 < default


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's allocator only")
def test_a_cpu_engine_keeps_freed_memory(tmp_path):
    model = make_tiny_model(tmp_path / "llama", "llama")
    assert page_faults(str(model)) * 4 < page_faults("default")


@pytest.mark.skipif(platform.libc_ver()[0] == "glibc", reason="for C libraries other than glibc")
def test_other_c_libraries_are_left_alone():
    assert host_memory.keep_freed_memory() is False
