"""What each agent of an external harness is doing, for the dashboard and the plain lines: its state, its
requests and their cached tokens, its context and its KV, read off the exchange log (swarm/run/exchange_log.py),
the engine's KV rows of its requests in flight (swarm/run/memory.py `by_agent`) and its CLI's process.

    state                  when
    queued                 its CLI waits to start (the first agent's trunk request is being computed)
    starting               its CLI runs and has sent nothing yet
    waiting on the model   a request is in flight and no token of the reply is out: queued or prefilling
    generating             a request is in flight and its reply is being decoded
    waiting on its harness its CLI is between requests: running a tool, thinking, writing files
    exited (N)             its CLI exited with code N by itself
    stopped (why)          swarm stopped it: max_turns, max_tokens, wall_time, interrupted
"""
from __future__ import annotations

from dataclasses import dataclass

from swarm.run.exchange_log import AgentCounts
from swarm.run.harness_process import HarnessProcess
from swarm.run.memory import AgentMemory, RunMemory


@dataclass(frozen=True, slots=True)
class HarnessAgentRow:
    name: str
    state: str
    requests: int
    answered: int
    context_tokens: int
    cached_tokens: int
    last_cached: tuple[int, int] | None
    """The last answered request's cached and prompt tokens."""
    shared_bytes: int
    private_bytes: int
    generated_tokens: int
    exit_code: int | None


@dataclass(slots=True)
class HarnessRunInfo:
    """What the run is, for the view's header."""
    name: str
    model: str
    device: str
    dtype: str
    weights: str
    harness: str
    api: str
    agents: int
    url: str
    workspace_path: str


@dataclass(slots=True)
class HarnessFigures:
    """One refresh's figures: the rows, and the run's memory (its trunk among them)."""
    rows: list[HarnessAgentRow]
    memory: RunMemory


def agent_row(name: str, process: HarnessProcess, counts: AgentCounts, kv: AgentMemory,
              end: str | None) -> HarnessAgentRow:
    """`end`: why swarm stopped its CLI, if it did."""
    if counts.in_flight:
        shared, private = kv.shared_bytes, kv.private_bytes
    else:
        shared, private = kv.peak_shared_bytes, kv.peak_private_bytes
    last = None if counts.last is None else (counts.last[1], counts.last[0])
    return HarnessAgentRow(name, agent_state(process, counts, kv, end), counts.requests, len(counts.cached_tokens),
                           context_tokens(counts, kv), sum(counts.cached_tokens), last, shared, private,
                           counts.generated_tokens, process.exit_code)


def agent_state(process: HarnessProcess, counts: AgentCounts, kv: AgentMemory, end: str | None) -> str:
    if process.pid is None:
        return "queued"
    code = process.exit_code
    if code is not None:
        return f"stopped ({end})" if end else f"exited ({code})"
    if counts.in_flight:
        prompt = sum(counts.in_flight.values())
        return "generating" if kv.shared_tokens + kv.private_tokens > prompt else "waiting on the model"
    return "starting" if not counts.requests else "waiting on its harness"


def context_tokens(counts: AgentCounts, kv: AgentMemory) -> int:
    """The tokens of its request in flight (prompt and reply so far), else of its last answered one."""
    if counts.in_flight:
        return max(kv.shared_tokens + kv.private_tokens, max(counts.in_flight.values()))
    if counts.last is None:
        return 0
    prompt, _, generated = counts.last
    return prompt + generated
