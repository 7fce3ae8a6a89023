"""What loading a GGUF costs the host, as the kernel counts it: the resident memory (VmRSS) and its
peak (VmHWM) of a fresh process, before and after `LLM(path)` on SmolLM2 files made by llama.cpp.

The baseline is taken once the process has built an engine on a tiny model (libraries, C kernels,
oneDNN and thread pools in place), so what `LLM(path)` adds is the weights plus two things that are
not weights and are taken off: the KV pool (the engine's own count) and the tokenizer (about 25 MB
for SmolLM2's 49k tokens: a second copy read after the load; it can reuse memory the load freed, so
it is counted low if anything, and the weights high). File pages count while mapped.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.kquant_files import smollm2_quantized, tensor_table

ROOT = Path(__file__).parents[2]
HELD_RATIO = 1.15         # weights held / the file's tensor bytes (issue 18)
LOAD_OVERHEAD = 32 << 20  # bytes: allocator slack, Python objects and per-layer scratch on top of the bound
MEASURE = """
import gc, json, sys
from pathlib import Path
from engine import LLM
from engine.loading.loader import load_tokenizer, resolve_model

def memory():
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}

def reset_peak():   # VmHWM := VmRSS (Linux 4.0+); where refused, the peak stays the process's own, higher
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass

tiny, model = sys.argv[1:]
warm = LLM(tiny, device="cpu", dtype="float32", kv_budget_tokens=16)
del warm
gc.collect()
reset_peak()
before = memory()
llm = LLM(model, device="cpu", dtype="float32", kv_budget_tokens=16)
after = memory()
tokenizer = load_tokenizer(resolve_model(model))
tokenizer_bytes = memory()["VmRSS"] - after["VmRSS"]
print(json.dumps({"before": before, "after": after, "not_weights": llm.kv_stats().total_bytes + tokenizer_bytes}))
"""


def load_in_fresh_process(tiny: Path, model: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(tiny), str(model)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc/self/status")
def test_loading_holds_the_files_bytes_and_peaks_within_the_bound(tiny_kquant):
    path = smollm2_quantized("Q8_0")   # the largest of the files kquant_files makes
    table = tensor_table(path)
    tensor_bytes = sum(entry.nbytes for entry in table.values())
    largest_as_float32 = 4 * max(entry.elements for entry in table.values())
    measured = load_in_fresh_process(tiny_kquant("Q4_K_M"), path)
    before, after = measured["before"], measured["after"]
    held = after["VmRSS"] - before["VmRSS"] - measured["not_weights"]
    peak = after["VmHWM"] - before["VmRSS"] - measured["not_weights"]
    assert held <= HELD_RATIO * tensor_bytes, f"{held / tensor_bytes:.2f}x the file's tensor bytes"
    assert peak <= path.stat().st_size + largest_as_float32 + LOAD_OVERHEAD, f"peak {peak / 1e6:.1f} MB"
