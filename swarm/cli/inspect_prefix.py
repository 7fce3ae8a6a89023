"""`swarm inspect-prefix [SPEC]`: what the agents share, where they diverge, and what it saves; with
`--weights` and `--card`, the KV budget a card leaves once the weights and the runtime are in; with
`--requests`, the same for request bodies real clients sent (swarm/cli/inspect_requests.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from engine import DEFAULT_MODEL, ModelLoadError, SwarmError
from swarm.cli.memory_view import kv_shape_lines, memory_table_view
from swarm.spec.kv_budget import format_bytes, parse_card_size, parse_kv_budget
from swarm.spec.model_catalog import shipped_model_configs
from swarm.trunk.memory_table import REFERENCE_TRUNKS

if TYPE_CHECKING:
    from swarm.trunk.card_budget import CardBudget
    from swarm.trunk.report import PrefixReport, SizedWeights

STRICT_EXIT_CODE = 1


class OptionError(SwarmError):
    exit_code = 2


def inspect_prefix_cmd(
    spec: list[Path] = typer.Argument(None, show_default=False, metavar="[SPEC | REQUESTS...]",
                                      help="The swarm.yaml to inspect (see swarm.yaml.example). Optional with "
                                           "--model-config: the memory table then has the reference trunks only. "
                                           "With --requests: request bodies (.json files, or folders of them)."),
    model_config: str = typer.Option(
        None, "--model-config", metavar="NAME|PATH",
        help="Size the memory table for another model: a shipped config "
             f"({', '.join(shipped_model_configs())}) or a path to a config.json. "
             "Token counts still come from the spec's model's tokenizer."),
    agents: int = typer.Option(None, "--agents", min=1, metavar="N",
                               help="Agents to size the memory table for. Default: the spec's agents, "
                                    "or 8 without a spec."),
    budget: str = typer.Option(None, "--budget", metavar="SIZE|TOKENS",
                               help="KV budget for the share column, like 8.09GB, 6GiB or 20000 (tokens). "
                                    "Default: the spec's kv_budget. Not with --card."),
    weights: str = typer.Option(None, "--weights", metavar="TYPE",
                                help="Size the weights as a llama.cpp file of this type: f32, f16, bf16, q8_0, "
                                     "q6_k, q5_k_m, q4_k_m, q5_1, q5_0, q4_1 or q4_0 (estimated from the config). "
                                     "Default with --card: what the engine would hold (a GGUF file's own "
                                     "tensors, else the spec's weights or dtype)."),
    card: str = typer.Option(None, "--card", metavar="SIZE",
                             help="The GPU's memory, like 16GB or 16GiB: the KV budget is what it leaves after "
                                  "the weights and a runtime reserve (see the README). Not with --budget."),
    context: int = typer.Option(None, "--context", min=1, metavar="TOKENS",
                                help="Private context per agent for the 'more agents' headroom. "
                                     "Default: what each agent gets unshared (budget / agents - trunk)."),
    references: str = typer.Option(",".join(map(str, REFERENCE_TRUNKS)), "--reference-trunks",
                                   metavar="T1,T2,...", help="Reference trunk lengths for the table."),
    strict: bool = typer.Option(False, "--strict",
                                help="Exit 1 when lint finds anything or agents diverge inside the trunk."),
    requests: bool = typer.Option(False, "--requests",
                                  help="Inspect request bodies clients sent (`swarm serve --capture DIR` writes them; "
                                       "chat completions, Anthropic messages, OpenAI responses) instead of a spec: "
                                       "their common trunk, where each diverges, lint on their system text, what "
                                       "--canonicalize gains, the memory table for as many agents as requests."),
    model: str = typer.Option(None, "--model", "-m", show_default=False,
                              help="With --requests: the model whose tokenizer and chat template render them, as "
                                   f"`swarm serve --model` would. Default: {DEFAULT_MODEL}."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (schema in the README)."),
) -> None:
    """Show the shared prompt trunk of a swarm without loading any weights.

    Trunk: its length in tokens and the sha256 of its token ids, the same for every agent.

    Agents: the token where each agent's prompt leaves the others, and why.

    Prefix lint: dates, times, ids, paths, hostnames, branches, PIDs or per-agent variables in the trunk.

    KV memory: bytes per token, one copy of the trunk, N copies, freed by sharing, share of the budget.

    Weights and card (--weights, --card): the weights' bytes, the card, the runtime reserve, a hybrid's
    linear state for the agents, and the KV budget they leave, which the memory table is then sized against.

    Example: swarm inspect-prefix swarm.yaml --model-config Qwen3-8B --agents 8 --budget 8.09GB

    Example: swarm inspect-prefix --model-config Qwen3-8B --weights q4_k_m --card 16GB

    Example: swarm inspect-prefix --requests captures/ --model Qwen/Qwen3-8B
    """
    if requests:
        return _inspect_requests(spec, model, as_json, strict,
                                 _sizing(model_config, agents, budget, context, references, weights, card))
    spec = _one_spec(spec, model, model_config)
    sizing = _sizing(model_config, agents, budget, context, references, weights, card)
    from swarm.trunk.card_budget import CardTooSmall
    from swarm.trunk.report import inspect_prefix

    try:
        report = inspect_prefix(spec, sizing)
    except ModelLoadError as err:
        if model_config is None:
            raise
        raise OptionError(f"--model-config: {err}") from None
    except CardTooSmall as err:
        raise OptionError(f"--card: {err}") from None
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_report(report, Console())
    if strict and not report.clean:
        raise typer.Exit(STRICT_EXIT_CODE)


def _inspect_requests(paths: list[Path], model: str | None, as_json: bool, strict: bool, sizing) -> None:
    if sizing.weights or sizing.card_bytes:
        raise OptionError("--weights and --card size a card for a spec; with --requests, give --budget")
    from swarm.cli.inspect_requests import inspect_requests

    inspect_requests(list(paths or []), model or DEFAULT_MODEL, sizing, as_json, strict)


def _one_spec(paths: list[Path] | None, model: str | None, model_config: str | None) -> Path | None:
    if model is not None:
        raise OptionError("--model renders --requests; a spec names its own model (size another with --model-config)")
    if len(paths or []) > 1:
        raise OptionError("give one swarm.yaml (or --requests, to inspect request bodies)")
    if not paths and model_config is None:
        raise OptionError("give a swarm.yaml to inspect, or --model-config NAME to size a model without one")
    return paths[0] if paths else None


def _sizing(model_config, agents, budget, context, references, weights, card):
    """The options, each mistake a one-line usage error found before torch is imported."""
    if budget is not None and card is not None:
        raise OptionError("--budget and --card both set the KV budget; give one of them")
    checked = dict(budget=_budget(budget), references=_references(references), weights=_weights(weights),
                   card_bytes=_card(card))
    from swarm.trunk.report import Sizing  # imports torch

    return Sizing(model_config=model_config, agents=agents, private_tokens=context, **checked)


def _weights(raw: str | None) -> str | None:
    if raw is None:
        return None
    from engine import WEIGHT_FILE_TYPES

    if raw.lower() not in WEIGHT_FILE_TYPES:
        raise OptionError(f"--weights: {raw!r} is not a file type swarm can size; use one of "
                          f"{', '.join(WEIGHT_FILE_TYPES)}")
    return raw.lower()


def _card(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return parse_card_size(raw)
    except ValueError as err:
        raise OptionError(f"--card: {err}") from None


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
    if report.spec is None:
        console.print(f"[bold]{report.model_config}[/]: no spec, so the memory table has the reference trunks "
                      "only; give a swarm.yaml to see its own trunk")
    else:
        _print_trunk(report, console)
    if report.weights is not None:
        console.print(_weights_line(report.weights, report.model_config))
    if report.card is not None:
        console.print(_card_line(report.card, report.memory.bytes_per_token))
    console.print(memory_table_view(report.memory))
    mark = "* this swarm's trunk. " if report.spec is not None else ""
    bytes_line, *state_line = kv_shape_lines(report.kv_shape, report.memory)
    console.print(f"{mark}{bytes_line}, from {report.model_config}")
    for line in state_line:
        console.print(line)


def _print_trunk(report: PrefixReport, console: Console) -> None:
    console.print(f"[bold]{report.spec}[/]: model {report.model}, harness {report.harness}")
    console.print(f"trunk: [bold]{report.trunk_tokens:,}[/] tokens, sha256 {report.trunk_sha256[:16]}…, "
                  f"tools ({report.tools_mode}): {', '.join(report.tools) or 'none'}")
    if report.system_tokens != report.trunk_tokens:
        console.print(f"[red]the system message is {report.system_tokens:,} tokens, but only the first "
                      f"{report.trunk_tokens:,} are shared by every agent[/]")
    console.print(_agents_table(report))
    _print_findings(report, console)


def _weights_line(weights: SizedWeights, model_config: str) -> str:
    memory = weights.memory
    source = (f"estimated: llama.cpp's {memory.label} tensor types on {model_config}'s shapes"
              if weights.source == "estimate" else "the file's own tensors, from its header")
    return f"weights {format_bytes(memory.total_bytes)} · {memory.label} [dim]({source})[/]"


def _card_line(card: CardBudget, bytes_per_token: int) -> str:
    return (f"card {format_bytes(card.card_bytes)} − weights {format_bytes(card.weights.total_bytes)} − runtime "
            f"reserve {format_bytes(card.reserve_bytes)} ({format_bytes(card.runtime_bytes)} for the runtime + "
            f"{format_bytes(card.activation_bytes)} of activations in a {card.prefill_tokens:,}-token prefill step) "
            f"{_state_term(card)}= KV budget "
            f"[bold]{format_bytes(card.budget_bytes)}[/] = {card.budget_bytes // bytes_per_token:,} tokens")


def _state_term(card: CardBudget) -> str:
    if not card.state_bytes:
        return ""
    return (f"− linear state {format_bytes(card.state_bytes)} ({card.state_slots} slots of "
            f"{format_bytes(card.state_bytes // card.state_slots)}: each agent's and the trunk's, and as many "
            "snapshots) ")


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
