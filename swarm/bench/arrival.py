"""`swarm bench-arrival`: what a newcomer's prompt costs the agents that are already decoding.

    agents 1..N:  [ trunk: T ids ][ suffix i: S ids ] decoding, a token a step ..............
    newcomer:           arrives after `warm_steps` steps: [ the same trunk ][ its own P ids ]
    gap:          the longest wall time between two tokens of a running agent, from the step before
                  the newcomer arrives until its prompt has KV
    alone:        the newcomer's whole prefill with nothing else running (trunk cached, as in the run)

Two schedules take turns on one engine, `repeats` times each:
    mixed:  prompt chunks of at most `chunk` tokens (the decode rows included) beside the decode rows
    whole:  the newcomer's prompt in one step (the budget is the whole prompt), as a prefill-first
            scheduler runs it: the agents wait for all of it
Each measurement uses fresh random ids for the newcomer, so none of its prompt is cached.
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine import DEFAULT_MODEL, LLM, SamplingParams, cpu_model_name
from swarm.bench.runner import raise_errors, swarm_version
from swarm.bench.workload import BenchError, Workload, agreement, make_workload

MODES = ("mixed", "whole")
BLOCK_SIZE = 16
MAX_STEPS_AFTER_PREFILL = 2   # steps run after the newcomer's first token, so the gap it caused is seen
TARGET_GAP_SHARE = 0.30       # issue 19: the longest gap at most 30% of the newcomer's prefill alone


@dataclass(slots=True)
class ArrivalBenchOptions:
    model: str = DEFAULT_MODEL
    agents: int = 8
    trunk: int = 2048
    suffix: int = 64
    prompt: int = 2000
    chunk: int = 256
    warm_steps: int = 4
    repeats: int = 1
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0

    @property
    def max_agent_tokens(self) -> int:
        """Decode steps an agent can run: the warm-up, the newcomer's chunks (each at least a block), a margin."""
        return self.warm_steps + -(-self.prompt // BLOCK_SIZE) + MAX_STEPS_AFTER_PREFILL + 2

    @property
    def kv_tokens(self) -> int:
        agents = self.agents * (self.suffix + self.max_agent_tokens + 2 * BLOCK_SIZE)
        return self.trunk + agents + 2 * (self.prompt + 2 * BLOCK_SIZE)


@dataclass(slots=True)
class ArrivalRun:
    """One schedule's run: seconds."""

    longest_gap_s: float              # the longest wait of a running agent between two tokens
    steady_step_s: float              # median decode step before the newcomer arrived
    newcomer_prefill_s: float         # its arrival to its first token, beside the agents
    alone_prefill_s: float            # the same size of prompt, alone
    steps_to_prefill: int             # steps that carried the newcomer's prompt
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def gap_share(self) -> float:
        return self.longest_gap_s / self.alone_prefill_s

    def to_json(self) -> dict:
        return {"longest_gap_s": self.longest_gap_s, "steady_step_s": self.steady_step_s,
                "newcomer_prefill_s": self.newcomer_prefill_s, "alone_prefill_s": self.alone_prefill_s,
                "steps_to_prefill": self.steps_to_prefill, "gap_over_alone_prefill": self.gap_share}


@dataclass(slots=True)
class ModeSummary:
    mode: str
    runs: list[ArrivalRun]

    def median(self, name: str) -> float:
        return statistics.median(getattr(run, name) for run in self.runs)

    def to_json(self) -> dict:
        names = ("longest_gap_s", "steady_step_s", "newcomer_prefill_s", "alone_prefill_s", "gap_share")
        return {"median": {name: self.median(name) for name in names}, "runs": [r.to_json() for r in self.runs]}


@dataclass(slots=True)
class ArrivalBenchReport:
    options: ArrivalBenchOptions
    device: str
    dtype: str
    threads: int
    cpu: str
    versions: dict[str, str]
    modes: dict[str, ModeSummary]
    matches: float | None             # share of agents whose greedy tokens agree between the schedules

    @property
    def meets_target(self) -> bool:
        return self.modes["mixed"].median("gap_share") <= TARGET_GAP_SHARE

    def to_json(self) -> dict:
        o = self.options
        return {"schema_version": 1, "model": o.model, "device": self.device, "dtype": self.dtype,
                "threads": self.threads, "cpu": self.cpu, "versions": dict(self.versions),
                "arrival": {"agents": o.agents, "trunk": o.trunk, "suffix": o.suffix, "prompt": o.prompt,
                            "chunk": o.chunk, "warm_steps": o.warm_steps, "repeats": o.repeats, "seed": o.seed,
                            "modes": {name: summary.to_json() for name, summary in self.modes.items()},
                            "matches": self.matches, "target_gap_share": TARGET_GAP_SHARE,
                            "meets_target": self.meets_target}}


Progress = Callable[[str], None]


def run_arrival_bench(options: ArrivalBenchOptions, progress: Progress = lambda _: None) -> ArrivalBenchReport:
    _check(options)
    progress("loading swarm")
    llm = LLM(options.model, device=options.device, dtype=options.dtype, block_size=BLOCK_SIZE,
              kv_budget_tokens=options.kv_tokens, max_num_batched_tokens=max(2048, options.prompt + options.agents),
              mixed_step_tokens=options.chunk)
    engine = llm.engine
    workload = make_workload(options.agents, options.trunk, options.suffix, 1, llm.config.vocab_size,
                             f"{options.seed}/agents")
    progress("warming up")
    _run_once(engine, options, workload, "mixed", f"{options.seed}/warm-up")
    runs: dict[str, list[ArrivalRun]] = {mode: [] for mode in MODES}
    for repeat in range(options.repeats):
        for mode in (MODES if repeat % 2 == 0 else MODES[::-1]):
            progress(f"{mode} {repeat + 1}/{options.repeats}")
            runs[mode].append(_run_once(engine, options, workload, mode, f"{options.seed}/{mode}/{repeat}"))
    versions = {"python": platform.python_version(), "torch": torch.__version__, "swarm": swarm_version()}
    matches = _common_agreement(runs["mixed"][0].outputs, runs["whole"][0].outputs)
    return ArrivalBenchReport(options, str(engine.device), str(engine.dtype).removeprefix("torch."),
                              torch.get_num_threads(), cpu_model_name(), versions,
                              {mode: ModeSummary(mode, r) for mode, r in runs.items()}, matches)


def _run_once(engine, options: ArrivalBenchOptions, workload: Workload, mode: str, seed: str) -> ArrivalRun:
    beside, alone = (workload.trunk + _fresh_ids(engine, options.prompt, f"{seed}/{which}")
                     for which in ("beside", "alone"))
    engine.use_mixed_step_tokens(options.chunk if mode == "mixed" else options.prompt + options.agents)
    try:
        run = _beside_agents(engine, options, workload.prompts, beside)
    finally:
        engine.use_mixed_step_tokens(options.chunk)
    run.alone_prefill_s = _prefill_alone(engine, alone)
    return run


def _fresh_ids(engine, count: int, seed: str) -> list[int]:
    """Ids no cache has seen: the newcomer's own prompt after the trunk."""
    return make_workload(1, count, 1, 1, engine.config.vocab_size, seed).trunk


def _beside_agents(engine, options: ArrivalBenchOptions, prompts, newcomer_ids) -> ArrivalRun:
    params = SamplingParams(max_tokens=options.max_agent_tokens, ignore_eos=True)
    agents = [engine.add_request(p, params) for p in prompts]
    trace, newcomer = Trace({seq.seq_id: [] for seq in agents}), None
    try:
        while not trace.done:
            if newcomer is None and trace.steady(options.warm_steps):
                newcomer = engine.add_request(newcomer_ids, SamplingParams(max_tokens=1, ignore_eos=True))
                trace.arrive(newcomer.seq_id)
            trace.step(engine)
        return trace.summary([seq.output_token_ids for seq in agents])
    finally:
        for seq in agents + ([newcomer] if newcomer else []):
            engine.release(seq)


@dataclass(slots=True)
class Trace:
    """When each agent got each token, and when the newcomer arrived and got its first."""

    stamps: dict[int, list[float]]
    steps: list[tuple[float, float]] = field(default_factory=list)   # (end, length) of every step
    arrived: float | None = None
    newcomer_id: int | None = None
    first_token_at: float | None = None
    steps_after: int = 0

    @property
    def done(self) -> bool:
        return self.first_token_at is not None and self.steps_after >= MAX_STEPS_AFTER_PREFILL

    def steady(self, warm_steps: int) -> bool:
        return len(self.steps) >= warm_steps and all(self.stamps.values())

    def arrive(self, seq_id: int) -> None:
        self.arrived, self.newcomer_id = time.perf_counter(), seq_id

    def step(self, engine) -> None:
        began = time.perf_counter()
        result = engine.step()
        ended = time.perf_counter()
        raise_errors(result.finished)
        self.steps.append((ended, ended - began))
        if self.first_token_at is not None:
            self.steps_after += 1
        for seq, _ in result.new_tokens:
            if seq.seq_id == self.newcomer_id:
                self.first_token_at = ended
            elif seq.seq_id in self.stamps:
                self.stamps[seq.seq_id].append(ended)

    def summary(self, outputs: list[list[int]]) -> ArrivalRun:
        gaps = [later - earlier for times in self.stamps.values() for earlier, later in zip(times, times[1:])
                if later > self.arrived]
        before = [length for ended, length in self.steps if ended < self.arrived]
        beside = sum(1 for ended, _ in self.steps if self.arrived < ended <= self.first_token_at)
        return ArrivalRun(max(gaps), statistics.median(before), self.first_token_at - self.arrived, 0.0, beside,
                          outputs)


def _prefill_alone(engine, prompt: list[int]) -> float:
    began = time.perf_counter()
    seq = engine.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    try:
        while not seq.is_finished:
            raise_errors(engine.step().finished)
        return time.perf_counter() - began
    finally:
        engine.release(seq)


def _common_agreement(outputs: list[list[int]], reference: list[list[int]]) -> float | None:
    """`agreement` over the tokens both runs have: the agents stop when the newcomer is done, which
    takes each schedule a different number of steps."""
    lengths = [min(len(a), len(b)) for a, b in zip(outputs, reference)]
    return agreement([a[:n] for a, n in zip(outputs, lengths)], [b[:n] for b, n in zip(reference, lengths)])


def _check(options: ArrivalBenchOptions) -> None:
    for name, value in (("--agents", options.agents), ("--trunk", options.trunk), ("--suffix", options.suffix),
                        ("--prompt", options.prompt), ("--repeats", options.repeats)):
        if value < 1:
            raise BenchError(f"{name} must be at least 1")
    if options.chunk <= options.agents:
        raise BenchError(f"--chunk must be larger than --agents ({options.agents}): a mixed step's budget counts "
                         f"the decode rows too")
