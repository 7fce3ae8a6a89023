import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm.spec.kv_budget import format_bytes, parse_kv_budget
from swarm.spec.model_catalog import load_shipped_or_path
from swarm.trunk.memory_table import REFERENCE_TRUNKS, memory_row, memory_table

BUDGET = parse_kv_budget("8.09GB").bytes

# The article's table: shared prefix, one copy, eight copies, freed by sharing, share of 8.09 GB.
ARTICLE = [
    (2000, "0.29 GB", "2.35 GB", "2.06 GB", "25%"),
    (3000, "0.44 GB", "3.53 GB", "3.09 GB", "38%"),
    (4000, "0.59 GB", "4.70 GB", "4.12 GB", "51%"),
    (6000, "0.88 GB", "7.06 GB", "6.17 GB", "76%"),
]


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def test_qwen3_8b_costs_147456_bytes_per_fp16_kv_token():
    config = load_shipped_or_path("Qwen3-8B")
    assert (config.num_layers, config.num_kv_heads, config.head_dim) == (36, 8, 128)
    assert config.kv_bytes_per_token("float16") == 2 * 36 * 8 * 128 * 2 == 147_456


def test_reproduces_the_articles_table_at_its_rounded_147_kb_per_token():
    """The article rounds 147,456 B to "147 KB" (147,000 B) before multiplying; so do we here."""
    table = memory_table(147_000, agents=8, budget_bytes=BUDGET)
    got = [(r.trunk_tokens, gb(r.one_copy_bytes), gb(r.all_copies_bytes), gb(r.freed_bytes),
            f"{r.budget_share:.0%}") for r in table.rows]
    assert got == ARTICLE


def test_qwen3_8b_config_gives_the_articles_table_within_half_a_percent():
    bytes_per_token = load_shipped_or_path("Qwen3-8B").kv_bytes_per_token("float16")
    table = memory_table(bytes_per_token, agents=8, budget_bytes=BUDGET)
    assert [r.trunk_tokens for r in table.rows] == list(REFERENCE_TRUNKS)
    for row, (_, one, eight, freed, share) in zip(table.rows, ARTICLE):
        for value, printed in ((row.one_copy_bytes, one), (row.all_copies_bytes, eight), (row.freed_bytes, freed)):
            assert value / 1e9 == pytest.approx(float(printed.split()[0]), rel=0.005, abs=0.005)
        assert row.budget_share == pytest.approx(int(share[:-1]) / 100, abs=0.01)
    # exact values with 147,456 B/token
    assert [gb(r.all_copies_bytes) for r in table.rows] == ["2.36 GB", "3.54 GB", "4.72 GB", "7.08 GB"]


def test_headroom_matches_the_articles_prose():
    """"about 55,000 tokens of KV budget"; freeing 4.1 GB at 4,000 tokens "is about 28,000 KV tokens"."""
    table = memory_table(147_456, agents=8, budget_bytes=BUDGET)
    assert table.budget_tokens == 54_863
    row = next(r for r in table.rows if r.trunk_tokens == 4000)
    assert row.freed_tokens == 28_000 and row.freed_bytes // 147_456 == 28_000
    assert row.more_context_per_agent == 3_500
    assert row.private_tokens_per_agent == 54_863 // 8 - 4000 == 2_857
    assert row.more_agents == 9


def test_this_swarms_row_comes_first_and_unfitting_swarms_buy_no_agents():
    table = memory_table(147_456, agents=8, trunk_tokens=1234, budget_bytes=BUDGET)
    assert (table.rows[0].label, table.rows[0].trunk_tokens) == ("this swarm", 1234)
    crowded = memory_row("reference", 8000, 147_456, 8, BUDGET)
    assert crowded.private_tokens_per_agent is None and crowded.more_agents is None
    assert memory_row("reference", 4000, 147_456, 8, None).budget_share is None
    assert memory_row("reference", 4000, 147_456, 8, BUDGET, private_tokens=4000).more_agents == 7


@given(st.integers(1, 10**6), st.integers(1, 64), st.integers(1, 200_000), st.integers(10**6, 10**11))
def test_sharing_arithmetic(bytes_per_token, agents, trunk, budget):
    row = memory_row("reference", trunk, bytes_per_token, agents, budget)
    assert row.all_copies_bytes == agents * row.one_copy_bytes
    assert row.freed_bytes == row.all_copies_bytes - row.one_copy_bytes
    assert row.freed_tokens * bytes_per_token == row.freed_bytes
    assert row.budget_share == pytest.approx(row.freed_bytes / budget)
    assert row.more_context_per_agent * agents <= row.freed_tokens


def test_format_bytes_matches_the_article_style():
    assert format_bytes(4_116_000_000) == "4.12 GB"
