"""Sharing changes memory and speed, never output; the trunk is computed once; the figures add up."""
import random

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.conftest import ALL_VARIANTS
from tests.helpers.kernel_calls import count_cascade_prefills
from tests.helpers.shared_trunk import swarm_prompts

BLOCK = 16


def unique_blocks_in_use(llm: LLM) -> int:
    stats = llm.kv_stats()
    return stats.blocks_in_use


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_sharing_on_off_and_alone_give_identical_greedy_output(tiny_model_dir, variant):
    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=77, suffix_len=7)
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    shared = LLM(folder, kv_budget_tokens=4096)
    plain = LLM(folder, kv_budget_tokens=4096, cascade_attention=False)
    unshared = LLM(folder, kv_budget_tokens=4096, enable_prefix_caching=False)
    together = shared.generate(prompts, params)
    without = unshared.generate(prompts, params)
    alone = [unshared.generate([p], params)[0] for p in prompts]
    assert [o.token_ids for o in together] == [o.token_ids for o in without]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [o.token_ids for o in together] == [o.token_ids for o in plain.generate(prompts, params)]
    assert all(o.num_cached_tokens == 77 for o in together[1:])
    assert all(o.num_cached_tokens == 0 for o in without)


@pytest.mark.parametrize("decode", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_on_the_c_kernels_sharing_changes_no_bit_of_any_logit(tiny_model_dir, variant, decode, monkeypatch):
    """A trunk past a chunk of the C kernels' attention (kernels.cpu.native_attention.decode_chunk), read once for
    the agents that share it: every logit of every step has the bits of sharing off, and of each agent alone. Also
    with prompts and decode rows in bfloat16 products (as auto takes them where the probe measured them faster;
    the plain C code on a CPU without AVX512-BF16), where a last bit apart would round apart. Suffixes of 80 tokens:
    float32 prompt rows take the decode kernel in chunks of up to 64 rows and the GEMM past that, whose sums run in
    another order, so a 7-token suffix computed over the shared trunk gets other bits than inside its whole prompt
    (the tokens stay the same: test_sharing_on_off_and_alone_give_identical_greedy_output). In bfloat16 the decode
    attention's products are bfloat16 too, where this build multiplies them natively."""
    from engine import prompt_matmul
    from engine.llm_engine import EngineOptions, LLMEngine
    from kernels.cpu import native_attention
    from tests.helpers.engine_runs import run_with_logits

    prompt_products = prompt_matmul.KERNEL if decode == "bfloat16" else "float32"
    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: prompt_products)
    monkeypatch.setattr(prompt_matmul, "choose_decode", lambda precision: decode)
    monkeypatch.setattr(prompt_matmul, "choose_decode_attention", lambda products, prompt_attention: decode)
    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=300, suffix_len=80, agents=4, seed=5)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    shared = LLMEngine(folder, EngineOptions(kv_budget_tokens=4096, weights="q4_1"))
    assert shared.runner.attention.kernels.name == "native"
    assert shared.kernels()["decode_products"] == decode
    bf16_attention = decode == "bfloat16" and native_attention.bf16_products_native()
    assert shared.kernels()["decode_attention"] == ("bfloat16" if bf16_attention else "float32")
    together, _ = run_with_logits(shared, prompts, params)
    unshared = LLMEngine(folder, EngineOptions(kv_budget_tokens=4096, weights="q4_1", enable_prefix_caching=False))
    runs = [together, run_with_logits(unshared, prompts, params)[0],
            [run_with_logits(unshared, [p], params)[0][0] for p in prompts]]
    for run in runs[1:]:
        for (tokens, logits), (want_tokens, want_logits) in zip(run, together):
            assert tokens == want_tokens and torch.equal(logits, want_logits)


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
@pytest.mark.parametrize("products, attention", [("bfloat16_kernel", "bfloat16"), ("int8_kernel", "int8")])
def test_a_bfloat16_pool_gives_every_logit_the_bits_of_a_float32_pool(tiny_model_dir, variant, products, attention,
                                                                      monkeypatch):
    """Prompts and decode rows in bfloat16 products, their attention too (as auto takes them where the probe
    measured them faster), or all in integer products but the decode rows' attention: the pool is kept in bfloat16
    where this CPU multiplies bfloat16 natively, half the bytes, and every logit of agents sharing a trunk,
    prompts computed beside decode rows, has the bits the same engine gives from a float32 pool."""
    import engine.llm_engine as llm_engine
    from engine import prompt_matmul
    from engine.llm_engine import EngineOptions, LLMEngine
    from kernels.cpu import native_attention
    from tests.helpers.engine_runs import run_with_logits

    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: products)
    monkeypatch.setattr(prompt_matmul, "choose_attention", lambda precision: attention)
    monkeypatch.setattr(prompt_matmul, "choose_decode", lambda precision: "bfloat16" if attention == "bfloat16"
                        else "int8")
    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=300, suffix_len=30, agents=4, seed=7)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    options = EngineOptions(kv_budget_tokens=4096, weights="q4_1", mixed_step_tokens=16)
    pooled = LLMEngine(folder, options)
    native = native_attention.available() and native_attention.bf16_products_native()
    assert pooled.kernels()["kv_dtype"] == ("bfloat16" if native else "float32")
    monkeypatch.setattr(llm_engine, "pool_dtype", lambda *choices: torch.float32)
    plain = LLMEngine(folder, options)
    assert plain.kernels()["kv_dtype"] == "float32"
    if native:
        assert pooled.kv_bytes_per_token * 2 == plain.kv_bytes_per_token
    runs = [run_with_logits(engine, prompts, params) for engine in (pooled, plain)]
    assert runs[0][1] > 0, "no prompt was computed beside decode rows"
    for (tokens, logits), (want_tokens, want_logits) in zip(runs[0][0], runs[1][0]):
        assert tokens == want_tokens and torch.equal(logits, want_logits)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_prompts_arriving_beside_decoding_agents_run_in_mixed_steps_with_the_tokens_they_get_alone(
        tiny_model_dir, variant):
    from engine.llm_engine import EngineOptions, LLMEngine

    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=77, suffix_len=40, agents=4, seed=3)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engine = LLMEngine(folder, EngineOptions(kv_budget_tokens=4096, mixed_step_tokens=24))
    first = engine.add_request(prompts[0], params)
    while first.num_output_tokens < 2:
        engine.step()
    later = [engine.add_request(p, params) for p in prompts[1:]]
    mixed_steps = 0
    while not all(s.is_finished for s in [first, *later]):
        result = engine.step()
        mixed_steps += bool(result.prompt_tokens and any(seq is first for seq, _ in result.new_tokens))
    assert mixed_steps >= 3, "the later prompts were not computed in chunks beside the decoding agent"
    alone = LLM(folder, kv_budget_tokens=4096, enable_prefix_caching=False)
    assert [s.output_token_ids for s in [first, *later]] == [alone.generate([p], params)[0].token_ids
                                                             for p in prompts]


