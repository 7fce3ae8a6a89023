"""`swarm bench-arrival`: the progress line and results table around swarm/bench/arrival.py."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from engine import DEFAULT_MODEL
from swarm.cli.bench import check_output_path, run_with_status, write_document

if TYPE_CHECKING:
    from swarm.bench.arrival import ArrivalBenchReport


def bench_arrival(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m",
                              help="A named model (see `swarm models`), a Hugging Face folder or a .gguf file."),
    agents: int = typer.Option(8, "--agents", help="Agents decoding when the newcomer arrives."),
    trunk: int = typer.Option(2048, "--trunk", help="Tokens of the trunk the agents (and the newcomer) share."),
    suffix: int = typer.Option(64, "--suffix", help="Tokens of each agent's own suffix after the trunk."),
    prompt: int = typer.Option(2000, "--prompt", help="Tokens of the newcomer's own prompt after the trunk."),
    chunk: int = typer.Option(256, "--chunk",
                              help="Token budget of a step with decode rows in it (the engine's mixed_step_tokens)."),
    warm_steps: int = typer.Option(4, "--warm-steps", help="Decode steps the agents run before the newcomer arrives."),
    repeats: int = typer.Option(1, "--repeats", help="Runs per schedule (the median is kept)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    dtype: str = typer.Option("auto", help="auto, float32, bfloat16 or float16."),
    seed: int = typer.Option(0, "--seed", help="Seed for the random token ids of the prompts."),
    out: Path = typer.Option(None, "--out", help="Write the results as JSON (schema in the README) here."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document instead of the table."),
) -> None:
    """Measure what a newcomer's prompt costs the agents already decoding: their longest wait between two tokens, against the newcomer's whole prefill alone.

    N agents share a trunk of T tokens and decode; then a newcomer arrives with the same trunk and P tokens of its own. Two schedules take turns on one engine: mixed (prompt chunks of at most --chunk tokens ride beside the decode rows in one forward pass) and whole (the prompt in one step, as a prefill-first scheduler runs it). Per schedule: the agents' longest gap between two tokens, their steady decode step, the newcomer's prefill beside them and alone, and whether both schedules gave the agents the same greedy tokens.

    Example: swarm bench-arrival --agents 8 --trunk 2048 --prompt 2000 --out arrival.json
    """
    from swarm.bench.arrival import ArrivalBenchOptions, run_arrival_bench  # imports torch

    check_output_path("--out", out)
    options = ArrivalBenchOptions(model, agents, trunk, suffix, prompt, chunk, warm_steps, repeats, device, dtype,
                                  seed)
    report = run_with_status(run_arrival_bench, options)
    if not write_document(report.to_json(), out, as_json):
        return
    console = Console()
    console.print(f"[bold]swarm bench-arrival[/]: {options.model} on {report.device} ({report.dtype}, "
                  f"{report.threads} threads, {report.cpu}), {options.agents} agents over T={options.trunk:,}, "
                  f"a {options.prompt:,}-token newcomer")
    console.print(_table(report))
    if out is not None:
        console.print(f"json: {out}")


def _table(report: ArrivalBenchReport) -> Table:
    table = Table("schedule", "longest gap", "steady step", "newcomer beside", "newcomer alone", "gap / alone",
                  caption="gap: the longest wait of a running agent between two tokens once the newcomer arrived. "
                  "newcomer: its arrival to its first token. Medians over the repeats. Target (issue 19): "
                  "gap / alone <= 30% with mixed steps")
    for name, summary in report.modes.items():
        share = summary.median("gap_share")
        table.add_row(name, _ms(summary.median("longest_gap_s")), _ms(summary.median("steady_step_s")),
                      _ms(summary.median("newcomer_prefill_s")), _ms(summary.median("alone_prefill_s")),
                      f"[bold]{share:.0%}[/]")
    same = "-" if report.matches is None else f"{report.matches:.0%}"
    table.add_section()
    table.add_row("same tokens", same, "", "", "", "met" if report.meets_target else "[red]missed[/]")
    return table


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"
