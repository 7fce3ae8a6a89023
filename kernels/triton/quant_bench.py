"""Times the quantized matmuls on Qwen3-8B's shapes and prints µs and GB/s of weight bytes read:
`python -m kernels.triton.quant_bench` on a GPU; `--tiny` runs in seconds under TRITON_INTERPRET=1.

Each format and shape is timed on the decode kernel for M <= DECODE_ROWS and on the prefill kernel
for every M (so the crossover between them is in the table), next to torch's matmul of the same
weight dense in x's dtype. Timings do not depend on the values, so the blocks are random bytes.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from kernels.reference.quant_blocks import QuantizedTensor, row_bytes
from kernels.triton import quant_matmul as qm

# name: (K, N) of Qwen3-8B's linear layers (hidden 4096, MLP 12288, 8 KV heads of 128, 151936 tokens)
SHAPES = {"gate/up": (4096, 12288), "down": (12288, 4096), "q/o": (4096, 4096), "k/v": (4096, 1024),
          "lm_head": (4096, 151936)}
TINY_SHAPES = {"tiny": (256, 32)}
FORMATS = ("Q4_K", "Q6_K", "Q8_0")
ROWS = (1, 8, 16, 512)
TINY_ROWS = (1, 17)


@dataclass(frozen=True, slots=True)
class Timing:
    format: str
    shape: str
    rows: int
    kernel: str             # "decode", "prefill" or "dense" (torch's matmul of the float weight)
    microseconds: float
    weight_bytes: int

    @property
    def gigabytes_per_second(self) -> float:
        return self.weight_bytes / self.microseconds / 1e3


def bench(tiny: bool = False, dtype: torch.dtype = torch.bfloat16) -> list[Timing]:
    """Every (format, shape, M) on each kernel that takes it; dense once per (shape, M)."""
    device = "cpu" if qm.INTERPRETED else "cuda"
    shapes, all_rows = (TINY_SHAPES, TINY_ROWS) if tiny else (SHAPES, ROWS)
    timings = []
    for shape, (cols, n) in shapes.items():
        dense = torch.randn(n, cols, device=device).to(dtype)
        for rows in all_rows:
            x = torch.randn(rows, cols, device=device).to(dtype)
            timings.append(Timing("-", shape, rows, "dense", _time(lambda: F.linear(x, dense)), dense.nbytes))
            for format in FORMATS:
                timings += _time_kernels(x, _random_weight(format, n, cols, device), shape)
    return timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kernels.triton.quant_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="one small shape, for the interpreter (seconds)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                        help="dtype of x and of the dense weight (default bfloat16)")
    parser.add_argument("--json", action="store_true", help="print one JSON object a timing")
    args = parser.parse_args(argv)
    if not qm.INTERPRETED and not torch.cuda.is_available():
        raise SystemExit("no GPU here: run it as TRITON_INTERPRET=1 python -m kernels.triton.quant_bench --tiny")
    for timing in bench(args.tiny, getattr(torch, args.dtype)):
        if args.json:
            print(json.dumps(asdict(timing) | {"gigabytes_per_second": timing.gigabytes_per_second}))
        else:
            print(f"{timing.format:5} {timing.shape:8} M={timing.rows:<4} {timing.kernel:8}"
                  f"{timing.microseconds:10.1f} µs {timing.gigabytes_per_second:8.1f} GB/s")


def _time_kernels(x: torch.Tensor, weight: QuantizedTensor, shape: str) -> list[Timing]:
    kernels = {"prefill": lambda: qm.prefill_matmul(x, weight)}
    if x.shape[0] <= qm.DECODE_ROWS:
        kernels["decode"] = lambda: qm.decode_matmul(x, weight)
    return [Timing(weight.format, shape, x.shape[0], name, _time(run), weight.nbytes)
            for name, run in kernels.items()]


def _random_weight(format: str, n: int, cols: int, device: str) -> QuantizedTensor:
    """Random bytes below 64, so every fp16 in the blocks is finite (its exponent field under 16)."""
    blocks = torch.randint(0, 64, (n, row_bytes(format, cols)), dtype=torch.uint8, device=device)
    return QuantizedTensor(blocks, format, cols)


def _time(run) -> float:
    """Median µs of a call on a GPU (triton's do_bench); under the interpreter, of one call."""
    if not qm.INTERPRETED:
        from triton.testing import do_bench

        return do_bench(run, return_mode="median") * 1e3
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) * 1e6


if __name__ == "__main__":
    main()
