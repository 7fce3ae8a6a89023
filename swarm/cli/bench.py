"""`swarm bench`: the rich progress bar and results table around swarm/bench/runner.py."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine import DEFAULT_MODEL
from swarm.bench.workload import PEERS, SYSTEMS, BenchError, BenchOptions
from swarm.spec.kv_budget import format_bytes

if TYPE_CHECKING:
    from engine import MachineProbe
    from swarm.bench.floor import Floor
    from swarm.bench.report import BenchReport, ConfigResult, SystemResult

SHORT_NAMES = {"swarm": "swarm", "swarm_no_sharing": "swarm, no sharing", "hf": "transformers",
               "llamacpp": "llama.cpp"}


def bench(
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m",
                              help="A named model (see `swarm models`), a Hugging Face folder or a .gguf file."),
    agents: str = typer.Option("1,2,4,8", "--agents", metavar="N1,N2,...", help="Agent counts to run."),
    trunk: str = typer.Option("512,2048,4096", "--trunk", metavar="T1,T2,...",
                              help="Shared trunk lengths, in tokens."),
    suffix: int = typer.Option(64, "--suffix", help="Tokens of each agent's own suffix after the trunk."),
    new_tokens: int = typer.Option(64, "--new-tokens", help="Tokens each agent generates (greedy, EOS ignored)."),
    peers: str = typer.Option(",".join(PEERS), "--peers", metavar="hf,llamacpp",
                              help="Systems to compare against besides swarm with sharing off; '' for none."),
    device: str = typer.Option("auto", help="auto, cpu or cuda: for swarm and transformers."),
    dtype: str = typer.Option("auto", help="swarm's dtype: auto, float32, bfloat16 or float16."),
    hf_dtype: str = typer.Option("float32", "--hf-dtype", help="transformers' dtype (its default is float32)."),
    repeats: int = typer.Option(1, "--repeats", help="Runs per system and configuration; the median is kept."),
    seed: int = typer.Option(0, "--seed", help="Seed for the random token ids of the workload."),
    busy: int = typer.Option(0, "--busy", metavar="K",
                             help="Also run each measurement beside K processes that each keep a core busy "
                                  "(as an IDE or a browser would), and report decode tok/s against the quiet run."),
    out: Path = typer.Option(None, "--out", help="Write the results as JSON (schema in the README) here."),
    plot: Path = typer.Option(None, "--plot", help="Write a PNG chart here (needs matplotlib)."),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON document instead of the table."),
    no_graphs: bool = typer.Option(False, "--no-graphs", help="swarm decodes eagerly on a GPU, without CUDA/HIP graphs."),
    reprobe: bool = typer.Option(False, "--reprobe",
                                 help="Measure the machine's matmul FLOP/s and read bandwidth again instead of "
                                      "reading them from ~/.cache/swarm/machine-probe.json ($SWARM_CACHE_DIR)."),
) -> None:
    """Compare swarm with prefix sharing against swarm without it, Hugging Face transformers (batched generate) and llama.cpp (trunk decoded once, then copied to every sequence).

    Workload: N agents share a trunk of T tokens; each then reads its own S-token suffix and generates G tokens, greedy. Each pair of --agents and --trunk values is one configuration; the systems take turns on each, so their ratios hold on a busy machine. swarm runs in this process, each peer in a worker process of its own, as its users run it.

    Per system: KV bytes held at peak, prompt tokens computed, time to the first token of the last agent, aggregate decode tokens/s, end-to-end wall time, and each over swarm-with-sharing's.

    On a CPU, the bench also measures the machine (a few seconds, cached per machine; --reprobe measures again) and derives the workload's floor: its FLOPs at the fastest matmul rate and its bytes at the read bandwidth. Every wall time is shown as a multiple of that floor.

    Example: swarm bench --agents 1,8 --trunk 2048 --out bench.json --plot bench.png

    On a busy CPU: swarm bench --agents 1 --trunk 512 --busy 1 (one core taken while it runs).

    One decode step, cascade attention against plain paged attention: swarm bench-decode.
    """
    check_output_path("--out", out)
    check_output_path("--plot", plot)
    options = BenchOptions(model, comma_ints("--agents", agents), comma_ints("--trunk", trunk), suffix, new_tokens,
                           tuple(p.strip() for p in peers.split(",") if p.strip()), device, dtype, hf_dtype,
                           repeats, seed, busy, graphs=not no_graphs, reprobe=reprobe)
    if plot is not None:
        from swarm.bench.chart import require_matplotlib
        require_matplotlib()
    report = _run_with_progress(options)
    document = report.to_json()
    if out is not None:
        out.write_text(json.dumps(document, indent=2) + "\n")
    if plot is not None:
        from swarm.bench.chart import write_chart
        write_chart(report, plot)
    if as_json:
        print(json.dumps(document, indent=2))
        return
    _print_report(report, Console(), out, plot)


def check_output_path(name: str, path: Path | None) -> None:
    """Refuse an output file that cannot be written before the benchmark runs, not after."""
    if path is not None and (path.is_dir() or not path.parent.is_dir()):
        raise BenchError(f"{name}: {path} is a folder, or its folder does not exist; name a file in an existing folder")


def run_with_status(run, options):
    """`run(options, progress)` with its progress on one status line of stderr; its report."""
    with Console(stderr=True).status("starting") as status:
        return run(options, lambda what: status.update(what))


def write_document(document: dict, out: Path | None, as_json: bool) -> bool:
    """The JSON to --out, and to stdout with --json; whether the table is still to print."""
    if out is not None:
        out.write_text(json.dumps(document, indent=2) + "\n")
    if as_json:
        print(json.dumps(document, indent=2))
    return not as_json


def comma_ints(name: str, raw: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise BenchError(f"{name}: {raw!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise BenchError(f"{name} needs one or more whole numbers above zero, like 1,2,4,8")
    return values


def _run_with_progress(options: BenchOptions) -> BenchReport:
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("starting", total=None)

        def update(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total or None)

        from swarm.bench.runner import run_bench  # imports torch: only once a bench runs
        return run_bench(options, update)


def _print_report(report: BenchReport, console: Console, out: Path | None, plot: Path | None) -> None:
    o = report.options
    console.print(f"[bold]swarm bench[/]: {o.model} on {report.device} ({report.dtype}; transformers "
                  f"{o.hf_dtype}), suffix {o.suffix}, {o.new_tokens} new tokens per agent, greedy")
    kernels = report.kernels or {}
    if kernels:
        weights = kernels.get("weights") or {}
        formats = ", ".join(f"{name} {nbytes / 1e6:.1f} MB" for name, nbytes in (weights.get("by_format") or {}).items())
        matmuls = "oneDNN" if kernels.get("matmuls") == "onednn" else "torch"
        console.print(f"swarm kernels: {kernels.get('attention')} attention, {matmuls} float matmuls; "
                      f"weights {weights.get('label', '?')}: {formats}")
        waiting = " ".join(f"{k}={v}" for k, v in (kernels.get("openmp_wait") or {}).items()) or "spinning (default)"
        console.print(f"CPU threads: {kernels.get('threads')}, idle OpenMP threads: {waiting}")
    if report.machine is not None:
        console.print(_machine_line(report.machine))
    console.print(_table(report))
    if any((r.wall_over_floor or 1) < 1 for c in report.configs for r in c.systems.values()):
        console.print("[yellow]a wall time under the floor: the machine was busier when it was probed than during "
                      "the bench; run it again with --reprobe[/]")
    for name, version in report.versions.items():
        if version is None:
            reason = next(c.systems[name].reason for c in report.configs)
            console.print(f"[yellow]{SYSTEMS[name]}[/]: {reason}")
    for label, path in (("json", out), ("chart", plot)):
        if path is not None:
            console.print(f"{label}: {path}")


def _table(report: BenchReport) -> Table:
    busy = report.options.busy
    columns = ["N", "trunk", "system", "KV at peak", "prompt tokens", "TTFT last", "decode tok/s", "wall", "× floor",
               "same"]
    caption = ("×: over swarm with sharing. TTFT last: time to the last agent's first token. × floor: wall time over "
               "the machine's floor (its FLOPs at the fastest matmul rate, its bytes at the read bandwidth). same: "
               "agents whose greedy tokens equal swarm's")
    if busy:
        columns.append(f"decode tok/s, {busy} busy")
        caption += f". {busy} busy: beside {busy} busy-loop process{'es' if busy > 1 else ''}, × over the quiet run"
    table = Table(*columns, caption=caption)
    for config in report.configs:
        if config.floor is not None:
            table.add_row(str(config.agents), f"{config.trunk:,}", "machine floor",
                          *_floor_cells(config.floor, config.agents, busy))
        for name, result in config.systems.items():
            if result.status in ("not installed", "unavailable"):
                continue
            cells = _cells(config, name) + ([_busy_cell(config.systems[name])] if busy else [])
            table.add_row(str(config.agents), f"{config.trunk:,}", SHORT_NAMES[name], *cells,
                          end_section=name == list(config.systems)[-1])
    return table


def _cells(config: ConfigResult, name: str) -> list[str]:
    result = config.systems[name]
    m = result.measurement
    if m is None:
        return [f"[red]{result.status}: {result.reason}[/]", "", "", "", "", "", ""]
    r = result.ratios
    decode = "-" if m.decode_tok_s is None else f"{m.decode_tok_s:,.1f}"
    same = "-" if result.matches_swarm is None else f"{result.matches_swarm:.0%}"
    over_floor = "-" if result.wall_over_floor is None else f"{result.wall_over_floor:.1f}×"
    return [_with_ratio(format_bytes(m.kv_bytes_peak), r.get("kv_bytes_peak"), name),
            _with_ratio(f"{m.prompt_tokens_computed:,}", r.get("prompt_tokens_computed"), name),
            _with_ratio(f"{m.ttft_last_s:.2f} s", r.get("ttft_last_s"), name),
            _with_ratio(decode, r.get("decode_tok_s"), name),
            _with_ratio(f"{m.wall_s:.2f} s", r.get("wall_s"), name), over_floor, same]


def _floor_cells(floor: Floor, agents: int, busy: int) -> list[str]:
    """The floor's row: its prefill in the TTFT column, its decode steps in the decode one, its total as the wall."""
    decode = "-"
    if floor.decode_steps and floor.decode_step_s > 0:
        decode = f"{agents / floor.decode_step_s:,.1f}\n{floor.decode_steps} × {floor.decode_step_s * 1e3:.1f} ms"
    return ["", "", f"[dim]{floor.prefill_s:.2f} s[/]", f"[dim]{decode}[/]", f"[dim]{floor.total_s:.2f} s[/]",
            "[dim]1.0×[/]", ""] + ([""] if busy else [])


