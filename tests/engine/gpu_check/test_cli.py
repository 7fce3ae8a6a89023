"""`python -m engine.gpu_check` run as a user runs it, on this CPU with --allow-cpu: one JSON document
with a report per part, a part that fails or hangs stopping none of the others, and without a GPU (and
without --allow-cpu) a one-line refusal."""
import json
import os
import subprocess
import sys

import pytest
import torch

from engine.gpu_check.parts import FAIL_ENV, HANG_ENV
from tests.helpers.processes import REPO, is_running

KEYS = {"status", "seconds", "time_box_s", "details", "error"}


def gpu_check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "engine.gpu_check", *args], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    """The CPU smoke run with the graphs part made to fail: (process, its stdout's JSON, --out's JSON)."""
    out = tmp_path_factory.mktemp("gpu_check") / "check.json"
    done = gpu_check("--allow-cpu", "--quick", "--parts", "device,timings,graphs,bandwidth", "--out", str(out),
                     env={FAIL_ENV: "graphs"})
    return done, json.loads(done.stdout), json.loads(out.read_text())


def test_it_prints_one_json_document_and_writes_the_same_to_out(cpu_check):
    done, printed, written = cpu_check
    assert printed == written
    assert list(printed["parts"]) == ["device", "graphs", "timings", "bandwidth"]   # the check's order
    assert all(set(part) == KEYS for part in printed["parts"].values())
    assert printed["device"] == "cpu" and printed["quick"] is True


def test_an_injected_failure_is_reported_and_the_other_parts_still_run(cpu_check):
    done, printed, _ = cpu_check
    parts = printed["parts"]
    assert parts["graphs"]["status"] == "failed"
    assert f"injected failure ({FAIL_ENV} names graphs)" in parts["graphs"]["error"]
    assert {parts[name]["status"] for name in ("device", "timings", "bandwidth")} == {"ok"}
    assert printed["ok"] is False and done.returncode == 1


def test_the_device_part_names_the_versions_and_the_backend(cpu_check):
    details = cpu_check[1]["parts"]["device"]["details"]
    assert details["torch"] == torch.__version__
    assert details["backend"] in ("cpu", "cuda", "rocm") and details["device"] == "cpu"


def test_timings_cover_both_weight_kinds_at_one_and_eight_agents_over_the_cached_trunk(cpu_check):
    details = cpu_check[1]["parts"]["timings"]["details"]
    trunk = details["workload"]["trunk"]
    assert {case["weights"] for case in details["cases"]} == {"Q4_K", "float32"}
    for case in details["cases"]:
        assert case["trunk_prefill_tok_s"] > 0 and case["kernels"]["weights"]["total_bytes"] > 0
        assert [run["agents"] for run in case["runs"]] == [1, 8]
        for run in case["runs"]:
            assert run["cached_tokens_min"] == trunk          # the suffixes prefilled over the shared trunk
            assert run["decode_steps_timed"] == details["workload"]["decode_steps"] - 1
            assert run["decode_ms_per_step"] > 0 and run["decode_bytes_per_step"] > run["decode_kv_bytes"] > 0


def test_a_part_that_hangs_is_killed_with_its_process_at_its_time_box():
    done = gpu_check("--allow-cpu", "--parts", "device", "--budget-s", "6", env={HANG_ENV: "device"})
    part = json.loads(done.stdout)["parts"]["device"]
    assert part["status"] == "failed" and "timed out after its time box of 6 s" in part["error"]
    assert not is_running(part["details"]["pid"])


def test_bandwidth_divides_each_decode_timing_by_the_measured_peak(cpu_check):
    parts = cpu_check[1]["parts"]
    decode = parts["bandwidth"]["details"]["decode"]
    assert parts["bandwidth"]["status"] == "ok"
    assert len(decode) == sum(len(case["runs"]) for case in parts["timings"]["details"]["cases"])
    assert all(row["of_measured_peak"] > 0 and row["of_datasheet"] is None for row in decode)   # a CPU has none


def test_an_unknown_part_is_a_usage_error_naming_the_parts():
    done = gpu_check("--allow-cpu", "--parts", "device,bogus")
    assert done.returncode == 2
    assert "no part bogus; the parts are device, triton_tests, equivalence, graphs, timings, bandwidth" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    done = gpu_check("--quick")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: no GPU: ")
    assert "--allow-cpu" in done.stderr
