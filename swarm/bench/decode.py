"""`swarm bench-decode`: one decode step with cascade attention against plain paged attention,
on one engine and the same KV, the two taking turns step by step so that their ratio holds on
a noisy machine.

    agent i:  [ trunk: T ids, shared blocks ][ suffix i: S ids ][ g generated ]
    plain:    each row reads its whole context       N × (T + S + g) tokens of KV a step
    cascade:  the trunk once, then each row its own  T + N × (S + g)

Per trunk length the N prompts are prefilled once and kept. Two decode rounds then start from
them (each prompt's last token recomputed, so both rounds begin alike): round one runs cascade
on its 1st, 3rd, ... decode steps and plain on the others, round two the other way round. Each
mode is timed on `steps` steps; the two rounds' greedy tokens agree only if both modes picked
the same token at every step. Their first decode steps run on identical state, so those
logits show how far apart the two modes' arithmetic lies.
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from engine import DEFAULT_MODEL, LLM, MIN_PREFIX_TOKENS, SamplingParams
from swarm.bench.runner import raise_errors, swarm_version
from swarm.bench.workload import BenchError, Workload, agreement, make_workload

MODES = ("cascade", "plain")
BLOCK_SIZE = 16
WARM_UP_TRUNK = 128


@dataclass(slots=True)
class DecodeBenchOptions:
    model: str = DEFAULT_MODEL
    agents: int = 8
    trunks: tuple[int, ...] = (2048, 4096, 8192)
    suffix: int = 64
    steps: int = 16
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0

    @property
    def kv_tokens(self) -> int:
        """The largest trunk once, every suffix, and per agent two rounds of decode blocks,
        each round with a copy of the prompt's last block."""
        return max(self.trunks) + self.agents * (self.suffix + 2 * (self.steps + 3 * BLOCK_SIZE))


@dataclass(slots=True)
class ModeResult:
    step_s: list[float]              # every timed decode step, in the order run
    attention_bytes: int             # KV bytes the step's attention reads (theory), mean over steps

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)

    def to_json(self) -> dict:
        return {"median_step_s": self.median_s, "step_s": list(self.step_s),
                "attention_bytes_per_step": self.attention_bytes}


@dataclass(slots=True)
class TrunkResult:
    trunk: int
    shared_tokens: int               # trunk tokens in whole shared blocks: what cascade reads once
    mean_context: float              # tokens in each row's context, mean over the timed steps
    modes: dict[str, ModeResult]
    matches: float | None            # share of agents whose greedy tokens agree between the rounds
    first_step_logit_diff: float     # max |cascade - plain| over the logits of the first decode step

    @property
    def speedup(self) -> float:
        return self.modes["plain"].median_s / self.modes["cascade"].median_s

    @property
    def bytes_ratio(self) -> float:
        return self.modes["plain"].attention_bytes / self.modes["cascade"].attention_bytes

    def to_json(self) -> dict:
        return {"trunk": self.trunk, "shared_tokens": self.shared_tokens, "mean_context": self.mean_context,
                **{mode: result.to_json() for mode, result in self.modes.items()},
                "speedup": self.speedup, "bytes_ratio": self.bytes_ratio, "matches": self.matches,
                "first_step_logit_diff": self.first_step_logit_diff}


@dataclass(slots=True)
class DecodeBenchReport:
    options: DecodeBenchOptions
    device: str
    dtype: str
    threads: int
    bytes_per_token: int
    max_context: int                 # the model's context; positions past it cost the same, mean little
    versions: dict[str, str]
    trunks: list[TrunkResult]

    def past_context(self) -> list[int]:
        """Trunks whose last decode step runs past the model's context."""
        o = self.options
        return [t.trunk for t in self.trunks if t.trunk + o.suffix + o.steps + 1 > self.max_context]

    def to_json(self) -> dict:
        o = self.options
        return {"schema_version": 1, "model": o.model, "device": self.device, "dtype": self.dtype,
                "threads": self.threads, "versions": dict(self.versions),
                "decode_steps": {"agents": o.agents, "suffix": o.suffix, "steps": o.steps, "seed": o.seed,
                                 "block_size": BLOCK_SIZE, "bytes_per_token": self.bytes_per_token,
                                 "max_context": self.max_context,
                                 "trunks": [t.to_json() for t in self.trunks]}}


def attention_bytes(mode: str, agents: int, shared_tokens: int, context: float, bytes_per_token: int) -> int:
    """KV bytes one decode step's attention reads, every row holding `context` tokens."""
    if mode == "plain":
        return round(agents * context * bytes_per_token)
    return round((shared_tokens + agents * (context - shared_tokens)) * bytes_per_token)


