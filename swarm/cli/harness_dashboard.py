"""How a run of an external harness shows itself (swarm/run/external_run.py): a live table in a terminal,

    swarm run              real3-20261202-160105 · harness-model · cpu · float32 · weights 103.2 MB · F32
    harness                claude-code (anthropic) · 3 agents · http://127.0.0.1:40213 · one workspace path
    KV pool (host memory)  31.92 MB used of 1.07 GB
    trunk                  19,808 tokens pinned · 30.95 MB · shared by 3 of 3 agents in flight
    sharing                holding 31.92 MB for what would be 94.29 MB without it (peak: 31.9 MB, 94.3 MB)
     agent    state                  requests  context  cached  last request cached    shared  private  exit
     agent-1  generating                    3   20,032  39,754  19,918/20,020 (99%)  30.95 MB  99.0 kB     -
     agent-2  waiting on the model          3   20,016  39,637  19,821/19,916 (100%) 30.95 MB  76.0 kB     -
     agent-3  waiting on its harness        2   19,925  39,680  19,864/19,916 (100%) 30.95 MB  76.0 kB     -

and plain lines elsewhere (`--no-tui`, a pipe, `--json`): what the run does, and one line per answered request.
Between requests and once it ended, an agent's shared and private columns show the most KV it held: its
blocks are back in the prefix cache by then, and the live figure would read zero.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from swarm.cli.dashboard import memory_bar, pool_label
from swarm.cli.plain_view import describe_linear_state
from swarm.run.harness_agents import HarnessAgentRow, HarnessFigures, HarnessRunInfo
from swarm.run.memory import RunMemory
from swarm.spec.kv_budget import format_bytes

REFRESH_PER_SECOND = 4
CAPTION = "Between requests, and once it ended, an agent shows the most KV memory it held."
STATE_STYLES = {"queued": "dim", "starting": "dim", "waiting on the model": "cyan", "generating": "green",
                "waiting on its harness": "yellow", "exited": "bold blue", "stopped": "magenta"}


def header_rows(info: HarnessRunInfo, figures: HarnessFigures) -> list[tuple[str, str]]:
    memory, latest = figures.memory, figures.memory.latest
    rows = [("swarm run", f"{info.name} · {info.model} · {info.device} · {info.dtype} · {info.weights}"),
            ("harness", f"{info.harness} ({info.api}) · {info.agents} agents · {info.url} · {info.workspace_path}"),
            (pool_label(info.device), f"{format_bytes(latest.used_bytes)} used of {format_bytes(latest.total_bytes)}")]
    state = describe_linear_state(latest)
    if state:
        rows.append(("linear state", state))
    if memory.trunk_tokens:
        readers = (f"shared by {latest.agents_sharing} of {latest.agents_with_kv} agents in flight"
                   if latest.agents_with_kv else "no request in flight")
        rows.append(("trunk", f"{memory.trunk_tokens:,} tokens pinned · {format_bytes(memory.trunk_bytes)} · {readers}"))
    else:
        rows.append(("trunk", "not pinned yet: it is the tokens the first two agents' first requests share"))
    rows.append(("sharing", sharing_text(memory)))
    return rows


def sharing_text(memory: RunMemory) -> str:
    latest, peak = memory.latest, memory.peak
    now = (f"holding {format_bytes(latest.used_bytes)} for what would be {format_bytes(latest.bytes_without_sharing)}"
           " without it" if latest.agents_with_kv else f"holding {format_bytes(latest.used_bytes)}, no request in flight")
    return (f"{now} (peak saving: {format_bytes(peak.used_bytes)} for {format_bytes(peak.bytes_without_sharing)}) · "
            f"prefix hit rate {memory.prefix_hit_rate or 0:.0%}")


def agent_table(rows: list[HarnessAgentRow]) -> Table:
    table = Table(box=None, padding=(0, 1), header_style="bold", caption=CAPTION, caption_justify="left")
    for column, justify in COLUMNS:
        table.add_column(column, justify=justify, no_wrap=True)
    scale = max([row.shared_bytes + row.private_bytes for row in rows] + [1])
    for row in rows:
        table.add_row(row.name, state_text(row.state), f"{row.requests:,}", f"{row.context_tokens:,}",
                      f"{row.cached_tokens:,}", last_cached_text(row.last_cached), format_bytes(row.shared_bytes),
                      format_bytes(row.private_bytes), "-" if row.exit_code is None else str(row.exit_code),
                      memory_bar(row.shared_bytes, row.private_bytes, scale))
    return table


COLUMNS = [("agent", "left"), ("state", "left"), ("requests", "right"), ("context", "right"), ("cached", "right"),
           ("last request cached", "right"), ("shared", "right"), ("private", "right"), ("exit", "right"),
           ("shared | private", "left")]


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLES.get(state.split(" (")[0], ""))


def last_cached_text(last: tuple[int, int] | None) -> str:
    if last is None:
        return "-"
    cached, prompt = last
    return f"{cached:,}/{prompt:,} ({cached / prompt:.0%})" if prompt else "0/0"


class HarnessDashboard:
    """The live table; rich's refresh thread draws it from the figures `update` swaps in."""

    def __init__(self, console: Console):
        self.console = console
        self.info: HarnessRunInfo | None = None
        self.figures: HarnessFigures | None = None
        self.notes: list[str] = []
        self.live: Live | None = None

    def say(self, text: str) -> None:
        self.notes = (self.notes + [text])[-2:]
        if self.live is None:
            self.console.print(f"swarm: {text}", highlight=False)

    def start(self, info: HarnessRunInfo) -> None:
        self.info = info
        self.live = Live(console=self.console, get_renderable=self.render, auto_refresh=True,
                         refresh_per_second=REFRESH_PER_SECOND, redirect_stdout=False, redirect_stderr=False)
        self.live.start()

    def update(self, figures: HarnessFigures) -> None:
        self.figures = figures

    def close(self, summary: dict) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None
        self.console.print(closing_line(summary), highlight=False)

    def render(self) -> Group:
        if self.info is None or self.figures is None:
            return Group(*[Text(note) for note in self.notes])
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for label, text in header_rows(self.info, self.figures):
            grid.add_row(label, text)
        for note in self.notes[-1:]:
            grid.add_row("", Text(note, style="dim"))
        return Group(grid, agent_table(self.figures.rows))


