import asyncio
import time

import pytest

from engine.async_engine import AsyncEngine, RequestFailed
from engine.llm import LLM
from engine.llm_engine import EngineOptions, LLMEngine
from engine.sampling import SamplingParams

PROMPTS = [[1, 5, 9, 33, 17], [1, 80, 81, 82], [1, 5, 9, 33, 40, 41], [1, 200, 201, 202, 203, 204, 205],
           [1, 7], [1, 5, 9, 33, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture()
def engine(model_dir):
    async_engine = AsyncEngine(LLMEngine(str(model_dir), EngineOptions(device="cpu", dtype="float32"))).start()
    yield async_engine
    async_engine.shutdown()


async def collect(engine: AsyncEngine, prompt, params) -> list[int]:
    tokens = []
    async for delta in engine.generate(prompt, params):
        tokens += delta.token_ids
    return tokens


def test_concurrent_requests_get_the_tokens_llm_generate_gives(engine, model_dir):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    expected = [out.token_ids for out in LLM(str(model_dir), device="cpu", dtype="float32").generate(PROMPTS, params)]

    async def main():
        return await asyncio.gather(*(collect(engine, p, params) for p in PROMPTS))

    assert asyncio.run(main()) == expected
    assert engine.counters.generation_tokens == 12 * len(PROMPTS)
    assert engine.counters.finished["length"] == len(PROMPTS)


def test_last_delta_says_why_and_reports_prompt_and_cached_tokens(engine):
    trunk = list(range(3, 3 + 40))

    async def main():
        await collect(engine, trunk + [100], SamplingParams(max_tokens=2, ignore_eos=True))
        return [d async for d in engine.generate(trunk + [101, 102], SamplingParams(max_tokens=3, ignore_eos=True))]

    deltas = asyncio.run(main())
    assert [len(d.token_ids) for d in deltas] == [1, 1, 1]
    assert [d.finish_reason for d in deltas] == [None, None, "length"]
    assert deltas[-1].num_prompt_tokens == 42
    assert deltas[-1].num_cached_tokens == 40  # the whole shared prefix, the partial block too


def test_closing_the_iterator_cancels_the_request_and_frees_its_blocks(engine):
    async def main():
        stream = engine.generate(list(range(1, 60)), SamplingParams(max_tokens=1000, ignore_eos=True))
        seen = [await stream.__anext__() for _ in range(3)]
        during = await engine.snapshot()
        await stream.aclose()
        await asyncio.sleep(0.05)
        return seen, during, await engine.snapshot()

    seen, during, after = asyncio.run(main())
    assert all(len(d.token_ids) == 1 for d in seen)
    assert during.num_running == 1 and during.kv.blocks_in_use >= 4
    assert after.num_running == 0 and after.num_waiting == 0
    assert after.kv.blocks_in_use == 0 and after.kv.requests == []
    assert after.counters.finished["cancelled"] == 1
    assert after.counters.generation_tokens < 1000


def test_a_cancelled_task_cancels_its_request(engine):
    async def reader(started: asyncio.Event):
        async for _ in engine.generate([1, 2, 3, 4], SamplingParams(max_tokens=1000, ignore_eos=True)):
            started.set()

    async def main():
        started = asyncio.Event()
        task = asyncio.create_task(reader(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.05)
        return await engine.snapshot()

    after = asyncio.run(main())
    assert after.num_running == 0 and after.kv.blocks_in_use == 0
    assert after.counters.finished["cancelled"] == 1


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(engine):
    runner = engine.engine.runner
    real_run, calls = runner.run, []

    def run_failing_once(batch):
        calls.append(len(batch.seqs))
        if len(calls) == 3:
            raise RuntimeError("injected fault")
        return real_run(batch)

    runner.run = run_failing_once

    async def main():
        with pytest.raises(RequestFailed) as failed:
            await collect(engine, [1, 5, 9], SamplingParams(max_tokens=10, ignore_eos=True))
        return failed.value, await collect(engine, [1, 5, 9], SamplingParams(max_tokens=4, ignore_eos=True))

    error, tokens = asyncio.run(main())
    assert error.internal and "injected fault" in str(error)
    assert len(tokens) == 4
    after = engine.snapshot_blocking()
    assert after.counters.step_errors == 1 and after.counters.finished["error"] == 1
    assert after.kv.blocks_in_use == 0


def test_a_bad_request_fails_alone(engine):
    async def main():
        with pytest.raises(RequestFailed) as failed:
            await collect(engine, [], SamplingParams())
        return failed.value, await collect(engine, [1, 2], SamplingParams(max_tokens=2, ignore_eos=True))

    error, tokens = asyncio.run(main())
    assert not error.internal and "at least one token" in str(error)
    assert len(tokens) == 2


def test_shutdown_fails_what_is_still_running(model_dir):
    engine = AsyncEngine(LLMEngine(str(model_dir), EngineOptions(device="cpu", dtype="float32"))).start()

    async def main():
        stream = engine.generate([1, 2, 3], SamplingParams(max_tokens=2000, ignore_eos=True))
        await stream.__anext__()
        started = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        with pytest.raises(RequestFailed, match="shutting down"):
            async for _ in stream:
                pass
        return time.monotonic() - started

    assert asyncio.run(main()) < 5
    assert not engine.is_alive
    with pytest.raises(RequestFailed):
        engine.call(lambda e: None)


def test_max_request_tokens_leaves_out_the_pinned_blocks_a_prompt_does_not_share(model_dir):
    llm = LLMEngine(str(model_dir), EngineOptions(device="cpu", dtype="float32", kv_budget_tokens=1024))
    trunk = list(range(3, 43))  # two whole blocks of 16 and one of 8
    seq = llm.add_request(trunk, SamplingParams(max_tokens=1), prefill_only=True)
    while seq.finish_reason is None:
        llm.step()
    pinned = llm.pin(seq)
    llm.release(seq)
    engine = AsyncEngine(llm).start()

    async def held(prompt: list[int]) -> int:
        return await engine.max_request_tokens(prompt)

    try:
        assert asyncio.run(held([200, 201])) == 1024 - 3 * 16
        assert asyncio.run(held(trunk + [200])) == 1024 - 3 * 16 + 2 * 16
        assert asyncio.run(held(trunk[:20])) == 1024 - 3 * 16 + 1 * 16
        engine.call(lambda e: e.unpin(pinned)).result()
        assert asyncio.run(held(trunk + [200])) == 1024
    finally:
        engine.shutdown()
