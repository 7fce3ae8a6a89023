"""Who runs, who waits, who gives way: a request that fits the pool alone always completes, with the
tokens it gets alone, whatever arrives around it; one that cannot fit alone fails with a clear error."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import LLM, SamplingParams
from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import BlockPool
from engine.llm_engine import EngineOptions, LLMEngine
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus

BLOCK = 16


def random_prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, 300) for _ in range(length)]


def run_to_end(engine: LLMEngine, seqs: list[Sequence]) -> None:
    while any(not s.is_finished for s in seqs):
        engine.step()


def alone(folder: str, prompt: list[int], params: SamplingParams, **options) -> list[int]:
    output = LLM(folder, **options).generate([prompt], params)[0]
    assert output.finish_reason == "length", output.error
    return output.token_ids


@pytest.fixture(scope="module")
def folder(tiny_model_dir) -> str:
    return str(tiny_model_dir("llama"))


def test_a_decoding_request_is_not_failed_by_a_big_prompt_that_arrives(folder):
    """The issue's repro: a pool of 1,472 tokens, A decoding, then a 1,450-token prompt B."""
    engine = LLMEngine(folder, EngineOptions(kv_budget_tokens=1472))
    assert engine.blocks.pool.num_blocks * BLOCK == 1472
    a_prompt, b_prompt = random_prompt(20, seed=1), random_prompt(1450, seed=2)
    a_params, b_params = SamplingParams(max_tokens=100, ignore_eos=True), SamplingParams(max_tokens=10, ignore_eos=True)
    a = engine.add_request(a_prompt, a_params)
    while a.num_output_tokens < 30:
        engine.step()
    b = engine.add_request(b_prompt, b_params)
    run_to_end(engine, [a, b])
    assert (a.finish_reason, a.error, b.finish_reason) == ("length", None, "length")
    # B waited until its prompt fitted beside A rather than starting, being preempted and recomputed
    assert engine.runner.prompt_tokens_computed == len(a_prompt) + len(b_prompt)
    assert engine.scheduler.num_preemptions == 0
    assert a.output_token_ids == alone(folder, a_prompt, a_params, kv_budget_tokens=1472)
    assert b.output_token_ids == alone(folder, b_prompt, b_params, kv_budget_tokens=1472)