Progress = Callable[[str], None]


def run_decode_bench(options: DecodeBenchOptions, progress: Progress = lambda _: None) -> DecodeBenchReport:
    _check(options)
    progress("loading swarm")
    llm = LLM(options.model, device=options.device, dtype=options.dtype, block_size=BLOCK_SIZE,
              kv_budget_tokens=options.kv_tokens, enable_prefix_caching=True, cascade_attention=True)
    progress("warming up")
    _measure_trunk(llm, options, min(WARM_UP_TRUNK, *options.trunks), 2, seed="warm-up")
    results = []
    for trunk in options.trunks:
        progress(f"N={options.agents} T={trunk}")
        results.append(_measure_trunk(llm, options, trunk, options.steps, seed=f"{options.seed}/{trunk}"))
    engine = llm.engine
    versions = {"python": platform.python_version(), "torch": torch.__version__, "swarm": swarm_version()}
    return DecodeBenchReport(options, str(engine.device), str(engine.dtype).removeprefix("torch."),
                             torch.get_num_threads(), engine.kv_bytes_per_token,
                             llm.config.max_position_embeddings, versions, results)


def _measure_trunk(llm: LLM, options: DecodeBenchOptions, trunk: int, steps: int, seed: str) -> TrunkResult:
    engine = llm.engine
    workload = make_workload(options.agents, trunk, options.suffix, steps + 1, llm.config.vocab_size, seed)
    kept = _prefill(engine, workload)
    timings: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        (cascade_first, outputs_a), (plain_first, outputs_b) = [
            _decode_round(engine, workload, order, timings) for order in (MODES, MODES[::-1])]
    finally:
        for seq in kept:
            engine.release(seq)
    shared = trunk // BLOCK_SIZE * BLOCK_SIZE
    context = trunk + options.suffix + (steps + 1) / 2   # the step feeding generated token g sees T + S + g
    bpt = engine.kv_bytes_per_token
    modes = {mode: ModeResult(timings[mode], attention_bytes(mode, options.agents, shared, context, bpt))
             for mode in MODES}
    logit_diff = (cascade_first - plain_first).abs().max().item()
    return TrunkResult(trunk, shared, context, modes, agreement(outputs_a, outputs_b), logit_diff)


def _prefill(engine, workload: Workload) -> list:
    """Every prompt's KV, held by paused sequences until both rounds are done."""
    seqs = [engine.add_request(p, SamplingParams(max_tokens=1), prefill_only=True) for p in workload.prompts]
    try:
        while engine.has_work():
            raise_errors(engine.step().finished)
    except BaseException:
        for seq in seqs:
            engine.release(seq)
        raise
    return seqs


def _decode_round(engine, workload: Workload, order: tuple[str, str], timings: dict[str, list[float]]):
    """Each agent's greedy tokens, and the logits of the first decode step (float32)."""
    params = SamplingParams(max_tokens=workload.new_tokens, ignore_eos=True)
    seqs = [engine.add_request(p, params) for p in workload.prompts]
    decoded, first_logits = 0, None
    try:
        while engine.has_work():
            mode = order[decoded % 2]
            engine.use_cascade(mode == "cascade")
            began = time.perf_counter()
            result = engine.step()
            elapsed = time.perf_counter() - began
            raise_errors(result.finished)
            if result.decode_only:
                _check_full_batch(len(result.new_tokens), workload.agents)
                timings[mode].append(elapsed)
                first_logits = result.logits.float() if first_logits is None else first_logits
                decoded += 1
    finally:
        engine.use_cascade(True)
        for seq in seqs:
            engine.release(seq)
    return first_logits, [seq.output_token_ids for seq in seqs]


def _check_full_batch(rows: int, agents: int) -> None:
    assert rows == agents, f"a decode step ran {rows} of {agents} agents: the KV pool is too small"


def _check(options: DecodeBenchOptions) -> None:
    if options.agents < 2:
        raise BenchError("--agents must be at least 2: cascade attention reads a trunk shared by two or more")
    if not options.trunks or min(options.trunks) // BLOCK_SIZE * BLOCK_SIZE < MIN_PREFIX_TOKENS:
        raise BenchError(f"--trunk values must be at least {MIN_PREFIX_TOKENS} tokens, the shortest shared "
                         f"trunk cascade attention takes, like 2048,4096,8192")
    for name, value in (("--suffix", options.suffix), ("--steps", options.steps)):
        if value < 1:
            raise BenchError(f"{name} must be at least 1")
