"""Prefix sharing on Qwen3.5 hybrids (tiny random models, float32): a trunk prefilled and pinned as `swarm run`
does is computed once, its linear state snapshotted once and copied into each request that starts with it, and
the greedy tokens are those of sharing off, of each request alone, and of a pool too small to hold them all."""
from engine import LLM, SamplingParams
from tests.helpers.engine_runs import prompts_of

BLOCK = 16
TRUNK = 45   # ends inside its third block


def trunk_and_prompts(num: int = 8) -> tuple[list[int], list[list[int]]]:
    trunk = prompts_of([TRUNK], seed=10)[0]
    return trunk, [trunk + suffix for suffix in prompts_of([3 + 2 * i for i in range(num)], seed=11)]


def pin_trunk(llm: LLM, trunk: list[int]) -> list[int]:
    """What `swarm serve` does at start: prefill the trunk alone, pin its blocks, let the request go."""
    engine = llm.engine
    seq = engine.add_request(trunk, SamplingParams(max_tokens=1), prefill_only=True)
    while seq.finish_reason is None:
        engine.step()
    blocks = engine.pin(seq)
    engine.release(seq)
    return blocks


def test_requests_on_a_pinned_trunk_give_the_tokens_of_sharing_off_of_each_alone_and_under_preemption(
        tiny_model_dir):
    folder = str(tiny_model_dir("qwen3_5"))
    trunk, prompts = trunk_and_prompts()
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    shared = LLM(folder, dtype="float32", kv_budget_tokens=4096)
    pin_trunk(shared, trunk)
    together = [o.token_ids for o in shared.generate(prompts, params)]
    snapshots = shared.engine.blocks.snapshots
    assert shared.engine.prompt_tokens_computed == TRUNK + sum(len(p) - TRUNK for p in prompts)
    # the trunk's; each prompt's end and where each finished; restored into each prompt once
    assert (snapshots.num_taken, snapshots.num_restored) == (1 + 2 * len(prompts), len(prompts))

    unshared = LLM(folder, dtype="float32", kv_budget_tokens=4096, enable_prefix_caching=False)
    assert unshared.engine.blocks.snapshots is None
    assert [o.token_ids for o in unshared.generate(prompts, params)] == together
    assert [unshared.generate([p], params)[0].token_ids for p in prompts] == together

    tight = LLM(folder, dtype="float32", kv_budget_tokens=12 * BLOCK)   # the trunk's 3 blocks and 9 more
    pin_trunk(tight, trunk)
    outputs = tight.generate(prompts, params)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outputs] == together
    assert all(o.num_cached_tokens >= TRUNK for o in outputs)
    # a preempted request re-admitted starts from a snapshot too (the trunk's or its own prompt's end)
    assert tight.engine.blocks.snapshots.num_restored > len(prompts)
    assert tight.engine.states.slots_in_use == 0 and tight.kv_stats().blocks_in_use == 3


def test_a_prompt_longer_than_a_prefill_chunk_on_a_shared_trunk_gives_the_tokens_of_one_chunk(tiny_model_dir):
    folder = str(tiny_model_dir("qwen3_5-odd-tied"))
    trunk = prompts_of([TRUNK], seed=12)[0]
    prompt = trunk + prompts_of([70], seed=13)[0]   # past the trunk, 6 chunks of 13 tokens, none on a block's edge
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    one_chunk = LLM(folder, dtype="float32", kv_budget_tokens=1024, enable_prefix_caching=False)
    whole = one_chunk.generate([prompt], params)[0].token_ids
    chunked = LLM(folder, dtype="float32", kv_budget_tokens=1024, max_num_batched_tokens=13)
    pin_trunk(chunked, trunk)
    before = chunked.engine.prompt_tokens_computed
    first = chunked.generate([prompt], params)[0]
    assert first.num_cached_tokens == TRUNK and chunked.engine.prompt_tokens_computed - before == len(prompt) - TRUNK
    assert first.token_ids == whole
    longer = prompt + first.token_ids[:3]
    again = chunked.generate([longer], params)[0]   # from the snapshot at the first prompt's end
    assert again.num_cached_tokens == len(prompt)
    assert again.token_ids == one_chunk.generate([longer], params)[0].token_ids