def test_agents_decode_in_every_step_while_a_prompt_is_prefilled_beside_them_in_chunks(folder):
    """Mixed steps: a newcomer's prompt rides beside the decode rows, a chunk a step under the mixed
    budget, and every running agent gets a token in every one of those steps; all get the tokens
    they get alone."""
    options = {"kv_budget_tokens": 64 * BLOCK, "mixed_step_tokens": 48}
    engine = LLMEngine(folder, EngineOptions(**options))
    prompts = [random_prompt(30 + i, seed=20 + i) for i in range(4)]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    agents = [engine.add_request(p, params) for p in prompts]
    while any(a.num_output_tokens < 3 for a in agents):
        engine.step()
    newcomer_prompt = random_prompt(300, seed=30)
    newcomer = engine.add_request(newcomer_prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    chunks = []
    while newcomer.num_output_tokens == 0:
        before, outputs = newcomer.num_computed_tokens, [a.num_output_tokens for a in agents]
        engine.step()
        chunks.append(newcomer.num_computed_tokens - before)
        assert [a.num_output_tokens for a in agents] == [n + 1 for n in outputs], "an agent waited a step"
    assert sum(chunks) == len(newcomer_prompt) and max(chunks) == 48 - len(agents)
    run_to_end(engine, agents + [newcomer])
    for seq, prompt in zip(agents + [newcomer], prompts + [newcomer_prompt]):
        assert seq.output_token_ids == alone(folder, prompt, seq.params, kv_budget_tokens=64 * BLOCK)


def test_a_prompt_stuck_mid_prefill_gives_way_and_is_recomputed_with_its_own_tokens(folder):
    """B's prompt fits beside A when it arrives and is computed in chunks beside A's decoding; A
    grows, the pool runs dry half way, and the younger B gives its blocks back to the older A, waits,
    and is recomputed (mostly from the cache) once A is done."""
    options = {"kv_budget_tokens": 30 * BLOCK, "max_num_batched_tokens": 64}
    engine = LLMEngine(folder, EngineOptions(**options))
    a_prompt, b_prompt = random_prompt(20, seed=3), random_prompt(440, seed=4)
    a_params, b_params = SamplingParams(max_tokens=60, ignore_eos=True), SamplingParams(max_tokens=8, ignore_eos=True)
    a = engine.add_request(a_prompt, a_params)
    while a.num_output_tokens < 10:   # A's 30 tokens take 2 blocks, B's 440 the other 28
        engine.step()
    b = engine.add_request(b_prompt, b_params)
    b_computed = []
    while not (a.is_finished and b.is_finished):
        if not b.is_finished:
            b_computed.append(b.num_computed_tokens)
        engine.step()
    given_back = [before for before, after in itertools.pairwise(b_computed) if before and not after]
    assert given_back and given_back[0] < len(b_prompt), "B gave its blocks back part way through its prompt"
    assert (a.finish_reason, b.finish_reason) == ("length", "length")
    assert a.output_token_ids == alone(folder, a_prompt, a_params, **options)
    assert b.output_token_ids == alone(folder, b_prompt, b_params, **options)
    for seq in (a, b):
        engine.release(seq)
    assert engine.kv_stats().blocks_in_use == 0


def test_a_prompt_that_cannot_fit_alone_waits_for_the_others_then_fails_clearly(folder):
    engine = LLMEngine(folder, EngineOptions(kv_budget_tokens=8 * BLOCK))
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    a = engine.add_request(random_prompt(10, seed=5), params)
    engine.step()
    huge = engine.add_request(random_prompt(9 * BLOCK, seed=6), params)
    run_to_end(engine, [a, huge])
    assert a.finish_reason == "length" and a.num_output_tokens == 20
    assert huge.finish_reason == "error"
    assert huge.error == (f"request {huge.request_id} needs {9 * BLOCK} tokens of KV, more than the pool "
                          f"holds ({8 * BLOCK}); raise the KV budget")


def test_a_request_that_outgrows_the_pool_alone_fails_clearly(folder):
    engine = LLMEngine(folder, EngineOptions(kv_budget_tokens=4 * BLOCK))
    seq = engine.add_request(random_prompt(40, seed=7), SamplingParams(max_tokens=50, ignore_eos=True))
    run_to_end(engine, [seq])
    assert seq.finish_reason == "error" and "raise the KV budget" in seq.error
    assert seq.num_output_tokens == 4 * BLOCK - 40 + 1   # every slot of the pool was used first


# The scheduler and block manager alone, driven by a stand-in for the model that writes each token into
# the KV slot its block table names and samples from what it reads back through the table: wrong KV
# after a preemption, a recompute or a copy-on-write changes the tokens, as it would with a real model.

SMALL_BLOCK = 4


@dataclass(slots=True)
class Arrival:
    step: int
    prompt: list[int]
    max_tokens: int
    extension: list[int] | None   # appended `pause` steps after the first turn, its KV kept in between
    pause: int = 0


class ShadowEngine:
    def __init__(self, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, mixed_step_tokens: int):
        self.pool = BlockPool(num_blocks, SMALL_BLOCK)
        self.blocks = BlockManager(self.pool)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens, mixed_step_tokens)
        self.slots: dict[tuple[int, int], int] = {}

    def add(self, arrival: Arrival) -> Sequence:
        seq = Sequence(list(arrival.prompt), SamplingParams(max_tokens=arrival.max_tokens),
                       keep_kv=arrival.extension is not None)
        self.scheduler.add(seq)
        return seq

    def extend(self, seq: Sequence, tokens: list[int]) -> None:
        seq.token_ids += tokens
        seq.num_prompt_tokens = len(seq.token_ids)
        seq.keep_kv = False
        self.scheduler.resume(seq)

    def step(self) -> list[Sequence]:
        batch = self.scheduler.schedule()
        for copy in batch.copies:
            for offset in range(SMALL_BLOCK):
                if (copy.src, offset) in self.slots:
                    self.slots[(copy.dst, offset)] = self.slots[(copy.src, offset)]
        finished = list(batch.failed)
        for row, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new)):
            self._write(seq, num_new)
            if seq.num_uncomputed_tokens:
                continue
            if not batch.is_decode_row(row):
                self.scheduler.prompt_done(seq)
            seq.token_ids.append(self._next_token(seq))
            if seq.num_output_tokens >= seq.params.max_tokens:
                seq.finish_reason = "length"
                self.scheduler.finish(seq)
                finished.append(seq)
        return finished

    def _write(self, seq: Sequence, num_new: int) -> None:
        for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + num_new):
            block = seq.block_table[pos // SMALL_BLOCK]
            assert self.pool.ref_count(block) == 1, "wrote into a shared block"
            self.slots[(block, pos % SMALL_BLOCK)] = seq.token_ids[pos]
        self.blocks.commit_written(seq, num_new)

    def _next_token(self, seq: Sequence) -> int:
        kv = [self.slots[(seq.block_table[p // SMALL_BLOCK], p % SMALL_BLOCK)] for p in range(len(seq))]
        assert kv == seq.token_ids, "a sequence reads KV that is not its own"
        return sum((i + 1) * t for i, t in enumerate(kv)) % 7


def kv_tokens(arrival: Arrival) -> int:
    """The KV a request holds at its largest: every token but the last one sampled."""
    extra = len(arrival.extension) if arrival.extension else 0
    turns = 2 if arrival.extension else 1
    return len(arrival.prompt) + extra + turns * arrival.max_tokens - 1


def simulate(arrivals: list[Arrival], num_blocks: int, max_num_seqs: int, budget: int,
             mixed_budget: int | None = None) -> list[Sequence]:
    engine = ShadowEngine(num_blocks, max_num_seqs, budget, mixed_budget or budget)
    seqs: list[Sequence | None] = [None] * len(arrivals)
    resumes: dict[int, int] = {}   # request index -> step it is extended at
    for step in range(2000):
        for i, arrival in enumerate(arrivals):
            if arrival.step == step:
                seqs[i] = engine.add(arrival)
            if resumes.get(i) == step:
                engine.extend(seqs[i], arrival.extension)
        for seq in engine.step():
            i = seqs.index(seq)
            if seq.status == SequenceStatus.PAUSED:
                resumes[i] = step + 1 + arrivals[i].pause
        if all(s is not None and s.is_finished for s in seqs):
            break
    assert all(s is not None and s.is_finished for s in seqs), "the scheduler stopped making progress"
    for seq in seqs:
        engine.scheduler.release(seq)
    assert engine.pool.num_free == num_blocks, "a block is still referenced after every request ended"
    return seqs


tokens = st.lists(st.integers(0, 2), min_size=1, max_size=6)
arrivals = st.builds(Arrival, step=st.integers(0, 30), prompt=st.builds(lambda t, s: t + s, tokens, tokens),
                     max_tokens=st.integers(1, 12), extension=st.none() | tokens,
                     pause=st.integers(0, 4))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(arrivals, min_size=1, max_size=6), st.integers(4, 12), st.integers(1, 4), st.integers(1, 16),
       st.integers(1, 16))
def test_whatever_the_arrival_order_each_request_that_fits_alone_completes_as_alone(
        requests, num_blocks, max_num_seqs, budget, mixed_budget):
    fits = [-(-kv_tokens(r) // SMALL_BLOCK) + 1 <= num_blocks for r in requests]
    together = simulate(requests, num_blocks, max_num_seqs, budget, mixed_budget)
    for request, seq, fit in zip(requests, together, fits):
        if not fit:
            continue
        assert seq.finish_reason == "length", seq.error
        by_itself = simulate([Arrival(0, request.prompt, request.max_tokens, request.extension, request.pause)],
                             num_blocks, max_num_seqs, budget)[0]
        assert seq.token_ids == by_itself.token_ids
