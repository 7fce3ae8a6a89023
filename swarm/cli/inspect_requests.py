"""`swarm inspect-prefix --requests DIR|FILE...`: what real requests share, rendered as `swarm serve`
renders them (the API's converter, then the ChatPrompter, with the model's tokenizer; no weights).

    captured bodies -> prompt ids (swarm/server/captured_requests.py)
                    -> trunk, divergences, lint on the system text (swarm/trunk/request_prefix.py)
                    -> the same after --canonicalize, and the memory table for N = the requests
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine import OptionError, load_model_config, load_tokenizer
from swarm.cli.memory_view import kv_shape_lines, memory_table_view
from swarm.server.canonicalize import canonicalize
from swarm.server.captured_requests import SkippedRequest, read_requests, render, render_all
from swarm.server.chat_prompt import ChatPrompter
from swarm.spec.model_catalog import load_shipped_or_path
from swarm.trunk.memory_table import MemoryTable, memory_table
from swarm.trunk.report import KvShape, Sizing, kv_shape, state_bytes
from swarm.trunk.request_prefix import RequestPrefix, request_prefix
from swarm.trunk.volatile_patterns import Volatiles

JSON_SCHEMA_VERSION = 1
STRICT_EXIT_CODE = 1


@dataclass(slots=True)
class RequestsReport:
    model: str
    prefix: RequestPrefix
    skipped: list[SkippedRequest]
    canonicalized: RequestPrefix
    """The same requests as `swarm serve --canonicalize` renders them."""
    moved_chars: dict[str, int]
    """What --canonicalize moves out of the system texts, in characters by rule (all requests)."""
    kv_shape: KvShape
    memory: MemoryTable

    @property
    def clean(self) -> bool:
        """Nothing volatile in the system texts: what `--strict` asks for."""
        return not self.prefix.findings

    def to_json(self) -> dict:
        canonical = {**self.canonicalized.to_json(), "moved_chars": self.moved_chars,
                     "gained_tokens": self.canonicalized.trunk_tokens - self.prefix.trunk_tokens}
        return {"schema_version": JSON_SCHEMA_VERSION, "model": self.model, **self.prefix.to_json(),
                "skipped": [asdict(s) for s in self.skipped], "canonicalize": canonical,
                "kv_shape": asdict(self.kv_shape),
                "memory": asdict(self.memory) | {"budget_tokens": self.memory.budget_tokens}, "clean": self.clean}


def inspect_requests(paths: list[Path], model: str, sizing: Sizing, as_json: bool, strict: bool) -> None:
    report = requests_report(paths, model, sizing)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report, Console())
    if strict and not report.clean:
        raise typer.Exit(STRICT_EXIT_CODE)


def requests_report(paths: list[Path], model: str, sizing: Sizing) -> RequestsReport:
    requests = read_requests(paths)
    tokenizer = load_tokenizer(model)
    prompter = ChatPrompter(tokenizer)
    rendered, skipped = render_all(prompter, requests)
    if not rendered:
        raise OptionError(f"no request to compare: {skipped[0].name}: {skipped[0].reason}")
    volatiles = Volatiles.detect()
    prefix = request_prefix(tokenizer, [r for _, _, r in rendered], volatiles)
    canonical, moved = [], Counter()
    for request, inputs, _ in rendered:
        result = canonicalize(inputs)
        canonical.append(render(prompter, request.name, request.api, result.inputs))
        moved.update({move.rule: len(move.text) for move in result.moves})
    config = load_shipped_or_path(sizing.model_config) if sizing.model_config else load_model_config(model)
    dtype = _kv_dtype(sizing)
    bytes_per_token = config.kv_bytes_per_token(dtype)
    budget = sizing.budget.to_bytes(bytes_per_token) if sizing.budget else None
    table = memory_table(bytes_per_token, sizing.agents or len(rendered), prefix.trunk_tokens, budget, dtype,
                         sizing.references, sizing.private_tokens, state_bytes(config, dtype))
    shape = kv_shape(config, dtype)
    return RequestsReport(model, prefix, skipped, request_prefix(tokenizer, canonical, volatiles), dict(moved),
                          shape, table)


def _kv_dtype(sizing: Sizing) -> str:
    """As inspect-prefix sizes a spec whose dtype is auto: float16 for a shipped config, else the pool
    the engine would keep on this machine."""
    if sizing.model_config:
        return "float16"
    from engine import pick_device, pick_kv_dtype
    return str(pick_kv_dtype("auto", pick_device("auto"))).removeprefix("torch.")


def print_report(report: RequestsReport, console: Console) -> None:
    prefix = report.prefix
    console.print(f"[bold]{len(prefix.branches)} requests[/], rendered as swarm serve renders them with {report.model}")
    console.print(f"trunk: [bold]{prefix.trunk_tokens:,}[/] tokens, sha256 {prefix.trunk_sha256[:16]}… "
                  "(the tokens every request starts with)")
    console.print(_requests_table(prefix))
    _print_divergences(prefix, console)
    for skipped in report.skipped:
        console.print(f"[dim]skipped {escape(skipped.name)} ({skipped.api}): {escape(skipped.reason)}[/]")
    _print_findings(prefix, console)
    console.print(_canonicalize_line(report))
    if report.moved_chars:
        _print_divergences(report.canonicalized, console)
    console.print(memory_table_view(report.memory))
    bytes_line, *state_line = kv_shape_lines(report.kv_shape, report.memory)
    console.print(f"* these requests' trunk. {bytes_line}")
    for line in state_line:
        console.print(line)


def _requests_table(prefix: RequestPrefix) -> Table:
    table = Table("request", "api", "prompt tokens", "diverges at", "from", title="Requests")
    for branch in prefix.branches:
        at = "-" if branch.diverges_at is None else f"{branch.diverges_at:,}"
        table.add_row(escape(branch.name), branch.api, f"{branch.prompt_tokens:,}", at,
                      escape(branch.diverges_from or "-"))
    return table


def _print_divergences(prefix: RequestPrefix, console: Console) -> None:
    """Each pair once: the text before the divergence, then each side's from there (after the |)."""
    shown = set()
    for branch in prefix.branches:
        pair = (branch.diverges_at, frozenset((branch.name, branch.diverges_from)))
        if branch.diverges_at is None or pair in shown:
            continue
        shown.add(pair)
        names = f"{escape(branch.name)} and {escape(branch.diverges_from)}"
        if not branch.after and not branch.other_after:
            console.print(f"{names} are the same prompt, all {branch.diverges_at:,} tokens")
            continue
        console.print(f"{names} part at token {branch.diverges_at:,}:")
        for after in (branch.after, branch.other_after):
            console.print(f"  …{_shown(branch.before)}[bold red]|[/]{_shown(after)}…", soft_wrap=True)


