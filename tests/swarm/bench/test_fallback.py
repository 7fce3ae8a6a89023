"""swarm/bench/fallback.py: llama.cpp in real worker processes, on a tiny random GGUF, made to crash on
its default path by llamacpp.CRASH_HOOK (a SIGSEGV at its k-th run, as its AMX path does on some
machines); it is then measured again on its plain CPU path, and the bench says so in its rows."""
import os
import signal

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from engine.loading.loader import load_model_config, resolve_model
from swarm.bench.chart import _kv_panel, _wall_panel
from swarm.bench.fallback import PlainPathFallback
from swarm.bench.llamacpp import CRASH_HOOK, LlamaCppRunner
from swarm.bench.process import PeerSpec, WorkerCrashed
from swarm.bench.runner import run_bench
from swarm.bench.workload import BenchOptions, make_workload
from tests.helpers.tiny_gguf import tiny_model, write_model

pytest.importorskip("llama_cpp")
TOKENIZER = {"tokenizer.ggml.model": ("gpt2", V.STRING),
             "tokenizer.ggml.tokens": (["t", "0", *(f"t{i}" for i in range(510))], V.ARRAY),
             "tokenizer.ggml.merges": (["t 0"], V.ARRAY)}   # llama.cpp's loader wants merges
PLAIN = "plain CPU path: its default path crashed, exit code -11"
WORKLOAD = make_workload(agents=3, trunk=20, suffix=4, new_tokens=5, vocab_size=512, seed="fallback")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("llamacpp") / "tiny.gguf"
    return resolve_model(str(write_model(path, tiny_model("llama"), Q.F32, extra=TOKENIZER)))


def spec(source) -> PeerSpec:
    return PeerSpec("llamacpp", source, load_model_config(source), "cpu", "float32", max_kv_tokens=256, max_seqs=4)


def here(source, extra_buffer_types: bool):
    """The same run by llama.cpp in this process."""
    runner = LlamaCppRunner(source, load_model_config(source), torch.device("cpu"), 256, 4, extra_buffer_types)
    return runner.run(WORKLOAD)


def assert_reaped(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_llamacpp_runs_as_it_ships_while_its_worker_does_not_crash(tiny_gguf):
    peer = PlainPathFallback(spec(tiny_gguf))
    try:
        measured = peer.run(WORKLOAD)
    finally:
        peer.close()
    assert peer.note == ""
    assert measured.outputs == here(tiny_gguf, extra_buffer_types=True).outputs


def test_a_crash_on_the_default_path_is_measured_again_on_the_plain_path_which_stays(tiny_gguf, monkeypatch):
    monkeypatch.setenv(CRASH_HOOK, "1")
    peer = PlainPathFallback(spec(tiny_gguf))
    default = peer.pid
    try:
        measured, again = peer.run(WORKLOAD), peer.run(WORKLOAD)
        plain = peer.pid
    finally:
        peer.close()
    assert peer.note == PLAIN and plain != default
    assert measured.outputs == again.outputs == here(tiny_gguf, extra_buffer_types=False).outputs
    assert_reaped(default)
    assert_reaped(plain)


def test_a_crash_on_the_plain_path_too_is_that_run_s_error(tiny_gguf, monkeypatch):
    monkeypatch.setenv(CRASH_HOOK, "1")
    peer = PlainPathFallback(spec(tiny_gguf))
    try:
        peer.run(WORKLOAD)
        os.kill(peer.pid, signal.SIGSEGV)
        with pytest.raises(WorkerCrashed, match=r"llama\.cpp worker process ended \(exit code -11\)"):
            peer.run(WORKLOAD)
    finally:
        peer.close()
    assert peer.note == PLAIN


def test_a_python_error_in_the_worker_is_no_crash_and_keeps_the_default_path(tiny_gguf):
    peer = PlainPathFallback(spec(tiny_gguf))
    default = peer.pid
    too_many = make_workload(agents=5, trunk=20, suffix=4, new_tokens=5, vocab_size=512, seed="five")   # max_seqs 4
    try:
        with pytest.raises(RuntimeError, match="llama_decode returned") as raised:
            peer.run(too_many)
        assert not isinstance(raised.value, WorkerCrashed)
        assert peer.run(WORKLOAD).outputs and peer.pid == default and peer.note == ""
    finally:
        peer.close()


def test_the_bench_labels_the_rows_measured_on_the_plain_path(tiny_gguf, tmp_path, monkeypatch):
    # runs of the default worker: the warm-up, N=1 quiet, N=1 beside a busy process, N=2 quiet, N=2 busy (crashes)
    monkeypatch.setenv(CRASH_HOOK, "5")
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))   # the machine probe's cache: a fresh one, not the user's
    options = BenchOptions(str(tiny_gguf.path), agents=(1, 2), trunks=(40,), suffix=5, new_tokens=4,
                           peers=("llamacpp",), busy=1)
    report = run_bench(options)
    one, two = ({name: system for name, system in config.to_json()["systems"].items()} for config in report.configs)
    assert (one["llamacpp"]["label"], two["llamacpp"]["label"]) == ("llama.cpp", f"llama.cpp ({PLAIN})")
    for row in (one, two):
        assert row["llamacpp"]["status"] == "ok" and row["llamacpp"]["busy"]["status"] == "ok"
        assert row["llamacpp"]["busy"]["matches_quiet"] == 1.0
        assert row["swarm"]["label"] == "swarm (sharing)"

    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for panel in (_wall_panel, lambda axes, configs: _kv_panel(axes, configs, 40)):   # time and memory alike
        figure, axes = plt.subplots()
        panel(axes, report.configs)
        systems = [label for label in axes.get_legend_handles_labels()[1] if label != "machine floor"]
        assert systems == ["swarm (sharing)", "swarm (no sharing)", f"llama.cpp / llama.cpp ({PLAIN})"]
        plt.close(figure)