@pytest.mark.parametrize("backend_name", ["sdpa", "native"])
def test_the_engine_prefills_suffixes_after_a_cached_trunk_by_cascade_on_each_cpu_backend(
        backend_name, monkeypatch, tiny_model_dir):
    from engine.attention.select import BACKEND_ENV
    from kernels.cpu import native_attention

    if backend_name == "native" and not native_attention.available():
        pytest.skip("no C compiler here")
    monkeypatch.setenv(BACKEND_ENV, backend_name)
    calls = count_cascade_prefills(monkeypatch, backend_name)
    trunk = list(range(4, 100))
    prompts = [trunk + [200 + i, 7, 8] for i in range(3)]
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    folder = str(tiny_model_dir("llama"))
    got = LLM(folder, kv_budget_tokens=2048).generate(prompts, params)
    assert calls, "the suffixes were prefilled one by one, each gathering the trunk"
    plain = LLM(folder, kv_budget_tokens=2048, enable_prefix_caching=False).generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]


def test_the_native_backend_prefills_in_c_with_the_tokens_sdpa_gives(monkeypatch, tiny_model_dir):
    from engine.attention.select import BACKEND_ENV
    from kernels.cpu import native_attention

    if not native_attention.available():
        pytest.skip("no C compiler here")
    trunk = [4 + 7 * i % 96 for i in range(300)]   # more than one chunk of keys (native_attention.chunk_keys)
    prompts = [trunk + [200 + i, 7, 8] for i in range(3)]
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    folder = str(tiny_model_dir("llama"))
    monkeypatch.setenv(BACKEND_ENV, "native")
    llm = LLM(folder, kv_budget_tokens=2048)
    with torch.profiler.profile(record_shapes=True) as profiler:   # it lists each C call, with its arguments
        got = llm.generate(prompts, params)
    calls = [event.name for event in profiler.events() if event.name.startswith("swarm::rows_attention")]
    assert {"swarm::rows_attention", "swarm::rows_attention_running"} <= set(calls), \
        "the trunk (causal) and the suffixes over its whole chunks, continued over the rest, ran in C"
    monkeypatch.setenv(BACKEND_ENV, "sdpa")
    reference = LLM(folder, kv_budget_tokens=2048).generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in reference]


