"""The `timings` part: prefill and decode through the real engine (LLMEngine over a model of random
weights made on the card, engine.loading.random_model), for each weight kind and graphs setting:

    trunk     one prompt of `trunk` tokens, prefilled alone (prefill_only, then pinned, as a run does)
    agents    N prompts, the trunk and a private suffix each: the suffixes' prefill over the cached
              trunk, then greedy decode steps of N rows; each step timed alone, the median reported

Each engine first runs the whole scenario once on another trunk, so every kernel is compiled (and every
graph captured) before anything is timed. Cases are saved as they finish: a part killed at its time
box still reports the cases it measured.
"""
from __future__ import annotations

import gc
import random
import statistics
import time
import traceback
from dataclasses import dataclass, fields

import torch

from engine.gpu_check.bandwidth import decode_traffic
from engine.gpu_check.context import PartContext, PartFailed, last_lines
from engine.llm_engine import LLMEngine
from engine.loading.random_model import random_source
from engine.loading.weight_plan import FORMAT_OF_DTYPE
from engine.options import EngineOptions
from engine.sampling import SamplingParams
from kernels.reference.quant_blocks import row_bytes

BLOCK_FORMAT = "Q4_K"


@dataclass(frozen=True, slots=True)
class Workload:
    shape: str                   # engine.loading.random_model.SHAPES
    trunk: int
    suffix: int
    decode_steps: int
    agents: tuple[int, ...]


FULL = Workload("qwen3-8b", trunk=4096, suffix=128, decode_steps=32, agents=(1, 8))
QUICK = Workload("tiny-qwen3", trunk=256, suffix=16, decode_steps=8, agents=(1, 8))


def run(context: PartContext) -> dict:
    workload = QUICK if context.quick else FULL
    details = {"workload": {f.name: getattr(workload, f.name) for f in fields(workload)}, "cases": [], "failed": []}
    for block_format in (BLOCK_FORMAT, None):
        for graphs in graph_settings():
            try:
                details["cases"].append(time_case(workload, block_format, graphs, context.device))
            except Exception as error:     # reported; the next case still runs
                details["failed"].append({"weights": block_format, "graphs": graphs,
                                          "error": last_lines(traceback.format_exc())})
                print(f"timings: {block_format or 'float'} graphs={graphs} failed: {error!r}", flush=True)
            context.save("running", details)
    if details["failed"]:
        raise PartFailed(f"{len(details['failed'])} of {len(details['failed']) + len(details['cases'])} cases "
                         "failed (details.failed)", details)
    return details


def graph_settings() -> tuple[bool | None, ...]:
    """(False, True) where the engine has the cuda_graphs option; (None,) until it does."""
    return (False, True) if "cuda_graphs" in {f.name for f in fields(EngineOptions)} else (None,)


def engine_options(workload: Workload, device: str, graphs: bool | None) -> EngineOptions:
    """A pool for two trunks and twice the largest swarm's private tokens, whatever the card's size."""
    private = max(workload.agents) * (workload.suffix + workload.decode_steps + 16)
    graph_option = {} if graphs is None else {"cuda_graphs": graphs}
    return EngineOptions(device=device, kv_budget_tokens=2 * (workload.trunk + private) + 512, **graph_option)


def time_case(workload: Workload, block_format: str | None, graphs: bool | None, device: str) -> dict:
    began = time.perf_counter()
    engine = LLMEngine(random_source(workload.shape, block_format, device), engine_options(workload, device, graphs))
    try:
        case = {"weights": block_format or str(engine.dtype).removeprefix("torch."), "graphs": graphs,
                "build_s": round(time.perf_counter() - began, 2), "kv_bytes_per_token": engine.kv_bytes_per_token}
        rng = random.Random(0)
        scenario(engine, workload, rng, steps=2)       # compiles and captures: nothing timed is the first
        case |= scenario(engine, workload, rng, steps=workload.decode_steps)
        return case | {"kernels": engine.kernels()}
    finally:
        del engine
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def scenario(engine: LLMEngine, workload: Workload, rng: random.Random, steps: int) -> dict:
    vocab = engine.config.vocab_size
    trunk = [rng.randrange(vocab) for _ in range(workload.trunk)]
    seconds, pinned = prefill_trunk(engine, trunk)
    try:
        runs = [run_agents(engine, trunk, agents, workload.suffix, steps, rng) for agents in workload.agents]
    finally:
        engine.unpin(pinned)
    return {"trunk_prefill_s": round(seconds, 4), "trunk_prefill_tok_s": round(len(trunk) / seconds, 1),
            "runs": runs}


def prefill_trunk(engine: LLMEngine, trunk: list[int]) -> tuple[float, list[int]]:
    seq = engine.add_request(trunk, SamplingParams(max_tokens=1), prefill_only=True)
    began = _now(engine)
    while seq.finish_reason is None:
        engine.step()
    seconds = _now(engine) - began
    assert seq.finish_reason == "prefilled", f"the trunk did not prefill: {seq.finish_reason} {seq.error}"
    pinned = engine.pin(seq)
    engine.release(seq)
    return seconds, pinned


def run_agents(engine: LLMEngine, trunk: list[int], agents: int, suffix: int, steps: int,
               rng: random.Random) -> dict:
    vocab = engine.config.vocab_size
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    seqs = [engine.add_request(trunk + [rng.randrange(vocab) for _ in range(suffix)], params)
            for _ in range(agents)]
    prefill, decode = 0.0, []
    try:
        while engine.has_work():
            began = _now(engine)
            result = engine.step()
            elapsed = _now(engine) - began
            if result.prefilled:
                prefill += elapsed
            elif len(result.new_tokens) == agents:
                decode.append(elapsed)
        cached = min(seq.num_cached_tokens for seq in seqs)
    finally:
        for seq in seqs:
            engine.release(seq)
    return _agents_result(engine, len(trunk), agents, suffix, steps, prefill, decode, cached)


def _agents_result(engine: LLMEngine, trunk: int, agents: int, suffix: int, steps: int, prefill: float,
                   decode: list[float], cached: int) -> dict:
    traffic = decode_traffic(engine.weight_bytes, embedding_bytes(engine), engine.kv_bytes_per_token, agents,
                             trunk, suffix + steps / 2, cascade=True)
    result = {"agents": agents, "cached_tokens_min": cached, "suffix_prefill_s": round(prefill, 4),
              "suffix_prefill_tok_s": round(agents * suffix / prefill, 1) if prefill else None,
              "decode_steps_timed": len(decode), "decode_ms_per_step": None, "decode_ms_min": None,
              "decode_tok_s": None, "decode_bytes_per_step": traffic.total_bytes,
              "decode_weight_bytes": traffic.weight_bytes, "decode_kv_bytes": traffic.kv_bytes}
    if decode:      # none where a step never ran all the agents' rows together
        step = statistics.median(decode)
        result |= {"decode_ms_per_step": round(step * 1e3, 3), "decode_ms_min": round(min(decode) * 1e3, 3),
                   "decode_tok_s": round(agents / step, 1)}
    return result


def embedding_bytes(engine: LLMEngine) -> int:
    """The embedding table's bytes, which a decode step does not read whole (0 when lm_head is tied to it)."""
    config = engine.config
    if config.tie_word_embeddings:
        return 0
    block_format = engine.source.block_format or FORMAT_OF_DTYPE[engine.dtype]
    return config.vocab_size * row_bytes(block_format, config.hidden_size)


def _now(engine: LLMEngine) -> float:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return time.perf_counter()