class HarnessLines:
    """Plain lines: what the run does, each answered request, each CLI's exit."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.start_time = time.monotonic()
        self.answered: dict[str, int] = {}
        self.ended: set[str] = set()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start_time:7.1f}s] {text}", file=self.stream, flush=True)

    def start(self, info: HarnessRunInfo) -> None:
        self.say(f"run {info.name}: {info.agents} {info.harness} agents on {info.model} ({info.device}, "
                 f"{info.dtype}, {info.weights}), served at {info.url}; workspaces: {info.workspace_path}")

    def update(self, figures: HarnessFigures) -> None:
        for row in figures.rows:
            if row.answered > self.answered.get(row.name, 0) and row.last_cached is not None:
                self.answered[row.name] = row.answered
                cached, prompt = row.last_cached
                self.say(f"{row.name} request {row.answered} answered: {cached:,} of {prompt:,} prompt tokens "
                         f"cached, {row.generated_tokens:,} generated in all")
            if row.exit_code is not None and row.name not in self.ended:
                self.ended.add(row.name)
                self.say(f"{row.name} {row.state}")

    def close(self, summary: dict) -> None:
        self.say(closing_line(summary))


def closing_line(summary: dict) -> str:
    peak = (summary.get("memory") or {}).get("peak") or {}
    trunk = summary.get("trunk") or {}
    return (f"{summary['status']}: {len(summary['agents'])} agents, a trunk of {trunk.get('tokens', 0):,} tokens "
            f"pinned; at the peak saving they held {format_bytes(peak.get('used_bytes', 0))} of KV for "
            f"{format_bytes(peak.get('bytes_without_sharing', 0))} without sharing. Transcripts and summary.json "
            f"in {summary['run_dir']}")
