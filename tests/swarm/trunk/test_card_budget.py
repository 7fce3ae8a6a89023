"""swarm/trunk/card_budget.py: the KV budget a card leaves, for the seed's Qwen3-8B on a 16 GB card."""
import pytest

from engine import EngineOptions, WeightMemory, estimate_weights
from swarm.spec.model_catalog import load_shipped_or_path
from swarm.trunk.card_budget import RUNTIME_RESERVE_BYTES, CardTooSmall, card_budget, prefill_activation_bytes


@pytest.fixture(scope="module")
def qwen3_8b():
    return load_shipped_or_path("Qwen3-8B")


def test_qwen3_8b_q4_k_m_on_a_16_gb_card(qwen3_8b):
    weights = estimate_weights(qwen3_8b, "q4_k_m")
    card = card_budget(16 * 10**9, weights, qwen3_8b, dtype_bytes=2)
    # one prefill step: 2,048 tokens x (2 x 4,096 + 3 x 12,288 + 2 x (4,096 + 2 x 1,024)) x 2 bytes
    assert card.prefill_tokens == EngineOptions().max_num_batched_tokens == 2048
    assert card.activation_bytes == 2048 * (8192 + 36_864 + 12_288) * 2 == 234_881_024
    assert card.reserve_bytes == RUNTIME_RESERVE_BYTES + card.activation_bytes == 2**30 + 234_881_024
    assert card.budget_bytes == 16 * 10**9 - weights.total_bytes - card.reserve_bytes
    budget_tokens = card.to_json(qwen3_8b.kv_bytes_per_token("float16"))["budget_tokens"]
    assert budget_tokens == card.budget_bytes // 147_456 == 65_575   # the seed says "about 55,000"


def test_the_json_names_every_part_and_the_parts_add_up(qwen3_8b):
    card = card_budget(24 * 2**30, WeightMemory(8_000_000_000, {"Q8_0": 8_000_000_000}, "Q8_0"), qwen3_8b, 2)
    figures = card.to_json(bytes_per_token=100)
    assert figures["card_bytes"] == figures["weights_bytes"] + figures["reserve_bytes"] + figures["budget_bytes"]
    assert figures["state_bytes"] == figures["state_slots"] == 0   # a model with KV only
    assert figures["reserve_bytes"] == figures["runtime_bytes"] + figures["activation_bytes"]
    assert figures["budget_tokens"] == figures["budget_bytes"] // 100


def test_activations_grow_with_the_tokens_and_the_dtype(qwen3_8b):
    half = prefill_activation_bytes(qwen3_8b, 2, 1024)
    assert prefill_activation_bytes(qwen3_8b, 2, 2048) == 2 * half
    assert prefill_activation_bytes(qwen3_8b, 4, 1024) == 2 * half


def test_a_card_the_weights_fill_says_so_on_one_line(qwen3_8b):
    weights = estimate_weights(qwen3_8b, "bf16")   # 16.38 GB
    with pytest.raises(CardTooSmall) as info:
        card_budget(16 * 10**9, weights, qwen3_8b, 2)
    message = str(info.value)
    assert "\n" not in message and "16.38 GB, BF16" in message and "--weights" in message


def test_a_hybrid_s_budget_leaves_out_the_state_the_engine_holds_back_for_the_run():
    """Qwen3.5-9B, 8 agents: the engine runs 9 sequences (the agents and the trunk) and holds back a live slot
    and a snapshot slot for each, 18 x 49.1 MiB, before it sizes the KV pool."""
    from engine import state_bytes_per_sequence
    from engine.linear_attention.state_pool import state_reserve_bytes

    config = load_shipped_or_path("Qwen3.5-9B")
    weights = estimate_weights(config, "q4_k_m")
    card = card_budget(16 * 10**9, weights, config, 2, agents=8)
    assert card.state_slots == 18 and state_bytes_per_sequence(config, 2) == 51_511_296
    assert card.state_bytes == 18 * 51_511_296 == state_reserve_bytes(config, 9, 2)
    assert card.budget_bytes == 16 * 10**9 - weights.total_bytes - card.reserve_bytes - card.state_bytes
    one = card_budget(16 * 10**9, weights, config, 2, agents=1)
    assert one.budget_bytes - card.budget_bytes == 14 * 51_511_296   # 7 agents fewer: 14 slots
    figures = card.to_json(bytes_per_token=32_768)
    assert figures["card_bytes"] == (figures["weights_bytes"] + figures["reserve_bytes"] + figures["state_bytes"]
                                     + figures["budget_bytes"])
