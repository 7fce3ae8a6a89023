"""engine/machine_probe.py on this machine: what the probes return and how their cache is kept."""
import json
import math

import pytest
import torch

from engine import cpu_has_native
from engine.machine_probe import (
    CALIBRATION_SHAPE,
    INT8_KERNEL,
    KERNEL,
    PREFILL_SHAPES,
    MachineProbe,
    bf16_mode_sums_in_float32,
    cache_path,
    cached_probe,
    int8_probed,
    panels_probed,
    probe_machine,
)
from engine.probe_timing import fastest_each
from kernels.cpu import bf16_matmul, code_prompt

SHORT = {"matmul": 0.05, "read": 0.05, "attention": 0.05, "decode": 0.01, "panels": 0.01}   # each probe still runs
                                                                                            # at least once


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_the_probes_return_positive_finite_rates_for_the_dtypes_the_engine_could_use():
    probe = probe_machine(SHORT)
    expected = ({"float32", "bfloat16"} | ({"float16"} if cpu_has_native(torch.float16) else set())
                | ({KERNEL} if bf16_matmul.native() else set()) | ({INT8_KERNEL} if code_prompt.native() else set()))
    assert set(probe.matmul_flop_s) == expected
    for dtype, rate in probe.matmul_flop_s.items():
        assert 0 < rate.flop_s < math.inf
        assert rate.shape in (CALIBRATION_SHAPE, *PREFILL_SHAPES)
        assert rate.native == (dtype in (KERNEL, INT8_KERNEL) or cpu_has_native(getattr(torch, dtype)))
        assert rate.float32_sums == (dtype != "bfloat16" or bf16_mode_sums_in_float32())
    assert 0 < probe.read_bytes_per_s < math.inf
    assert probe.probe_s > 0
    assert probe.threads == torch.get_num_threads() and probe.cores >= 1 and probe.cpu
    assert probe.fastest_dtype() in expected


def test_the_prompt_attention_is_timed_in_each_precision_its_build_multiplies_natively():
    from kernels.cpu import native_attention
    probe = probe_machine(SHORT)
    if not native_attention.available():
        assert probe.attention_flop_s == {}
        return
    native = native_attention.rows_attention_bf16_native()
    integers = native_attention.rows_attention_int8_native()
    assert set(probe.attention_flop_s) == {"float32"} | ({"bfloat16"} if native else set()) | (
        {"int8"} if integers else set())
    assert all(0 < rate < math.inf for rate in probe.attention_flop_s.values())


def test_the_decode_matmul_is_timed_for_one_row_and_eight_in_each_precision_its_build_multiplies_natively():
    from kernels.cpu import quant_matmul
    probe = probe_machine(SHORT)
    if not quant_matmul.available():
        assert probe.decode_flop_s == {}
        return
    assert set(probe.decode_flop_s) == {"float32"} | ({"bfloat16"} if quant_matmul.bf16_native() else set())
    for rates in probe.decode_flop_s.values():
        assert set(rates) == {"1", "8"} and all(0 < rate < math.inf for rate in rates.values())


def test_runs_compared_with_each_other_are_timed_in_turn_and_each_keeps_its_fastest():
    calls = []
    seconds = fastest_each({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, budget_s=60.0)
    assert calls[:4] == ["a", "b", "a", "b"] and len(calls) % 2 == 0 and len(calls) > 2
    assert all(0 <= s < math.inf for s in seconds.values()) and set(seconds) == {"a", "b"}
    calls.clear()
    fastest_each({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, budget_s=0.0)
    assert calls == ["a", "b", "a", "b"]   # a spent budget still times one round after the untimed one


def test_panels_are_timed_against_blocks_for_one_row_and_eight_where_the_bfloat16_kernels_are_native():
    probe = probe_machine(SHORT)
    assert bool(probe.int8_speedup) == int8_probed()
    if not panels_probed():
        assert probe.panels_speedup == probe.codes_speedup == {}
        return
    for speedups in (probe.panels_speedup, probe.codes_speedup, *([probe.int8_speedup] if int8_probed() else [])):
        assert set(speedups) == {"1", "8"}
        assert all(0 < speedup < math.inf for speedup in speedups.values())


@pytest.mark.parametrize("rates", ["attention_flop_s", "decode_flop_s", "panels_speedup", "codes_speedup",
                                   "int8_speedup"])
def test_a_cached_entry_without_the_kernels_rates_is_probed_again(cache_dir, rates):
    first = cached_probe(budget_s=SHORT)
    if not getattr(first, rates):
        pytest.skip("no C compiler for the kernels: nothing of them to time")
    stored = json.loads(cache_path().read_text())
    del stored[first.key][rates]   # as the previous versions of the file wrote it
    cache_path().write_text(json.dumps(stored))
    again = cached_probe(budget_s=SHORT)
    assert not again.from_cache and set(getattr(again, rates)) == set(getattr(first, rates))


def test_the_cache_is_reused_until_reprobe(cache_dir):
    first = cached_probe(budget_s=SHORT)
    assert not first.from_cache
    assert cache_path() == cache_dir / "machine-probe.json"
    assert list(json.loads(cache_path().read_text())) == [first.key]
    again = cached_probe(budget_s=SHORT)
    assert again.from_cache and again == first
    fresh = cached_probe(reprobe=True, budget_s=SHORT)
    assert not fresh.from_cache
    stored = json.loads(cache_path().read_text())
    assert list(stored) == [fresh.key] and MachineProbe.from_json(stored[fresh.key]) == fresh


def test_the_cache_keeps_other_machines_and_the_key_names_cpu_flags_cores_threads_and_torch(cache_dir):
    other = probe_machine(SHORT).to_json() | {"cpu": "another CPU"}
    cache_path().write_text(json.dumps({"another CPU | 2 cores | 1 threads | torch 0": other}))
    probe = cached_probe(budget_s=SHORT)
    assert not probe.from_cache
    assert set(json.loads(cache_path().read_text())) == {"another CPU | 2 cores | 1 threads | torch 0", probe.key}
    for part in (probe.cpu, " ".join(probe.flags) or "no avx2", f"{probe.cores} cores", f"{probe.threads} threads",
                 torch.__version__):
        assert part in probe.key


def test_an_unreadable_cache_is_probed_again_and_rewritten(cache_dir):
    cache_path().write_text("{not json")
    probe = cached_probe(budget_s=SHORT)
    assert not probe.from_cache
    assert list(json.loads(cache_path().read_text())) == [probe.key]


def test_an_entry_without_a_path_this_machine_times_is_probed_again(cache_dir):
    """An entry written before a path existed (swarm's bfloat16 kernel) would never offer it to dtype auto."""
    first = cached_probe(budget_s=SHORT).to_json()
    del first["matmul_flop_s"]["float32"]
    cache_path().write_text(json.dumps({first["key"]: first}))
    again = cached_probe(budget_s=SHORT)
    assert not again.from_cache and "float32" in again.matmul_flop_s
