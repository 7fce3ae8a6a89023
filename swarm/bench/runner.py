"""`swarm bench`: the same swarm workload through swarm (sharing on and off), transformers and
llama.cpp, the systems taking turns on every configuration so that the ratios between them hold
on a noisy machine. swarm runs in this process; each peer in a worker process of its own
(swarm/bench/process.py), as its users run it.

Every model is loaded once. Each repeat of each configuration gets fresh random token ids, so
no system finds a trunk already cached from an earlier run; within one repeat, every system
gets the same ids. With `--busy K`, each measurement is taken again right after it, beside K
processes that each keep a core busy (swarm/bench/busy.py), so the two are side by side.
"""
from __future__ import annotations

import importlib.metadata
import platform
from typing import Callable, Protocol

import torch

from engine import LLM, MachineProbe, SamplingParams, SwarmError, cached_probe, pick_device, wait_settings
from swarm.bench.busy import BusyLoad
from swarm.bench.fallback import PlainPathFallback
from swarm.bench.floor import ModelShape, machine_floor
from swarm.bench.peers import PeerUnavailable
from swarm.bench.process import PeerProcess, PeerSpec
from swarm.bench.report import BenchReport, BusyResult, ConfigResult, SystemResult
from swarm.bench.workload import (
    PEERS,
    SYSTEMS,
    BenchError,
    BenchOptions,
    Measurement,
    Stopwatch,
    Workload,
    agreement,
    make_workload,
)


class Runner(Protocol):
    name: str
    version: str
    note: str   # how it runs, if not as it ships: said in its rows' label

    def run(self, workload: Workload) -> Measurement: ...


class SwarmRunner:
    """swarm's engine, stepped by hand to see each agent's first token and the KV held."""

    note = ""

    def __init__(self, options: BenchOptions, sharing: bool):
        self.name = "swarm" if sharing else "swarm_no_sharing"
        self.version = swarm_version()
        self.llm = LLM(options.model, device=options.device, dtype=options.dtype,
                       kv_budget_tokens=options.largest_kv_tokens, enable_prefix_caching=sharing,
                       cuda_graphs=options.graphs)

    def run(self, workload: Workload) -> Measurement:
        """One run from a cold prefix cache, as every peer's: a run beside busy processes repeats the quiet run's
        prompts, which would otherwise find them cached."""
        engine, params = self.llm.engine, SamplingParams(max_tokens=workload.new_tokens, ignore_eos=True)
        self.llm.reset_prefix_cache()
        computed_before = engine.prompt_tokens_computed
        watch = Stopwatch()
        seqs = [engine.add_request(p, params, request_id=str(i), keep_kv=True)
                for i, p in enumerate(workload.prompts)]
        try:
            first, peak, decode_tokens, decode_s = self._drive(watch)
        finally:
            wall = watch.elapsed()
            for seq in seqs:
                engine.release(seq)
        return Measurement(peak, engine.kv_bytes_per_token,
                           engine.prompt_tokens_computed - computed_before,
                           max(first.values()), decode_tokens, decode_s, wall,
                           [seq.output_token_ids for seq in seqs])

    def _drive(self, watch: Stopwatch):
        """Step until every agent is done: first-token times, peak KV bytes, decode-step time."""
        engine = self.llm.engine
        first, peak, decode_tokens, decode_s = {}, 0, 0, 0.0
        while engine.has_work():
            began = watch.elapsed()
            result = engine.step()
            ended = watch.elapsed()
            raise_errors(result.finished)
            for seq, _ in result.new_tokens:
                first.setdefault(seq.seq_id, ended)
            if result.decode_only:
                decode_tokens, decode_s = decode_tokens + len(result.new_tokens), decode_s + ended - began
            peak = max(peak, watch.probe(lambda: self.llm.kv_stats().used_bytes))
        return first, peak, decode_tokens, decode_s