def _machine_line(machine: MachineProbe) -> str:
    rates = ", ".join(f"{dtype} {rate.flop_s / 1e9:,.1f} GFLOP/s" + ("" if rate.native else " (emulated)")
                      + ("" if rate.float32_sums else " (its float32 mode rounds sums)")
                      for dtype, rate in machine.matmul_flop_s.items())
    flags = " ".join(machine.flags) or "none of avx2/avx512/amx"
    measured = "cached probe" if machine.from_cache else f"probed in {machine.probe_s:.1f} s"
    return (f"machine: {machine.cpu}, {machine.cores} cores ({flags}), {machine.threads} threads: matmul {rates}; "
            f"read {machine.read_bytes_per_s / 1e9:,.1f} GB/s ({measured}; --reprobe measures again)")


def _busy_cell(result: SystemResult) -> str:
    busy = result.busy
    if busy is None or busy.measurement is None:
        return "" if busy is None else f"[red]{busy.status}: {busy.reason}[/]"
    rate, quiet = busy.measurement.decode_tok_s, result.measurement and result.measurement.decode_tok_s
    if rate is None:
        return "-"
    return f"{rate:,.1f}" + (f"\n[dim]{rate / quiet:.2f}× quiet[/]" if quiet else "")


def _with_ratio(text: str, ratio: float | None, name: str) -> str:
    if name == "swarm" or ratio is None:
        return text
    return f"{text}\n[dim]{ratio:.2f}×[/]"
