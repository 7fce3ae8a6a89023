"""`swarm bench-decode`: the progress line and results table around swarm/bench/decode.py."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from engine import DEFAULT_MODEL
from swarm.cli.bench import check_output_path, comma_ints, run_with_status, write_document
from swarm.spec.kv_budget import format_bytes

if TYPE_CHECKING:
    from swarm.bench.decode import DecodeBenchReport


def bench_decode(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m",
                              help="A named model (see `swarm models`), a Hugging Face folder or a .gguf file."),
    agents: int = typer.Option(8, "--agents", help="Agents decoding together (2 or more)."),
    trunk: str = typer.Option("2048,4096,8192", "--trunk", metavar="T1,T2,...",
                              help="Shared trunk lengths, in tokens (64 or more)."),
    suffix: int = typer.Option(64, "--suffix", help="Tokens of each agent's own suffix after the trunk."),
    steps: int = typer.Option(16, "--steps", help="Decode steps timed per mode and trunk (the median is kept)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("auto", help="auto, float32, bfloat16 or float16."),
    seed: int = typer.Option(0, "--seed", help="Seed for the random token ids of the prompts."),
    out: Path = typer.Option(None, "--out", help="Write the results as JSON (schema in the README) here."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document instead of the table."),
) -> None:
    """Time one decode step with cascade attention (the shared trunk read once for all agents) against plain paged attention (every agent reads its whole context), on one engine and the same KV.

    N agents share a trunk of T tokens, each with its own S-token suffix. The prompts are prefilled once; then the two modes take turns, step by step, over two rounds of decoding, so each is timed on --steps steps at the same context lengths. Per trunk: the median step time of each mode, plain over cascade, the KV bytes each step's attention reads (theory), and whether both modes chose the same greedy tokens.

    Threads: torch's (set OMP_NUM_THREADS to change them). Model loading, prefill and a short warm-up are not timed.

    Example: swarm bench-decode --agents 8 --trunk 4096 --out decode.json
    """
    from swarm.bench.decode import DecodeBenchOptions, run_decode_bench  # imports torch

    check_output_path("--out", out)
    options = DecodeBenchOptions(model, agents, comma_ints("--trunk", trunk), suffix, steps, device, dtype, seed)
    report = run_with_status(run_decode_bench, options)
    if not write_document(report.to_json(), out, as_json):
        return
    console = Console()
    console.print(f"[bold]swarm bench-decode[/]: {options.model} on {report.device} ({report.dtype}, "
                  f"{report.threads} threads), {options.agents} agents, suffix {options.suffix}, "
                  f"{options.steps} steps per mode")
    console.print(_table(report))
    for trunk in report.past_context():
        console.print(f"[yellow]T={trunk:,}[/]: the last steps run past the model's context of "
                      f"{report.max_context:,} tokens; their cost holds, their tokens are not meaningful text")
    if out is not None:
        console.print(f"json: {out}")


def _table(report: DecodeBenchReport) -> Table:
    table = Table("trunk", "plain read", "cascade read", "read ×", "plain step", "cascade step", "speedup",
                  "same", caption="read: KV bytes one decode step's attention reads (theory, mean over the "
                  "steps). step: median wall time. speedup: plain over cascade. same: agents whose greedy "
                  "tokens agree between the modes (in 16-bit dtypes near-ties may part them), and Δ the "
                  "largest logit difference on the first step, where both modes see the same state")
    for result in report.trunks:
        plain, cascade = result.modes["plain"], result.modes["cascade"]
        same = "-" if result.matches is None else f"{result.matches:.0%}"
        same += f"\n[dim]Δ {result.first_step_logit_diff:.2g}[/]"
        table.add_row(f"{result.trunk:,}", format_bytes(plain.attention_bytes),
                      format_bytes(cascade.attention_bytes), f"{result.bytes_ratio:.1f}×",
                      f"{plain.median_s * 1000:.1f} ms", f"{cascade.median_s * 1000:.1f} ms",
                      f"[bold]{result.speedup:.2f}×[/]", same)
    return table