def swarm_version() -> str:
    try:
        return importlib.metadata.version("swarm-llm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def raise_errors(finished) -> None:
    for seq in finished:
        if seq.finish_reason == "error":
            raise BenchError(f"swarm: {seq.error}")


Progress = Callable[[str, int, int], None]   # (what runs now, measurements done, measurements in all)


def run_bench(options: BenchOptions, progress: Progress = lambda *_: None) -> BenchReport:
    """Load every system once, then run each configuration through all of them in turn."""
    _check(options)
    machine = _probe(options, progress)   # first: the engines' `dtype: auto` choices read it
    progress("loading swarm", 0, 0)
    runners: list[Runner] = [SwarmRunner(options, sharing=True), SwarmRunner(options, sharing=False)]
    config = runners[0].llm.config
    _check_context(options, config.max_position_embeddings)
    missing = {}
    try:
        for peer in options.peers:
            progress(f"loading {SYSTEMS[peer]}", 0, 0)
            runner, failure = load_peer(peer, options, runners[0].llm.engine)
            if runner is None:
                missing[peer] = failure
            else:
                runners.append(runner)
        progress("warming up", 0, 0)
        for runner in runners:
            _measure(runner, _warm_up_workload(options, config.vocab_size))
        per_run = 2 if options.busy else 1
        tally = _Tally(progress, len(options.configurations) * options.repeats * len(runners) * per_run)
        configs = [_run_config(options, trunk, agents, runners, missing, config.vocab_size, tally)
                   for trunk, agents in options.configurations]
    finally:
        for runner in runners:
            if isinstance(runner, (PeerProcess, PlainPathFallback)):
                runner.close()
    engine = runners[0].llm.engine
    _fill_floors(configs, engine, machine)
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                **{r.name: r.version for r in runners}, **{name: None for name in missing}}
    kernels = {**engine.kernels(), "threads": torch.get_num_threads(),
               "openmp_wait": wait_settings()}
    return BenchReport(options, str(engine.device), str(engine.dtype).removeprefix("torch."), versions, configs,
                       kernels, machine)


def _probe(options: BenchOptions, progress: Progress) -> MachineProbe | None:
    """The CPU's rates (cached per machine; with --reprobe measured before any engine loads, so that their choices
    by measurement read this run's); None on a GPU, whose floor the CPU's probes do not give."""
    if pick_device(options.device).type != "cpu":
        return None
    progress("measuring the machine (matmul FLOP/s, read bandwidth)", 0, 0)
    return cached_probe(reprobe=options.reprobe)


def _fill_floors(configs: list[ConfigResult], engine, machine: MachineProbe | None) -> None:
    model = ModelShape.of(engine.config, engine.weights.model_bytes, engine.kv_bytes_per_token)
    for config in configs:
        config.fill_floor(machine and machine_floor(model, machine, config.agents, config.trunk, config.suffix,
                                                    config.new_tokens))


def _warm_up_workload(options: BenchOptions, vocab_size: int) -> Workload:
    """A short run at the widest batch, so first-call costs land outside the measurements."""
    return make_workload(max(options.agents), min(128, *options.trunks), min(16, options.suffix), 2,
                         vocab_size, seed="warm-up")


def load_peer(name: str, options: BenchOptions, engine) -> tuple[Runner | None, SystemResult | None]:
    """A peer runner for swarm's own model, in a worker process of its own, or why there is none;
    llama.cpp's falls back to its plain CPU path if its default one crashes."""
    spec = PeerSpec(name, engine.source, engine.config, str(engine.device), options.hf_dtype,
                    options.largest_kv_tokens, max(options.agents))
    try:
        return (PlainPathFallback(spec) if name == "llamacpp" else PeerProcess(spec)), None
    except PeerUnavailable as err:
        status = "not installed" if str(err).startswith("not installed") else "unavailable"
        return None, SystemResult(name, status, str(err))


