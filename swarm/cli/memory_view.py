"""The KV memory table as `swarm inspect-prefix` prints it: one copy of a trunk against N copies."""
from __future__ import annotations

from rich.table import Table

from swarm.spec.kv_budget import format_bytes
from swarm.trunk.memory_table import MemoryTable


def memory_table_view(memory: MemoryTable) -> Table:
    """The rows of `memory`; the row of the trunk inspected (not a reference length) is marked `*`."""
    budget = "no budget set" if memory.budget_bytes is None else (
        f"{format_bytes(memory.budget_bytes)} = {memory.budget_tokens:,} tokens")
    table = Table("prefix", "one copy", f"{memory.agents} copies", "freed", "of budget",
                  "+ctx/agent", "or +agents", title=f"KV memory: {memory.agents} agents, budget {budget}",
                  caption="+agents: each new agent gets the private context an agent has unshared "
                          "(budget / agents - prefix) unless --context says otherwise")
    for row in memory.rows:
        name = f"{row.trunk_tokens:,}" + ("*" if row.label != "reference" else "")
        share = "-" if row.budget_share is None else f"{row.budget_share:.0%}"
        more_agents = "-" if row.more_agents is None else f"+{row.more_agents}"
        table.add_row(name, format_bytes(row.one_copy_bytes), format_bytes(row.all_copies_bytes),
                      format_bytes(row.freed_bytes), share, f"+{row.more_context_per_agent:,}", more_agents)
    return table
