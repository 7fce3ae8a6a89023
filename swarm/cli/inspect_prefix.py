"""`swarm inspect-prefix SPEC`: what the agents share, where they diverge, and what it saves."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from engine import ModelLoadError, SwarmError
from swarm.spec.kv_budget import format_bytes, parse_kv_budget
from swarm.spec.model_catalog import shipped_model_configs
from swarm.trunk.memory_table import REFERENCE_TRUNKS

if TYPE_CHECKING:
    from swarm.trunk.report import PrefixReport

STRICT_EXIT_CODE = 1


class OptionError(SwarmError):
    exit_code = 2


def inspect_prefix_cmd(
    spec: Path = typer.Argument(..., help="The swarm.yaml to inspect (see swarm.yaml.example)."),
    model_config: str = typer.Option(
        None, "--model-config", metavar="NAME|PATH",
        help="Size the memory table for another model: a shipped config "
             f"({', '.join(shipped_model_configs())}) or a path to a config.json. "
             "Token counts still come from the spec's model's tokenizer."),
    agents: int = typer.Option(None, "--agents", min=1, metavar="N",
                               help="Agents to size the memory table for. Default: the spec's agents."),
    budget: str = typer.Option(None, "--budget", metavar="SIZE|TOKENS",
                               help="KV budget for the share column, like 8.09GB, 6GiB or 20000 (tokens). "
                                    "Default: the spec's kv_budget."),
    context: int = typer.Option(None, "--context", min=1, metavar="TOKENS",
                                help="Private context per agent for the 'more agents' headroom. "
                                     "Default: what each agent gets unshared (budget / agents - trunk)."),
    references: str = typer.Option(",".join(map(str, REFERENCE_TRUNKS)), "--reference-trunks",
                                   metavar="T1,T2,...", help="Reference trunk lengths for the table."),
    strict: bool = typer.Option(False, "--strict",
                                help="Exit 1 when lint finds anything or agents diverge inside the trunk."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (schema in the README)."),
) -> None:
    """Show the shared prompt trunk of a swarm without loading any weights.

    Trunk: its length in tokens and the sha256 of its token ids, the same for every agent.

    Agents: the token where each agent's prompt leaves the others, and why.

    Prefix lint: dates, times, ids, paths, hostnames, branches, PIDs or per-agent variables in the trunk.

    KV memory: bytes per token, one copy of the trunk, N copies, freed by sharing, share of the budget.

    Example: swarm inspect-prefix swarm.yaml --model-config Qwen3-8B --agents 8 --budget 8.09GB
    """
    from swarm.trunk.report import inspect_prefix  # imports torch (the tokenizer and config loaders)

    try:
        report = inspect_prefix(spec, model_config, agents, _budget(budget), context, _references(references))
    except ModelLoadError as err:
        if model_config is None:
            raise
        raise OptionError(f"--model-config: {err}") from None
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_report(report, Console())
    if strict and not report.clean:
        raise typer.Exit(STRICT_EXIT_CODE)


def _budget(raw: str | None):
    if raw is None:
        return None
    try:
        return parse_kv_budget(int(raw) if raw.strip().isdigit() else raw)
    except ValueError as err:
        raise OptionError(f"--budget: {err}") from None


def _references(raw: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        raise OptionError(f"--reference-trunks: {raw!r} is not a comma-separated list of token counts") from None
    if any(length <= 0 for length in lengths):
        raise OptionError("--reference-trunks: every length must be more than zero")
    return lengths


def _print_report(report: PrefixReport, console: Console) -> None:
    console.print(f"[bold]{report.spec}[/]: model {report.model}, harness {report.harness}")
    console.print(f"trunk: [bold]{report.trunk_tokens:,}[/] tokens, sha256 {report.trunk_sha256[:16]}…, "
                  f"tools ({report.tools_mode}): {', '.join(report.tools) or 'none'}")
    if report.system_tokens != report.trunk_tokens:
        console.print(f"[red]the system message is {report.system_tokens:,} tokens, but only the first "
                      f"{report.trunk_tokens:,} are shared by every agent[/]")
    console.print(_agents_table(report))
    _print_findings(report, console)
    console.print(_memory_table(report))
    shape, memory = report.kv_shape, report.memory
    console.print(f"* this swarm's trunk. bytes per token = 2 × {shape.layers} layers × {shape.kv_heads} KV heads"
                  f" × {shape.head_dim} head dim × {shape.dtype_bytes} bytes ({memory.dtype})"
                  f" = {memory.bytes_per_token:,} B, from {report.model_config}")


def _agents_table(report: PrefixReport) -> Table:
    table = Table("agent", "prompt tokens", "suffix tokens", "diverges at", "where and why", title="Agents")
    for agent in report.agents:
        at = "-" if agent.diverges_at is None else f"{agent.diverges_at:,}"
        style = "red" if agent.in_trunk else ""
        table.add_row(agent.name, f"{agent.prompt_tokens:,}", f"{agent.suffix_tokens:,}", at,
                      f"[{style}]{agent.reason}[/]" if style else agent.reason)
    return table


def _print_findings(report: PrefixReport, console: Console) -> None:
    if not report.findings:
        console.print("[green]prefix lint: no findings; the trunk is the same for every agent and every run[/]")
        return
    table = Table("source", "kind", "text", "token", title="Prefix lint", style="yellow")
    for finding in report.findings:
        where = finding.source if finding.line is None else f"{finding.source}:{finding.line}"
        table.add_row(where, finding.kind, finding.text, f"{finding.token_index:,}")
    console.print(table)
    for kind, advice in dict((f.kind, f.advice) for f in report.findings).items():
        console.print(f"  [yellow]{kind}[/]: {advice}")


def _memory_table(report: PrefixReport) -> Table:
    memory = report.memory
    budget = "no budget set" if memory.budget_bytes is None else (
        f"{format_bytes(memory.budget_bytes)} = {memory.budget_tokens:,} tokens")
    table = Table("prefix", "one copy", f"{memory.agents} copies", "freed", "of budget",
                  "+ctx/agent", "or +agents", title=f"KV memory: {memory.agents} agents, budget {budget}",
                  caption="+agents: each new agent gets the private context an agent has unshared "
                          "(budget / agents - prefix) unless --context says otherwise")
    for row in memory.rows:
        name = f"{row.trunk_tokens:,}" + ("*" if row.label == "this swarm" else "")
        share = "-" if row.budget_share is None else f"{row.budget_share:.0%}"
        more_agents = "-" if row.more_agents is None else f"+{row.more_agents}"
        table.add_row(name, format_bytes(row.one_copy_bytes), format_bytes(row.all_copies_bytes),
                      format_bytes(row.freed_bytes), share, f"+{row.more_context_per_agent:,}", more_agents)
    return table
