"""llama.cpp as a `swarm bench` peer, through llama-cpp-python's low-level API, using
llama.cpp's own recipe for a shared prompt:

    seq 0:      decode the trunk once                 [ trunk T ]
    seq 1..N-1: llama_memory_seq_cp(0 -> i)           the same cells, tagged with one more
                                                      sequence (a unified KV cache)
    all seqs:   decode every suffix in one batch,     [ trunk T ][ suffix i ]
                then one token per sequence a step    [ trunk T ][ suffix i ][ new ]

KV held is counted in cells: the trunk's T cells once, plus each sequence's own cells, at
the cache's type (f16) for the model's layers, KV heads and head size.

llama.cpp runs as it ships, with its CPU "extra buffer types" (weights repacked for AMX and the
like) on; the bench turns them off (its plain CPU path) only in a worker started after the default
one crashed (swarm/bench/fallback.py). For tests, CRASH_HOOK=k in the environment makes a runner
with them on kill itself with SIGSEGV at its k-th run, as the AMX path does on some machines.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import signal

import numpy as np
import torch

from engine import ModelConfig, ModelSource
from swarm.bench.peers import PeerUnavailable
from swarm.bench.workload import Measurement, Stopwatch, Workload

N_BATCH = 2048
CRASH_HOOK = "SWARM_BENCH_TEST_CRASH_EXTRA_BUFFER_TYPES"
_silent_log = None   # the ctypes callback that drops llama.cpp's log lines, made once


class LlamaCppRunner:
    name = "llamacpp"

    def __init__(self, source: ModelSource, config: ModelConfig, device, max_kv_tokens: int, max_seqs: int,
                 extra_buffer_types: bool = True):
        if importlib.util.find_spec("llama_cpp") is None:
            raise PeerUnavailable("not installed (pip install llama-cpp-python)")
        if source.kind != "gguf":
            raise PeerUnavailable("llama.cpp reads .gguf files; this model is a Hugging Face folder")
        try:
            import llama_cpp
        except (ImportError, OSError, RuntimeError) as err:
            raise PeerUnavailable(f"llama-cpp-python is installed but does not load: {err}") from None
        self.lc = llama_cpp
        self.version = llama_cpp.__version__
        self.bytes_per_cell = config.kv_bytes_per_token("float16")   # the context's cache type: llama.cpp's default
        self.extra_buffer_types = extra_buffer_types
        self.runs = 0
        self._silence()
        llama_cpp.llama_backend_init()
        self.model = self._load_model(source, device)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.ctx = self._new_context(max_kv_tokens, max_seqs)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(N_BATCH, 0, 1)

    def run(self, workload: Workload) -> Measurement:
        lc, n = self.lc, workload.agents
        lc.llama_memory_clear(self.memory, True)
        self._crash_if_asked()
        watch = Stopwatch()
        self._decode([(token, pos, 0, False) for pos, token in enumerate(workload.trunk)])
        for seq in range(1, n):
            lc.llama_memory_seq_cp(self.memory, 0, seq, -1, -1)
        start = workload.trunk_tokens
        suffixes = [(token, start + pos, seq, pos == len(suffix) - 1)
                    for seq, suffix in enumerate(workload.suffixes) for pos, token in enumerate(suffix)]
        tokens = self._decode(suffixes)
        ttft = watch.elapsed()
        outputs = [[t] for t in tokens]
        position = start + workload.suffix_tokens
        for step in range(workload.new_tokens - 1):
            tokens = self._decode([(tokens[seq], position + step, seq, True) for seq in range(n)])
            for seq, token in enumerate(tokens):
                outputs[seq].append(token)
        wall = watch.elapsed()
        cells = start + sum(lc.llama_memory_seq_pos_max(self.memory, seq) + 1 - start for seq in range(n))
        return Measurement(cells * self.bytes_per_cell, self.bytes_per_cell, start + n * workload.suffix_tokens,
                           ttft, n * (workload.new_tokens - 1), wall - ttft, wall, outputs)

    def _crash_if_asked(self) -> None:
        self.runs += 1
        if self.extra_buffer_types and str(self.runs) == os.environ.get(CRASH_HOOK):
            os.kill(os.getpid(), signal.SIGSEGV)

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> list[int]:
        """Decode (token, position, sequence, wants logits) entries in batches of N_BATCH;
        returns the greedy next token of every entry that wanted logits, in order."""
        chosen = []
        for begin in range(0, len(entries), N_BATCH):
            chunk = entries[begin:begin + N_BATCH]
            self._fill(chunk)
            code = self.lc.llama_decode(self.ctx, self.batch)
            if code != 0:
                raise RuntimeError(f"llama_decode returned {code} (1: no room in its KV cache)")
            outputs = sum(1 for entry in chunk if entry[3])
            if outputs:
                logits = np.ctypeslib.as_array(self.lc.llama_get_logits(self.ctx), shape=(outputs, self.n_vocab))
                chosen += logits.argmax(axis=1).tolist()
        return chosen

    def _fill(self, chunk) -> None:
        batch = self.batch
        batch.n_tokens = len(chunk)
        for i, (token, pos, seq, wants_logits) in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = wants_logits

    def _load_model(self, source: ModelSource, device):
        params = self.lc.llama_model_default_params()
        params.n_gpu_layers = 999 if getattr(device, "type", "cpu") == "cuda" else 0
        params.use_extra_bufts = self.extra_buffer_types
        model = self.lc.llama_model_load_from_file(str(source.path).encode(), params)
        if not model:
            raise PeerUnavailable(f"llama.cpp could not load {source.path.name}")
        return model

    def _new_context(self, max_kv_tokens: int, max_seqs: int):
        params = self.lc.llama_context_default_params()
        params.n_ctx = max_kv_tokens
        params.n_batch = N_BATCH
        params.n_seq_max = max_seqs
        params.n_threads = params.n_threads_batch = torch.get_num_threads()  # the same cores as swarm's
        params.kv_unified = True  # one cache for all sequences, so seq_cp shares cells instead of copying
        ctx = self.lc.llama_init_from_model(self.model, params)
        if not ctx:
            raise PeerUnavailable(f"llama.cpp could not make a context of {max_kv_tokens} tokens")
        return ctx

    def _silence(self) -> None:
        """llama.cpp logs every load to stderr; the progress bar owns the terminal. The callback lives as long
        as the process: llama.cpp keeps calling it after this runner is gone (a freed one segfaults)."""
        global _silent_log
        if _silent_log is None:
            _silent_log = self.lc.llama_log_callback(lambda level, text, data: None)
        self.lc.llama_log_set(_silent_log, ctypes.c_void_p())