class _Tally:
    def __init__(self, progress: Progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def measure(self, runner: Runner, workload: Workload, busy: int = 0) -> Measurement | SystemResult:
        """One run of `workload`, beside `busy` busy-loop processes started for it and ended after it."""
        what = f"N={workload.agents} T={workload.trunk_tokens}: {SYSTEMS[runner.name]}"
        what += f", {busy} busy process{'es' if busy > 1 else ''} beside it" if busy else ""
        self.progress(what, self.done, self.total)
        with BusyLoad(busy):
            measured = _measure(runner, workload)
        self.done += 1
        self.progress(what, self.done, self.total)
        return measured


def _run_config(options, trunk, agents, runners, missing, vocab, tally: _Tally) -> ConfigResult:
    runs: dict[str, list[tuple[int, Measurement | SystemResult]]] = {r.name: [] for r in runners}
    busy_runs: dict[str, list[tuple[int, Measurement | SystemResult]]] = {r.name: [] for r in runners}
    for repeat in range(options.repeats):
        workload = make_workload(agents, trunk, options.suffix, options.new_tokens, vocab,
                                 seed=f"{options.seed}/{trunk}/{agents}/{repeat}")
        turn = repeat % len(runners)
        for runner in runners[turn:] + runners[:turn]:
            _take_turn(runner, workload, repeat, options.busy, tally, runs[runner.name], busy_runs[runner.name])
    result = ConfigResult(agents, trunk, options.suffix, options.new_tokens)
    result.systems = {name: _median_run(name, runs[name], runs["swarm"]) for name in runs}
    for runner in runners:
        result.systems[runner.name].note = runner.note
    if options.busy:
        for name, system in result.systems.items():
            system.busy = _busy_result(options.busy, busy_runs[name], runs[name])
    result.systems.update(missing)
    result.fill_ratios()
    return result


def _take_turn(runner: Runner, workload: Workload, repeat: int, busy: int, tally: _Tally, runs, busy_runs) -> None:
    """One repeat of one system: quiet, then beside `busy` busy processes. A peer that changes how it runs
    (falls back to its plain path) drops its earlier runs of this configuration: a row measures one way."""
    note = runner.note
    quiet, beside = tally.measure(runner, workload), None
    if busy:
        before = runner.note
        beside = tally.measure(runner, workload, busy)
        if runner.note != before:   # the quiet run was the other way
            quiet = tally.measure(runner, workload)
    if runner.note != note:
        runs.clear()
        busy_runs.clear()
    runs.append((repeat, quiet))
    if beside is not None:
        busy_runs.append((repeat, beside))


def _measure(runner: Runner, workload: Workload) -> Measurement | SystemResult:
    try:
        return runner.run(workload)
    except (RuntimeError, MemoryError, ValueError, SwarmError) as err:
        return SystemResult(runner.name, "error", f"{type(err).__name__}: {err}".splitlines()[0])


def _median_run(name, runs, swarm_runs) -> SystemResult:
    """The repeat with the median wall time; its outputs are checked against swarm's on the same ids."""
    median = _median(runs)
    if median is None:
        return runs[0][1]
    repeat, measurement = median
    return SystemResult(name, "ok", measurement=measurement, matches_swarm=_matches(measurement, swarm_runs, repeat))


def _busy_result(processes: int, busy_runs, quiet_runs) -> BusyResult:
    """The busy repeat with the median wall time; its outputs are checked against the quiet run's."""
    median = _median(busy_runs)
    if median is None:
        failed = busy_runs[0][1]
        return BusyResult(processes, failed.status, failed.reason)
    repeat, measurement = median
    return BusyResult(processes, "ok", measurement=measurement,
                      matches_quiet=_matches(measurement, quiet_runs, repeat))


def _median(runs) -> tuple[int, Measurement] | None:
    done = sorted((m.wall_s, repeat, m) for repeat, m in runs if isinstance(m, Measurement))
    if not done:
        return None
    _, repeat, measurement = done[(len(done) - 1) // 2]
    return repeat, measurement


def _matches(measurement: Measurement, reference_runs, repeat: int) -> float | None:
    reference = dict(reference_runs).get(repeat)
    return agreement(measurement.outputs, reference.outputs) if isinstance(reference, Measurement) else None


def _check(options: BenchOptions) -> None:
    for name, values in (("--agents", options.agents), ("--trunk", options.trunks)):
        if not values or min(values) < 1:
            raise BenchError(f"{name} needs one or more whole numbers above zero, like 1,2,4,8")
    for name, value in (("--suffix", options.suffix), ("--new-tokens", options.new_tokens),
                        ("--repeats", options.repeats)):
        if value < 1:
            raise BenchError(f"{name} must be at least 1")
    if options.busy < 0:
        raise BenchError("--busy must be 0 (off) or a number of busy processes, like 1")
    if options.hf_dtype not in ("float32", "bfloat16", "float16"):
        raise BenchError(f"--hf-dtype {options.hf_dtype!r}: use float32, bfloat16 or float16")
    unknown = [p for p in options.peers if p not in PEERS]
    if unknown:
        raise BenchError(f"--peers: unknown peer {unknown[0]!r}; choose from {', '.join(PEERS)}")


def _check_context(options: BenchOptions, max_positions: int) -> None:
    longest = max(options.trunks) + options.suffix + options.new_tokens
    if longest > max_positions:
        raise BenchError(f"trunk + suffix + new tokens = {longest} is past the model's context of "
                         f"{max_positions} tokens; lower --trunk, --suffix or --new-tokens")
