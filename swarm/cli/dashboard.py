"""The live dashboard (rich), the default view when the output is a terminal.

    swarm run              swarm-20261130-063717 · smollm2-135m-instruct · cpu · float16 · weights 96.51 MB · Q4_1
    KV pool (host memory)  41.29 MB used of 199.80 MB
    trunk                  1,328 tokens · 30.60 MB · shared by 4 of 4 agents · saved 94.00 MB against no
                           sharing (peak 94.00 MB) · prefix hit rate 78%
    throughput             33.8 tok/s · 33 s
     agent       state     turn  context    shared  private  tok/s  last tool  shared | private
     fixer       decoding     1    1,456  31.33 MB  2.21 MB    8.4  -          ██████████████████████▒▒
     tester      decoding     1    1,460  31.33 MB  2.58 MB    8.4  -          ██████████████████████▒▒
     documenter  decoding     1    1,458  31.33 MB  2.58 MB    8.4  -          ██████████████████████▒▒
     reviewer-1  decoding     1    1,468  31.33 MB  2.58 MB    8.4  -          ██████████████████████▒▒

Once an agent ends, its state says why (`done (final_answer)`, `done (wall_time)`), and its
shared and private columns show the most KV it held: its blocks are given back by then, so the
final frame would otherwise read zero.

The rows and columns are those the run's backend can fill (swarm/run/facts.py). On a server the
header shows the server and its KV figures from its /metrics ("unavailable" where it has none);
each agent row shows the prompt tokens the server found cached, in all and on the last turn, and
the per-agent shared/private bytes, which only swarm's own engine knows, read "n/a".

The loop calls `refresh()` at most 4 times a second; it only swaps in new figures. Drawing is
done by rich's own refresh thread, which mostly overlaps the model's matrix work (torch
releases the GIL). Measured on the example: decode steps take the same time with or without
it (median 124.9 ms against 126.2 ms); one frame costs about 4.5 ms of CPU.
"""
from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from swarm.agents.agent import Agent, AgentEvent, AgentState
from swarm.cli.plain_view import (
    describe_agents_cache,
    describe_linear_state,
    describe_server_cache,
    describe_server_kv,
    describe_weights,
)
from swarm.run.facts import BackendFacts
from swarm.run.memory import AgentMemory, RunMemory
from swarm.run.summary import RunInfo
from swarm.spec.kv_budget import format_bytes

REFRESH_PER_SECOND = 4
ENDED_CAPTION = "An agent that has ended shows the most KV memory it held."
BAR_WIDTH = 24
STATE_STYLES = {AgentState.QUEUED: "dim", AgentState.PREFILL: "cyan", AgentState.DECODING: "green",
                AgentState.TOOL: "yellow", AgentState.DONE: "bold blue", AgentState.ERROR: "bold red",
                AgentState.INTERRUPTED: "magenta"}


