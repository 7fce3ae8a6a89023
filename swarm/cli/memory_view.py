"""The KV memory table as `swarm inspect-prefix` prints it: one copy of a trunk against N copies."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from swarm.spec.kv_budget import format_bytes
from swarm.trunk.memory_table import MemoryTable

if TYPE_CHECKING:
    from swarm.trunk.report import KvShape

MIB = 2**20


def memory_table_view(memory: MemoryTable) -> Table:
    """The rows of `memory`; the row of the trunk inspected (not a reference length) is marked `*`."""
    budget = "no budget set" if memory.budget_bytes is None else (
        f"{format_bytes(memory.budget_bytes)} = {memory.budget_tokens:,} tokens")
    state = "" if not memory.state_bytes_per_agent else (
        f", + {format_bytes(memory.state_bytes_per_agent)} state per agent")
    snapshot = "" if not memory.state_bytes_per_agent else "; one copy includes the trunk's state snapshot"
    table = Table("prefix", "one copy", f"{memory.agents} copies", "freed", "of budget",
                  "+ctx/agent", "or +agents", title=f"KV memory: {memory.agents} agents, budget {budget}{state}",
                  caption="+agents: each new agent gets the private context an agent has unshared "
                          f"(budget / agents - prefix) unless --context says otherwise{snapshot}")
    for row in memory.rows:
        name = f"{row.trunk_tokens:,}" + ("*" if row.label != "reference" else "")
        share = "-" if row.budget_share is None else f"{row.budget_share:.0%}"
        more_agents = "-" if row.more_agents is None else f"+{row.more_agents}"
        table.add_row(name, format_bytes(row.one_copy_bytes), format_bytes(row.all_copies_bytes),
                      format_bytes(row.freed_bytes), share, f"+{row.more_context_per_agent:,}", more_agents)
    return table


def kv_shape_lines(shape: KvShape, memory: MemoryTable) -> list[str]:
    """How the bytes per KV token come about, and for a hybrid what its linear-attention state takes."""
    layers = f"{shape.layers} full-attention layers" if shape.linear_layers else f"{shape.layers} layers"
    lines = [f"bytes per token = 2 × {layers} × {shape.kv_heads} KV heads × {shape.head_dim} head dim"
             f" × {shape.dtype_bytes} bytes ({memory.dtype}) = {memory.bytes_per_token:,} B"]
    if shape.linear_layers:
        state = memory.state_bytes_per_agent
        lines.append(f"linear-attention state = {state:,} B ({state / MIB:.1f} MiB) per agent "
                     f"({shape.linear_layers} Gated DeltaNet layers): {memory.agents} agents hold "
                     f"{format_bytes(memory.agent_state_bytes)}, shared trunk or not; sharing adds the trunk's "
                     "snapshot (in one copy)")
    return lines
