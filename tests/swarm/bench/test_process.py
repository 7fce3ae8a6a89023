"""`swarm bench`'s peers in worker processes of their own: real spawned processes, checked against
the same runner in this process."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from engine.loading.loader import load_model_config, resolve_model
from swarm.bench.peers import HFRunner, PeerUnavailable
from swarm.bench.process import PeerProcess, PeerSpec
from swarm.bench.workload import make_workload
from tests.helpers.processes import wait_for
from tests.helpers.tiny_models import make_tiny_model

pytest.importorskip("transformers")
ROOT = Path(__file__).parents[3]
HANG_GUARD_S = 300   # seconds; reaching it means a hang, never a slow machine


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return resolve_model(str(make_tiny_model(tmp_path_factory.mktemp("peer") / "llama", "llama")))


def spec(source, name="hf"):
    return PeerSpec(name, source, load_model_config(source), "cpu", "float32", max_kv_tokens=256, max_seqs=4)


def test_a_peer_runs_in_its_own_process_and_measures_what_it_would_here(tiny_source):
    workload = make_workload(agents=3, trunk=20, suffix=4, new_tokens=5, vocab_size=256, seed="peer")
    peer = PeerProcess(spec(tiny_source))
    try:
        assert peer.pid not in (None, os.getpid())
        assert peer.version == HFRunner(tiny_source, torch.device("cpu"), "float32").version
        measured = peer.run(workload)
    finally:
        peer.close()
    here = HFRunner(tiny_source, torch.device("cpu"), "float32").run(workload)
    assert measured.outputs == here.outputs
    assert (measured.kv_bytes_peak, measured.prompt_tokens_computed) == (here.kv_bytes_peak,
                                                                         here.prompt_tokens_computed)
    with pytest.raises(ProcessLookupError):   # closed: the worker has exited and been reaped
        os.kill(peer.pid, 0)


def test_a_peer_that_cannot_read_the_model_says_why_from_its_process(tiny_source):
    with pytest.raises(PeerUnavailable, match=r"\.gguf|pip install llama-cpp-python"):
        PeerProcess(spec(tiny_source, "llamacpp"))


def test_a_worker_that_dies_is_an_error_for_that_run_not_a_hang(tiny_source):
    workload = make_workload(agents=2, trunk=10, suffix=2, new_tokens=2, vocab_size=256, seed="dies")
    peer = PeerProcess(spec(tiny_source))
    try:
        os.kill(peer.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="transformers worker process ended"):
            peer.run(workload)
    finally:
        peer.close()


def test_ctrl_c_is_left_to_the_bench_and_a_busy_worker_is_stopped_at_once(tiny_source):
    peer = PeerProcess(spec(tiny_source))
    errors = []

    def run_long():
        long = make_workload(agents=4, trunk=200, suffix=8, new_tokens=1800, vocab_size=256, seed="long")
        try:
            peer.run(long)
        except RuntimeError as err:
            errors.append(str(err))

    running = threading.Thread(target=run_long, daemon=True)
    try:
        os.kill(peer.pid, signal.SIGINT)   # the terminal sends it to the whole process group
        small = make_workload(agents=2, trunk=10, suffix=2, new_tokens=2, vocab_size=256, seed="int")
        assert peer.run(small).outputs   # the worker ignored it
        running.start()
        assert wait_for(lambda: peer.busy, HANG_GUARD_S), "the long workload was never sent"
    finally:
        started = time.monotonic()
        peer.close()
    # waiting for the worker would take the rest of the workload or CLOSE_TIMEOUT_S (30 s)
    assert time.monotonic() - started < 10
    running.join(HANG_GUARD_S)
    assert not running.is_alive() and errors and "worker process ended" in errors[0]   # cut off mid-run
    with pytest.raises(ProcessLookupError):
        os.kill(peer.pid, 0)


# The bench runs under a child subreaper, so its orphaned worker becomes the subreaper's child:
# os.wait() then returns at the worker's actual exit, with its exit code. (The stdout and stderr
# pipes closing is no such signal: an exiting process closes its files before it is a zombie.)
BENCH_GONE = """
import os
from engine.loading.loader import load_model_config, resolve_model
from swarm.bench.process import PeerProcess, PeerSpec
source = resolve_model({path!r})
peer = PeerProcess(PeerSpec("hf", source, load_model_config(source), "cpu", "float32", 256, 4))
print(peer.pid, flush=True)
os._exit(0)   # gone without closing it, as after a crash
"""
REAPER = """
import ctypes, os, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
subprocess.run([sys.executable, "-c", sys.argv[1]], check=True)
pid, status = os.wait()   # the only child left: the worker
print(pid, os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a child subreaper is Linux's")
def test_a_worker_whose_bench_is_gone_ends_quietly(tiny_source):
    bench = BENCH_GONE.format(path=str(tiny_source.path))
    done = subprocess.run([sys.executable, "-c", REAPER, bench], capture_output=True, text=True,
                          timeout=HANG_GUARD_S, cwd=ROOT)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    worker, (reaped, exit_code) = lines[0], lines[-1].split()
    assert (reaped, exit_code) == (worker, "0"), done.stdout   # it exited, by itself and cleanly

