"""Qwen3.5's hybrid model in the engine, on tiny random models built by transformers (the logits against
transformers are in test_model.py, over every variant): the KV pool holds only the full-attention layers, and
the greedy tokens do not depend on batching, on how a prompt is cut into chunks, or on preemption (prefix
sharing, from snapshots of the linear state: test_hybrid_prefix_sharing.py)."""
import torch

from engine import LLM, SamplingParams
from engine.hybrid_model import GatedAttention, HybridCausalLM, ZeroCentredRMSNorm
from tests.helpers.engine_runs import prompts_of, run_with_logits
from tests.helpers.tiny_models import load_reference

BLOCK = 16


def test_the_kv_pool_holds_only_the_full_attention_layers(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3_5-odd-tied")), dtype="float32", kv_budget_tokens=256)
    engine, config = llm.engine, llm.config
    net = engine.runner.model
    assert isinstance(net, HybridCausalLM)
    assert config.kv_layers == [1, 3] and len(engine.runner.kv.layers) == 2
    assert [layer.self_attn.layer_index for layer in net.model.layers if hasattr(layer, "self_attn")] == [0, 1]
    assert all(isinstance(layer.self_attn, GatedAttention) for layer in net.model.layers if hasattr(layer, "self_attn"))
    assert isinstance(net.model.norm, ZeroCentredRMSNorm)
    assert engine.kv_bytes_per_token == config.kv_bytes_per_token("float32") == 2 * 2 * 1 * 16 * 4
    assert net.lm_head.weight is net.model.embed_tokens.weight


def test_four_prompts_batched_and_in_mixed_steps_give_the_logits_and_tokens_each_gives_alone(tiny_model_dir):
    folder = str(tiny_model_dir("qwen3_5-odd-tied"))
    prompts = prompts_of([9, 23, 40, 31], seed=1)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    # a small step budget: later prompts are computed in chunks beside the earlier ones' decode rows
    engine = LLM(folder, dtype="float32", kv_budget_tokens=1024, max_num_batched_tokens=24,
                 mixed_step_tokens=24).engine
    batched, mixed_steps = run_with_logits(engine, prompts, params)
    alone = [run_with_logits(engine, [prompt], params)[0][0] for prompt in prompts]   # each reuses a freed slot
    assert mixed_steps >= 3
    assert [tokens for tokens, _ in batched] == [tokens for tokens, _ in alone]
    for (_, logits), (_, logits_alone) in zip(batched, alone):
        torch.testing.assert_close(logits, logits_alone, atol=1e-4, rtol=1e-4)
    assert engine.states.slots_in_use == 0


def test_a_prompt_longer_than_a_prefill_chunk_gives_the_tokens_of_one_chunk_and_the_logits_of_transformers(
        tiny_model_dir):
    folder = tiny_model_dir("qwen3_5")
    prompt = prompts_of([150], seed=2)[0]   # 12 chunks of 13 tokens; the rule's own chunks are 64 long
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    whole = LLM(str(folder), dtype="float32", kv_budget_tokens=512)
    chunked = LLM(str(folder), dtype="float32", kv_budget_tokens=512, max_num_batched_tokens=13)
    seq = chunked.engine.add_request(prompt, params)
    prompt_steps = 0
    while not seq.is_finished:
        prompt_steps += chunked.engine.step().prompt_tokens > 0
    assert prompt_steps == -(-len(prompt) // 13)
    assert seq.output_token_ids == whole.generate([prompt], params)[0].token_ids
    [(tokens, logits)], _ = run_with_logits(chunked.engine, [prompt], params)
    with torch.no_grad():
        expected = load_reference(folder)(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_under_preemption_the_greedy_tokens_stay_the_same(tiny_model_dir):
    folder = str(tiny_model_dir("qwen3_5-linear-last"))
    prompts = prompts_of([60] * 6, seed=3)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    roomy = LLM(folder, dtype="float32", kv_budget_tokens=8192).generate(prompts, params)
    # three prompts fit at once, but not three prompts grown by 40 tokens each
    tight = LLM(folder, dtype="float32", kv_budget_tokens=13 * BLOCK, max_num_batched_tokens=256)
    outputs = tight.generate(prompts, params)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outputs] == [o.token_ids for o in roomy]
    assert tight.engine.states.slots_in_use == 0 and tight.kv_stats().blocks_in_use == 0


def test_the_state_pool_grows_past_its_first_slots_and_gives_them_back(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3_5")), dtype="float32", kv_budget_tokens=2048)
    states = llm.engine.states
    first_capacity = states.capacity
    prompts = prompts_of([5 + i for i in range(first_capacity + 3)], seed=5)
    outputs = llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True))
    assert all(len(out.token_ids) == 3 for out in outputs)
    assert states.capacity > first_capacity and states.slots_in_use == 0
    assert states.total_bytes == states.capacity * states.bytes_per_slot
    assert torch.count_nonzero(states.recurrent) > 0   # the slots were written, not only allocated


def test_a_paused_sequence_extends_from_its_kept_state_and_after_eviction_from_its_start(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3_5")), dtype="float32", kv_budget_tokens=8 * BLOCK)
    engine, params = llm.engine, SamplingParams(max_tokens=5, ignore_eos=True)

    def extend_and_check(seq, tokens: list[int]) -> int:
        before = engine.prompt_tokens_computed
        engine.extend(seq, tokens, params)
        while engine.has_work():
            engine.step()
        computed = engine.prompt_tokens_computed - before
        assert llm.generate([seq.token_ids[:-5]], params)[0].token_ids == seq.output_token_ids
        return computed

    seq = engine.add_request(prompts_of([46], seed=6)[0], params, keep_kv=True)
    while engine.has_work():
        engine.step()
    # the last sampled token of turn one and the three new ones: the state continues where it stopped
    assert extend_and_check(seq, [7, 8, 9]) == 4
    llm.generate([prompts_of([110], seed=7)[0]], params)   # needs the whole pool: the paused one is evicted
    assert not seq.block_table and seq.seq_id not in engine.states.slot_of
    assert extend_and_check(seq, [10, 11]) == len(seq.token_ids) - 5
