"""Time a decode step's attention: plain paged against cascade (trunk read once), on a GPU.

N agents share a T-token trunk and each has a private suffix. Both paths run the engine's own
attention backend on one decode step (`AttentionBackend.forward`: write the new K/V, attend), planned
with cascade on and off (`use_cascade`); "plain" is the plan with sharing off. One timed step runs
every layer, each on its own KV pool, so the caches are not warm from the layer before. Prints JSON:
times, the KV bytes each path reads per step (theory), the bandwidth that implies, and how far
cascade's output is from plain. Then one prompt's prefill: a chunk of new tokens over a longer context
(the rest cached), every layer's prefill attention on the same backends.

    python -m engine.attention.bench_triton      # N=8, T=2048/4096/8192; SmolLM2- and Qwen3-8B-like shapes
    python -m engine.attention.bench_triton --tiny  # a tiny size; on CPU it runs the Triton interpreter
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

import torch

from engine.attention.base import AttentionBackend, AttentionBatch
from engine.attention.select import select_backend
from engine.kv.cache import KVCache
from engine.loading.config import kv_bytes_per_token


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    heads: int
    kv_heads: int
    head_dim: int
    layers: int


SHAPES = [Shape("smollm2-135m-like", 9, 3, 64, 30), Shape("qwen3-8b-like", 32, 8, 128, 36)]
TINY_SHAPE = Shape("tiny", 4, 2, 32, 2)
BLOCK_SIZE = 16
PREFILL = (4096, 2048)          # (context, new tokens) of the timed prefill chunk
TINY_PREFILL = (64, 32)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if args.tiny and not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")     # before any Triton kernel is defined
    device = torch.device("cuda" if on_gpu else "cpu")
    if not on_gpu and not args.tiny:
        raise SystemExit("no GPU here: run with --tiny to check the script under the Triton interpreter")
    shapes, trunks = ([TINY_SHAPE], [64]) if args.tiny else (SHAPES, args.trunks)
    agents, suffix = (2, 8) if args.tiny else (args.agents, args.suffix)
    iters, warmup = (1, 0) if args.tiny else (args.iters, args.warmup)
    dtype = getattr(torch, args.dtype)
    results = [_measure(shape, trunk, agents, suffix, dtype, device, backend, iters, warmup)
               for shape in shapes for trunk in trunks for backend in args.backends]
    context, new = TINY_PREFILL if args.tiny else PREFILL
    prefill = [_measure_prefill(shape, context, new, dtype, device, backend, iters, warmup)
               for shape in shapes for backend in args.backends]
    print(json.dumps({"device": _device_name(device), "dtype": args.dtype, "agents": agents, "suffix": suffix,
                      "block_size": BLOCK_SIZE, "iters": iters, "results": results, "prefill": prefill}, indent=2))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.attention.bench_triton", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=8, help="decode rows sharing the trunk (N)")
    parser.add_argument("--trunks", type=int, nargs="+", default=[2048, 4096, 8192], help="trunk lengths (T)")
    parser.add_argument("--suffix", type=int, default=128, help="private tokens per agent after the trunk")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--backends", nargs="+", default=["triton", "torch"], choices=["triton", "torch"])
    parser.add_argument("--iters", type=int, default=50, help="timed repetitions per measurement")
    parser.add_argument("--warmup", type=int, default=5, help="untimed repetitions first (compiles Triton)")
    parser.add_argument("--tiny", action="store_true", help="2 agents, a 64-token trunk, 2 layers: a smoke run")
    return parser


def _measure(shape: Shape, trunk: int, agents: int, suffix: int, dtype, device, backend: str,
             iters: int, warmup: int) -> dict:
    tables, lengths, num_blocks = _swarm_tables(trunk, agents, suffix)
    kv = KVCache([_pool(shape, num_blocks, dtype, device) for _ in range(shape.layers)], BLOCK_SIZE)
    attention = select_backend(kv, shape.head_dim ** -0.5, choice=backend)
    q = torch.randn(agents, shape.heads, shape.head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(agents, shape.kv_heads, shape.head_dim, dtype=dtype, device=device) for _ in range(2))
    batches = {name: _decode_batch(attention, tables, lengths, name == "cascade", device)
               for name in ("paged", "cascade")}
    assert batches["cascade"].plan.decode.prefixes, "the trunk should be shared"
    outputs, times = {}, {}
    for name, batch in batches.items():
        step = lambda batch=batch: [attention.forward(q, k, v, layer, batch)   # noqa: E731
                                    for layer in range(shape.layers)]
        outputs[name], times[name] = step()[-1], _time(step, iters, warmup, device)
    per_token = kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, q.element_size())
    read = {"paged": sum(lengths) * per_token, "cascade": (trunk + sum(n - trunk for n in lengths)) * per_token}
    return {**asdict(shape), "trunk": trunk, "backend": attention.name,
            "paged_step_ms": times["paged"] * 1e3, "cascade_step_ms": times["cascade"] * 1e3,
            "speedup": times["paged"] / times["cascade"],
            "paged_bytes_per_step": read["paged"], "cascade_bytes_per_step": read["cascade"],
            "paged_gb_s": read["paged"] / times["paged"] / 1e9,
            "cascade_gb_s": read["cascade"] / times["cascade"] / 1e9,
            "max_abs_diff": (outputs["paged"].float() - outputs["cascade"].float()).abs().max().item()}


def _measure_prefill(shape: Shape, context: int, new: int, dtype, device, backend: str,
                     iters: int, warmup: int) -> dict:
    """One prompt's last `new` tokens over its `context`: every layer writes their K/V and attends."""
    num_blocks = -(-context // BLOCK_SIZE)
    kv = KVCache([_pool(shape, num_blocks, dtype, device) for _ in range(shape.layers)], BLOCK_SIZE)
    attention = select_backend(kv, shape.head_dim ** -0.5, choice=backend)
    slots = torch.arange(context - new, context, device=device)       # its table is blocks 0, 1, ...
    batch = AttentionBatch(True, slots, [context], [new], [list(range(num_blocks))])
    attention.plan(batch)
    q = torch.randn(new, shape.heads, shape.head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(new, shape.kv_heads, shape.head_dim, dtype=dtype, device=device) for _ in range(2))
    step = lambda: [attention.forward(q, k, v, layer, batch) for layer in range(shape.layers)]   # noqa: E731
    seconds = _time(step, iters, warmup, device)
    return {**asdict(shape), "backend": attention.name, "context": context, "new_tokens": new,
            "prefill_step_ms": seconds * 1e3, "new_tokens_per_s": new / seconds}


def _decode_batch(attention: AttentionBackend, tables: list[list[int]], lengths: list[int], cascade: bool,
                  device) -> AttentionBatch:
    """One decode step of every agent (its last token's K/V written, then attending), planned."""
    slots = [table[(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE for table, n in zip(tables, lengths)]
    batch = AttentionBatch(False, torch.tensor(slots, dtype=torch.long, device=device), lengths, [1] * len(tables),
                           tables, queries="last")
    attention.use_cascade(cascade)
    attention.plan(batch)
    return batch


def _swarm_tables(trunk: int, agents: int, suffix: int):
    """The trunk's blocks (consecutive) first in every table, then each agent's own blocks."""
    assert trunk % BLOCK_SIZE == 0, "keep the trunk a whole number of blocks"
    trunk_blocks = list(range(trunk // BLOCK_SIZE))
    tables, lengths, next_block = [], [], len(trunk_blocks)
    for agent in range(agents):
        length = trunk + suffix + agent                      # agents at slightly different lengths
        own = -(-(length - trunk) // BLOCK_SIZE)
        tables.append(trunk_blocks + list(range(next_block, next_block + own)))
        lengths.append(length)
        next_block += own
    return tables, lengths, next_block


def _pool(shape: Shape, num_blocks: int, dtype, device):
    size = (num_blocks, BLOCK_SIZE, shape.kv_heads, shape.head_dim)
    return (torch.randn(size, dtype=dtype, device=device), torch.randn(size, dtype=dtype, device=device))


def _time(step, iters: int, warmup: int, device) -> float:
    """Seconds per call: CUDA events on a GPU, wall clock elsewhere."""
    for _ in range(warmup):
        step()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - start) / iters
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    begin.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize(device)
    return begin.elapsed_time(end) / 1e3 / iters


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"


if __name__ == "__main__":
    main()