def test_the_state_figures_of_kv_stats_add_up(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3_5")), dtype="float32", kv_budget_tokens=2048)
    engine = llm.engine
    trunk, prompts = trunk_and_prompts(num=3)
    blocks = pin_trunk(llm, trunk)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts]
    readings = []
    while engine.has_work():
        engine.step()
        stats = engine.kv_stats()
        readings.append(stats)
        states = stats.states
        assert states.bytes_per_slot == engine.states.bytes_per_slot > 0
        assert states.slots_in_use == sum(1 for s in seqs if s.block_table)
        assert states.slot_bytes_in_use == states.slots_in_use * states.bytes_per_slot
        assert states.snapshots_held == engine.blocks.snapshots.storage.slots_in_use
        assert states.snapshot_bytes == states.snapshots_held * states.bytes_per_slot
        # the trunk's; and that of the prompt that went on writing in the trunk's last block (pinned too)
        assert states.snapshots_pinned in (1, 2)
        assert stats.blocks_free + stats.blocks_in_use == stats.blocks_total
        assert stats.used_bytes == stats.blocks_in_use * stats.block_bytes
    last = readings[-1]
    # the trunk's, and each request's at its prompt's end and where it finished
    assert last.states.slots_in_use == 0 and last.states.snapshots_held == 1 + 2 * len(prompts)
    assert last.to_dict()["states"]["snapshot_bytes"] == (1 + 2 * len(prompts)) * engine.states.bytes_per_slot
    assert last.blocks_pinned == len(blocks)
    plain = LLM(str(tiny_model_dir("llama")), dtype="float32", kv_budget_tokens=256).kv_stats().states
    assert (plain.bytes_per_slot, plain.slots_in_use, plain.snapshots_held, plain.snapshot_bytes) == (0, 0, 0, 0)


def test_requests_added_beside_their_trunk_wait_for_its_snapshot_and_others_do_not_wait(tiny_model_dir):
    engine = LLM(str(tiny_model_dir("qwen3_5")), dtype="float32", kv_budget_tokens=4096).engine
    trunk, prompts = trunk_and_prompts(num=4)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine.add_request(trunk, SamplingParams(max_tokens=1), prefill_only=True)
    on_trunk = [engine.add_request(p, params) for p in prompts]
    # shares the trunk's first 40 tokens, not the whole trunk: its state there is not kept, so waiting gains nothing
    apart = engine.add_request(trunk[:40] + prompts_of([8], seed=14)[0], params)
    first = engine.step()
    assert [seq.seq_id for seq in engine.scheduler.waiting] == [seq.seq_id for seq in on_trunk]
    assert first.prompt_tokens == TRUNK + apart.num_prompt_tokens
    while engine.has_work():
        engine.step()
    assert [seq.num_cached_tokens for seq in on_trunk] == [TRUNK] * len(prompts)
    assert engine.prompt_tokens_computed == TRUNK + apart.num_prompt_tokens + sum(len(p) - TRUNK for p in prompts)


def test_a_prompt_preempted_between_its_chunks_starts_again_where_it_stopped(tiny_model_dir):
    """A sequence's state is kept where it stops when its blocks are freed: a prompt preempted mid-way
    recomputes only what came after, and gives the tokens of one chunk."""
    folder = str(tiny_model_dir("qwen3_5"))
    prompt = prompts_of([150], seed=15)[0]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    whole = LLM(folder, dtype="float32", kv_budget_tokens=1024).generate([prompt], params)[0].token_ids
    engine = LLM(folder, dtype="float32", kv_budget_tokens=1024, max_num_batched_tokens=32).engine
    seq = engine.add_request(prompt, params)
    for _ in range(3):
        engine.step()
    snapshots = engine.blocks.snapshots
    assert seq.num_computed_tokens == 96 and snapshots.num_held == 0
    engine.scheduler._preempt(seq)   # what a full pool does to the youngest sequence
    assert not seq.block_table and snapshots.num_held == 1
    while not seq.is_finished:
        engine.step()
    assert seq.num_cached_tokens == 96 and engine.prompt_tokens_computed == len(prompt)
    assert seq.output_token_ids == whole
    # where it was preempted, where its prompt ended, where it finished (its last token is never computed)
    assert snapshots.num_restored == 1 and snapshots.num_taken == snapshots.num_held == 3


def test_a_finished_request_s_next_turn_starts_after_its_reply(tiny_model_dir):
    """What a chat client sends next: the prompt, the reply, and more. The state kept where the reply stopped
    lets the next request skip all of it but the reply's last token, which was never computed."""
    folder = str(tiny_model_dir("qwen3_5-odd-tied"))
    llm = LLM(folder, dtype="float32", kv_budget_tokens=1024)
    prompt = prompts_of([30], seed=16)[0]
    params = SamplingParams(max_tokens=9, ignore_eos=True)
    reply = llm.generate([prompt], params)[0].token_ids
    turn = prompt + reply + prompts_of([5], seed=17)[0]
    second = llm.generate([turn], params)[0]
    assert second.num_cached_tokens == len(prompt) + len(reply) - 1
    alone = LLM(folder, dtype="float32", kv_budget_tokens=1024, enable_prefix_caching=False)
    assert second.token_ids == alone.generate([turn], params)[0].token_ids


def test_after_reset_prefix_cache_a_hybrid_computes_its_prompts_again_with_the_same_tokens(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3_5")), dtype="float32", kv_budget_tokens=2048)
    _, prompts = trunk_and_prompts(3)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(prompts, params)]
    once = llm.engine.runner.prompt_tokens_computed
    snapshots = llm.engine.blocks.snapshots
    assert snapshots.num_held > 0
    llm.reset_prefix_cache()
    assert snapshots.num_held == 0   # a state at a forgotten block is of no use
    assert [o.token_ids for o in llm.generate(prompts, params)] == first
    assert llm.engine.runner.prompt_tokens_computed == 2 * once