def _shown(text: str) -> str:
    return escape(json.dumps(text, ensure_ascii=False)[1:-1])


def _print_findings(prefix: RequestPrefix, console: Console) -> None:
    if not prefix.findings:
        console.print("[green]prefix lint: nothing volatile in the system texts[/]")
        return
    table = Table("requests", "where", "kind", "text", "token", title="Prefix lint on the system texts",
                  style="yellow")
    for finding in prefix.findings:
        token = "-" if finding.token_index is None else f"{finding.token_index:,}"
        token += " (trunk)" if finding.in_trunk else ""
        table.add_row(escape(_names(finding.requests, len(prefix.branches))),
                      f"system[{finding.message}]:{finding.line}", finding.kind, escape(finding.text), token)
    console.print(table)
    for kind, advice in dict((f.kind, f.advice) for f in prefix.findings).items():
        console.print(f"  [yellow]{kind}[/]: {advice}")


def _names(names: list[str], total: int) -> str:
    return f"all {total}" if len(names) == total and total > 1 else ", ".join(names)


def _canonicalize_line(report: RequestsReport) -> str:
    after, before = report.canonicalized.trunk_tokens, report.prefix.trunk_tokens
    if not report.moved_chars:
        return "--canonicalize: finds nothing to move; the trunk stays as it is"
    moved = ", ".join(f"{rule} {chars:,}" for rule, chars in report.moved_chars.items())
    return (f"--canonicalize: trunk {before:,} -> [bold]{after:,}[/] tokens ({after - before:+,}), "
            f"sha256 {report.canonicalized.trunk_sha256[:16]}…; it moves (chars by rule) {moved}")