class Dashboard:
    def __init__(self, console: Console | None = None):
        self.console = console or Console()
        self.live: Live | None = None
        self.info: RunInfo | None = None
        self.agents: list[Agent] = []
        self.memory: RunMemory | None = None
        self.tok_per_s = 0.0
        self.started = time.monotonic()
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes = (self.notes + [text])[-2:]
        if self.live is None:
            self.console.print(f"swarm: {text}", highlight=False)

    def start(self, info: RunInfo, agents: list[Agent], memory: RunMemory) -> None:
        self.info, self.agents, self.memory = info, agents, memory
        self.live = Live(console=self.console, get_renderable=self.render, auto_refresh=True,
                         refresh_per_second=REFRESH_PER_SECOND, redirect_stdout=False, redirect_stderr=False)
        self.live.start()

    def event(self, event: AgentEvent) -> None:
        pass  # the figures the next refresh shows already include it

    def refresh(self, tok_per_s: float) -> None:
        self.tok_per_s = tok_per_s

    def close(self, summary: dict) -> None:
        self._stop_live()
        served = "backend" in summary  # a run on a server: each turn's usage says its cached tokens
        shared = describe_agents_cache(self.agents) if served else _trunk_shared(summary["memory"])
        self.console.print(f"{summary['status']}: {len(summary['agents'])} agents, {shared}. Transcripts and "
                           f"summary.json in {summary['run_dir']}", highlight=False)

    def _stop_live(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None

    def render(self) -> Group:
        """Called from rich's refresh thread: it reads the figures, never changes them."""
        if self.info is None or self.memory is None:
            return Group(*[Text(note) for note in self.notes])
        try:
            return self.frame()
        except Exception as err:  # a figure changed under us: draw it next time
            return Group(Text(f"(dashboard: {type(err).__name__}: {err})", style="dim"))

    def frame(self) -> Group:
        return Group(header(self.info, self.memory, self.agents, self.tok_per_s, time.monotonic() - self.started,
                            self.notes[-1:]),
                     agent_table(self.agents, self.memory, self.info.facts))


def header(info: RunInfo, memory: RunMemory, agents: list[Agent], tok_per_s: float, elapsed: float,
           notes: list[str]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, text in header_rows(info, memory, agents):
        grid.add_row(label, text)
    grid.add_row("throughput", f"{tok_per_s:.1f} tok/s · {elapsed:.0f} s")
    for note in notes:
        grid.add_row("", Text(note, style="dim"))
    return grid


def header_rows(info: RunInfo, memory: RunMemory, agents: list[Agent]) -> list[tuple[str, str]]:
    """What the run is and its KV figures, as far as its backend knows them."""
    facts, latest = info.facts, memory.latest
    if info.base_url:
        rows = [("swarm run", f"{info.name} · {info.model} · {facts.kind} server {info.base_url}")]
    else:
        rows = [("swarm run", f"{info.name} · {info.model} · {info.device} · {info.dtype} · "
                              f"{describe_weights(info)}")]
    if facts.server_metrics:
        rows += [("server KV", describe_server_kv(memory)), ("server cache", describe_server_cache(memory))]
    else:
        rows.append((pool_label(info.device), f"{format_bytes(latest.used_bytes)} used of "
                                              f"{format_bytes(latest.total_bytes)}"))
    state = describe_linear_state(latest) if not facts.server_metrics else None
    if state:
        rows.append(("linear state", state))
    if facts.trunk_pinned:
        rows.append(("trunk", f"{memory.trunk_tokens:,} tokens · {format_bytes(memory.trunk_bytes)} · shared by "
                              f"{latest.agents_sharing} of {len(agents)} agents · saved "
                              f"{format_bytes(latest.bytes_saved)} against no sharing (peak "
                              f"{format_bytes(memory.peak.bytes_saved)}) · prefix hit rate {memory.prefix_hit_rate:.0%}"))
    if facts.cached_tokens:
        rows.append(("agents' prompts", describe_agents_cache(agents)))
    return rows


def _trunk_shared(memory: dict) -> str:
    return (f"trunk of {memory['trunk_tokens']} tokens shared, {format_bytes(memory['bytes_saved'])} of KV "
            "saved at the peak")


def pool_label(device: str) -> str:
    return "KV pool (GPU memory)" if device.startswith("cuda") else "KV pool (host memory)"


def agent_table(agents: list[Agent], memory: RunMemory, facts: BackendFacts) -> Table:
    caption = ENDED_CAPTION if facts.per_agent_kv_bytes and any(agent.ended for agent in agents) else None
    table = Table(box=None, padding=(0, 1), header_style="bold", caption=caption, caption_justify="left")
    for column, justify in agent_columns(facts):
        table.add_column(column, justify=justify, no_wrap=True)
    now = time.monotonic()
    bars = {agent.name: bar_parts(agent, memory, facts) for agent in agents}
    scale = max([first + second for first, second in bars.values()] + [1])
    for agent in agents:
        turn = agent.turn if agent.ended else agent.turn + 1
        rate = "-" if agent.ended else f"{agent.throughput.rate(now):.1f}"
        cached = [_cached_total(agent), _last_turn(agent)] if facts.cached_tokens else []
        table.add_row(agent.name, state_text(agent), str(turn), _context(agent), *cached,
                      *_kv_cells(agent, memory, facts), rate, agent.last_tool or "-", memory_bar(*bars[agent.name], scale))
    return table


def agent_columns(facts: BackendFacts) -> list[tuple[str, str]]:
    cached = [("cached", "right"), ("last turn cached", "right")] if facts.cached_tokens else []
    bar = "shared | private" if facts.per_agent_kv_bytes else "cached | computed"
    return [("agent", "left"), ("state", "left"), ("turn", "right"), ("context", "right"), *cached,
            ("shared", "right"), ("private", "right"), ("tok/s", "right"), ("last tool", "left"), (bar, "left")]


def bar_parts(agent: Agent, memory: RunMemory, facts: BackendFacts) -> tuple[int, int]:
    """The two parts of an agent's bar: its shared and private KV bytes, or its last turn's cached
    and computed prompt tokens."""
    if facts.per_agent_kv_bytes:
        return shown_bytes(agent, memory.agents[agent.name])
    cached, prompt = agent.usage.last_cached_tokens or 0, agent.usage.last_prompt_tokens or 0
    return cached, prompt - cached


def _context(agent: Agent) -> str:
    if agent.usage is not None and agent.usage.last_prompt_tokens is None:
        return "-"  # the server has not counted it yet
    return f"{agent.context_tokens:,}"


def _kv_cells(agent: Agent, memory: RunMemory, facts: BackendFacts) -> list[str]:
    if not facts.per_agent_kv_bytes:
        return ["n/a", "n/a"]
    return [format_bytes(part) for part in shown_bytes(agent, memory.agents[agent.name])]


def _cached_total(agent: Agent) -> str:
    usage = agent.usage
    if usage.cached_tokens_total is not None:
        return f"{usage.cached_tokens_total:,}"
    return "unavailable" if usage.last_prompt_tokens is not None else "-"


def _last_turn(agent: Agent) -> str:
    cached, prompt = agent.usage.last_cached_tokens, agent.usage.last_prompt_tokens
    if prompt is None:
        return "-"
    if cached is None:
        return "unavailable"
    return f"{cached:,}/{prompt:,} ({cached / prompt:.0%})" if prompt else "0/0"


def shown_bytes(agent: Agent, kv: AgentMemory) -> tuple[int, int]:
    """The shared and private KV bytes of an agent's row: an ended agent has given its blocks
    back, so it shows the most it held."""
    if agent.ended:
        return kv.peak_shared_bytes, kv.peak_private_bytes
    return kv.shared_bytes, kv.private_bytes


def state_text(agent: Agent) -> Text:
    """The agent's state, and once it has ended, why: "done (wall_time)"."""
    state = agent.display_state
    label = state.value
    if agent.ended and agent.end_reason and agent.end_reason != label:
        label = f"{label} ({agent.end_reason})"
    return Text(label, style=STATE_STYLES[state])


def memory_bar(shared: int, private: int, scale: int, width: int = BAR_WIDTH) -> Text:
    shared_cells = round(width * shared / scale)
    private_cells = min(round(width * private / scale), width - shared_cells)
    if private and not private_cells and shared_cells < width:
        private_cells = 1
    bar = Text()
    bar.append("█" * shared_cells, style="blue")
    bar.append("▒" * private_cells, style="yellow")  # a glyph of its own, so it reads without colour
    bar.append("·" * (width - shared_cells - private_cells), style="dim")
    return bar