def test_trunk_is_computed_once(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=8192)
    trunk, prompts = swarm_prompts(trunk_len=203, suffix_len=30)
    suffixes = [len(p) - len(trunk) for p in prompts]
    llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
    assert llm.engine.runner.prompt_tokens_computed == len(trunk) + sum(suffixes)
    assert llm.tokens_computed == len(trunk) + sum(suffixes) + len(prompts) * 3


def test_after_reset_prefix_cache_the_same_prompts_are_computed_again_with_the_same_tokens(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=8192)
    trunk, prompts = swarm_prompts(trunk_len=203, suffix_len=30)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    first = [o.token_ids for o in llm.generate(prompts, params)]
    once = llm.engine.runner.prompt_tokens_computed
    cached = llm.kv_stats().blocks_cached
    assert cached > 0 and llm.reset_prefix_cache() == cached
    assert llm.kv_stats().blocks_cached == 0
    again = [o.token_ids for o in llm.generate(prompts, params)]
    assert again == first
    assert llm.engine.runner.prompt_tokens_computed == 2 * once   # the trunk computed again, once


def test_sharing_off_computes_every_prompt_in_full(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=8192, enable_prefix_caching=False)
    _, prompts = swarm_prompts(trunk_len=203, suffix_len=30)
    llm.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True))
    assert llm.engine.runner.prompt_tokens_computed == sum(len(p) for p in prompts)


