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


# Qwen3.5-9B (issue 22): KV in its 8 full-attention layers only, 49.1 MiB of linear-attention state per sequence
QWEN35_KV_PER_TOKEN = 2 * 8 * 4 * 256 * 2                      # K and V x 8 layers x 4 KV heads x 256 x fp16
QWEN35_STATE = 24 * ((2 * 16 * 128 + 32 * 128) * 3 * 2         # conv: 8,192 channels x (kernel 4 - 1) x fp16
                     + 32 * 128 * 128 * 4)                     # recurrent: 32 value heads x 128 x 128 x float32


def test_qwen35_9b_config_gives_32_kib_per_token_and_49_mib_of_state():
    from engine import state_bytes_per_sequence

    config = load_shipped_or_path("Qwen3.5-9B")
    assert config.kv_layers == [3, 7, 11, 15, 19, 23, 27, 31] and len(config.linear_layers) == 24
    assert config.kv_bytes_per_token("bfloat16") == QWEN35_KV_PER_TOKEN == 32 * 1024
    assert state_bytes_per_sequence(config, 2) == QWEN35_STATE == 51_511_296 == 1572 * QWEN35_KV_PER_TOKEN
    assert QWEN35_STATE / 2**20 == pytest.approx(49.1, abs=0.05)


def test_qwen35_9b_table_counts_the_trunks_snapshot_once_and_every_agents_state():
    table = memory_table(QWEN35_KV_PER_TOKEN, agents=8, budget_bytes=BUDGET, state_bytes=QWEN35_STATE)
    row = next(r for r in table.rows if r.trunk_tokens == 4000)
    trunk_kv = 4000 * 32_768                                       # 131,072,000 B
    assert row.one_copy_bytes == trunk_kv + 51_511_296 == 182_583_296
    assert row.all_copies_bytes == 8 * trunk_kv == 1_048_576_000
    assert row.freed_bytes == 7 * trunk_kv - 51_511_296 == 865_992_704
    assert row.freed_tokens == 7 * 4000 - 1572 == 26_428
    assert row.more_context_per_agent == 26_428 // 8 == 3_303
    assert row.budget_share == pytest.approx(865_992_704 / 8.09e9)
    # unshared, each agent's share of the KV budget (the states lie beside it, as the engine keeps them):
    # 8.09 GB / 32,768 B / 8 - 4,000
    assert row.private_tokens_per_agent == 8_090_000_000 // 32_768 // 8 - 4000 == 26_860
    assert row.more_agents == 865_992_704 // (26_860 * 32_768 + 51_511_296) == 0
    assert table.agent_state_bytes == 8 * 51_511_296 and table.state_bytes_per_agent == QWEN35_STATE


@given(st.integers(1, 10**6), st.integers(1, 64), st.integers(1, 200_000), st.integers(10**6, 10**11),
       st.integers(0, 10**8))
def test_sharing_arithmetic_with_a_state_per_agent(bytes_per_token, agents, trunk, budget, state):
    row = memory_row("reference", trunk, bytes_per_token, agents, budget, state_bytes=state)
    assert row.all_copies_bytes == agents * trunk * bytes_per_token
    assert row.freed_bytes == row.all_copies_bytes - row.one_copy_bytes
    assert row.freed_tokens == max(row.freed_bytes, 0) // bytes_per_token
    assert row.more_context_per_agent * agents <= row.freed_tokens
    without = memory_row("reference", trunk, bytes_per_token, agents, budget)
    assert without.freed_bytes - row.freed_bytes == state    # the snapshot is what sharing costs a hybrid
