"""The `graphs` part: decode graphs on and off give the same greedy tokens.

Two checks: the engine's own test (tests/engine/test_decode_graphs.py, which has a GPU-only case), and a
direct one here: 8 prompts over a shared trunk on a tiny model of random weights, cuda_graphs True
against False, in the card's dtype and in float32. Eight rows fill the batch bucket of 8, so no row is
padded; a graph's private tables are padded to a width bucket, though, which may split the attention
differently. So a difference in float32 is a bug, and one in bfloat16 alone is likely rounding (the
error says which). On a GPU the graphs run must also have replayed graphs (a capture that failed
falls back to eager, which would make the comparison empty). On a CPU both runs are eager: there it
checks the script.
"""
from __future__ import annotations

import random

from engine.gpu_check.context import REPO_ROOT, PartContext, PartFailed, PartSkipped
from engine.gpu_check.pytest_run import run_pytest
from engine.gpu_check.timings import graph_settings
from engine.llm import LLM
from engine.loading.random_model import SHAPES, random_source
from engine.sampling import SamplingParams

GRAPH_TESTS = "tests/engine/test_decode_graphs.py"
SHAPE = "tiny-qwen3"
AGENTS, TRUNK, SUFFIX, NEW_TOKENS = 8, 200, 9, 24
MARGIN_SECONDS = 5


def run(context: PartContext) -> dict:
    if graph_settings() == (None,):
        raise PartSkipped("no cuda_graphs option in EngineOptions yet")
    dtypes = ("auto", "float32") if context.on_gpu else ("float32",)   # a CPU engine's auto is float32
    details = {"device": context.device, "direct": [compare(context.device, dtype) for dtype in dtypes]}
    tests = None
    if context.on_gpu and (REPO_ROOT / GRAPH_TESTS).exists():   # on a CPU the suite runs them anyway
        tests = run_pytest([GRAPH_TESTS], {}, context.seconds_left() - MARGIN_SECONDS)
        details["pytest"] = tests.to_json()
    differ = [check["dtype"] for check in details["direct"] if not check["identical"]]
    if differ:
        reading = "a bug" if "float32" in differ else "likely rounding: float32 agrees"
        raise PartFailed(f"graphs on and off gave different greedy tokens in {', '.join(differ)} ({reading})",
                         details)
    not_replayed = [check["graphs"] for check in details["direct"] if not _replayed(check["graphs"])]
    if context.on_gpu and not_replayed:
        raise PartFailed(f"the graphs run did not replay graphs: {not_replayed[0]}", details)
    if tests is not None and not tests.passed:
        raise PartFailed(f"{GRAPH_TESTS}: {tests.counts}", details)
    return details


def compare(device: str, dtype: str) -> dict:
    prompts = shared_trunk_prompts(SHAPES[SHAPE]["vocab_size"])
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    tokens, state = {}, {}
    for graphs in (False, True):
        llm = LLM(random_source(SHAPE, device=device), device=device, dtype=dtype, cuda_graphs=graphs,
                  kv_budget_tokens=4096)
        tokens[graphs] = [output.token_ids for output in llm.generate(prompts, params)]
        state[graphs] = llm.engine.kernels().get("decode_graphs", "unknown")
        dtype_used = str(llm.engine.dtype).removeprefix("torch.")
        del llm
    rows_differ = [row for row, (a, b) in enumerate(zip(tokens[False], tokens[True])) if a != b]
    return {"dtype": dtype_used, "identical": not rows_differ, "rows_differ": rows_differ,
            "first_tokens": {"eager": tokens[False][0][:8], "graphs": tokens[True][0][:8]},
            "eager": state[False], "graphs": state[True]}


def _replayed(state: str) -> bool:
    """engine.decode_graphs.DecodeGraphs.describe() after steps on captured graphs: "23 steps on 1 graphs"."""
    return state.split()[0].isdigit() and int(state.split()[0]) > 0 and "not captured" not in state


def shared_trunk_prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(19)
    trunk = [rng.randrange(vocab) for _ in range(TRUNK)]
    return [trunk + [rng.randrange(vocab) for _ in range(SUFFIX)] for _ in range(AGENTS)]