def test_memory_holds_exactly_the_block_count_of_the_formula(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=16384)
    engine = llm.engine
    trunk_len, suffix_len, agents = 1000, 50, 8
    _, prompts = swarm_prompts(trunk_len, suffix_len, agents)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=1, ignore_eos=True), keep_kv=True) for p in prompts]
    while engine.has_work():
        engine.step()
    # Each agent keeps its prompt's KV (the one sampled token has none yet). Full trunk
    # blocks are held once; from the block where the trunk ends on, every agent holds its own.
    full_trunk_blocks = trunk_len // BLOCK
    private_per_agent = -(-(trunk_len + suffix_len) // BLOCK) - full_trunk_blocks
    expected = full_trunk_blocks + agents * private_per_agent
    stats = llm.kv_stats()
    assert stats.blocks_in_use == expected == 62 + 8 * 4
    assert stats.blocks_shared == full_trunk_blocks
    assert stats.used_bytes == expected * stats.block_bytes
    unique = set()
    for seq in seqs:
        unique.update(seq.block_table)
    assert len(unique) * stats.block_bytes == stats.used_bytes
    for request in stats.requests:
        assert request.shared_tokens == full_trunk_blocks * BLOCK
        assert request.private_tokens == trunk_len + suffix_len - full_trunk_blocks * BLOCK
        assert request.private_bytes == private_per_agent * stats.block_bytes


def test_pool_that_fits_three_of_eight_completes_all_eight_identically(tiny_model_dir):
    folder = str(tiny_model_dir("qwen2"))
    rng = random.Random(1)
    prompts = [[rng.randrange(4, 300) for _ in range(60)] for _ in range(8)]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    per_request_blocks = -(-(60 + 20) // BLOCK)
    roomy = LLM(folder, kv_budget_tokens=8192).generate(prompts, params)
    tight = LLM(folder, kv_budget_tokens=3 * per_request_blocks * BLOCK, max_num_batched_tokens=256)
    outputs = tight.generate(prompts, params)
    assert tight.engine.scheduler.num_preemptions == 0, "a fourth started before its prompt fitted"
    assert [o.token_ids for o in outputs] == [o.token_ids for o in roomy]
    assert all(o.finish_reason == "length" for o in outputs)
    assert tight.kv_stats().blocks_in_use == 0


def test_requests_that_outgrow_the_pool_together_give_way_youngest_first_and_complete_identically(
        tiny_model_dir):
    folder = str(tiny_model_dir("qwen2"))
    rng = random.Random(2)
    prompts = [[rng.randrange(4, 300) for _ in range(60)] for _ in range(6)]
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    roomy = LLM(folder, kv_budget_tokens=8192).generate(prompts, params)
    # three prompts fit at once, but not three prompts grown by 60 tokens each
    tight = LLM(folder, kv_budget_tokens=15 * BLOCK, max_num_batched_tokens=256)
    outputs = tight.generate(prompts, params)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outputs] == [o.token_ids for o in roomy]
    assert all(o.finish_reason == "length" for o in outputs)
    assert tight.kv_stats().blocks_in_use == 0


def test_request_that_can_never_fit_fails_and_the_others_carry_on(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=256)
    huge, small = list(range(4, 300)), list(range(4, 40))
    outputs = llm.generate([huge, small], SamplingParams(max_tokens=5, ignore_eos=True))
    assert outputs[0].finish_reason == "error" and "KV budget" in outputs[0].error
    assert outputs[1].finish_reason == "length" and len(outputs[1].token_ids) == 5


def test_paused_sequence_extends_in_place_without_recomputing_history(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=4096)
    engine = llm.engine
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    seq = engine.add_request(list(range(4, 50)), params, keep_kv=True)
    while engine.has_work():
        engine.step()
    before = llm.engine.runner.prompt_tokens_computed
    engine.extend(seq, [7, 8, 9], params)
    while engine.has_work():
        engine.step()
    # the last sampled token of turn one and the three new ones; nothing else
    assert llm.engine.runner.prompt_tokens_computed - before == 4
    history = seq.token_ids[:-5]
    fresh = llm.generate([history], params)[0]
    assert fresh.token_ids == seq.output_token_ids


def test_stats_report_hits_and_pool_usage(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=4096)
    _, prompts = swarm_prompts(trunk_len=100, suffix_len=10, agents=4)
    llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    stats = llm.kv_stats()
    assert stats.prefix_hit_tokens == 3 * 100
    assert stats.prefix_hit_rate == pytest.approx(300 / (4 * 110))
    assert stats.blocks_in_use == 0
    assert stats.blocks_free == stats.blocks_total
    assert stats.blocks_cached > 0


def test_llm_passes_its_options_to_the_engine_and_names_one_it_does_not_know(tiny_model_dir):
    folder = str(tiny_model_dir("llama"))
    llm = LLM(folder, kv_budget_tokens=256, block_size=8, max_num_seqs=3, onednn_weights=False)
    assert (llm.engine.kv_capacity_tokens, llm.engine.blocks.block_size) == (256, 8)
    assert llm.engine.scheduler.max_num_seqs == 3 and llm.engine.kernels()["matmuls"] == "torch"
    with pytest.raises(TypeError, match=r"no option 'kv_budget'; its options are device, dtype, block_size"):
        LLM(folder, kv_budget=256)
