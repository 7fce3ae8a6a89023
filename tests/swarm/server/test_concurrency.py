"""Many clients on one `swarm serve`: one batch for all, a client that leaves frees its blocks, and
a long prompt being rendered and tokenized holds up nobody else."""
import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.helpers.serving import MODEL, metric, wait_for

GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


def prompt(n: int) -> list[dict]:
    return [{"role": "system", "content": "Agents share a trunk of tokens; their suffixes differ."},
            {"role": "user", "content": f"Task {n}: " + "def add(a, b):" * (n % 4 + 1)}]


def test_16_concurrent_streams_decode_in_one_batch_and_each_gets_its_own_reply(server):
    runner = server.async_engine.engine.runner
    real_run, decode_batches = runner.run, []

    def run(batch):
        if not batch.is_prefill:
            decode_batches.append(len(batch.seqs))
        return real_run(batch)

    async def stream(client, n: int) -> tuple[str, int]:
        chunks = await client.chat.completions.create(model=MODEL, messages=prompt(n), max_tokens=24, stream=True,
                                                      stream_options={"include_usage": True}, **GREEDY)
        text, usage = "", None
        async for chunk in chunks:
            text += "".join(c.delta.content or "" for c in chunk.choices)
            usage = chunk.usage or usage
        return text, usage.completion_tokens

    async def main():
        client = server.async_client()
        return await asyncio.gather(*(stream(client, n) for n in range(16)))

    runner.run = run
    try:
        started = time.perf_counter()
        streamed = asyncio.run(main())
        wall = time.perf_counter() - started
    finally:
        runner.run = real_run
    client = server.client()
    alone = [client.chat.completions.create(model=MODEL, messages=prompt(n), max_tokens=24, **GREEDY)
             for n in range(16)]
    assert [text for text, _ in streamed] == [reply.choices[0].message.content for reply in alone]
    assert all(tokens == 24 for _, tokens in streamed)
    assert max(decode_batches) == 16
    print(f"16 concurrent streams x 24 tokens: {wall:.2f} s")


def test_a_client_that_leaves_mid_stream_cancels_its_request_and_frees_its_blocks(server):
    before = server.metrics()
    client = server.client()
    stream = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=1500, stream=True,
                                       **GREEDY)
    chunks = [next(stream) for _ in range(3)]
    during = server.metrics()
    stream.close()
    after = wait_for(lambda: (s := server.metrics()) and metric(s, "swarm_num_requests_running") == 0 and s)
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks)
    assert metric(during, "swarm_num_requests_running") == 1
    assert metric(during, "swarm_kv_blocks", state="in_use") >= 1
    assert after, "the request kept running after its client left"
    cancelled = "swarm_requests_total"
    was = metric(before, cancelled, finish_reason="cancelled")
    assert metric(after, cancelled, finish_reason="cancelled") == was + 1
    assert metric(after, "swarm_kv_blocks", state="in_use") == 0
    generated = metric(after, "swarm_generation_tokens_total") - metric(before, "swarm_generation_tokens_total")
    assert generated < 1500


@pytest.mark.parametrize("route, gated", [("chat", "apply_chat_template"), ("completions", "encode")])
def test_a_prompt_being_rendered_or_tokenized_does_not_hold_up_other_clients(server, monkeypatch, route, gated):
    """The prompt's work is held at a gate until /health has been answered: that can only happen
    if the work runs off the event loop (on the loop, /health waits for the gate's timeout)."""
    tokenizer = server.async_engine.engine.tokenizer
    real, entered, release, threads = getattr(tokenizer, gated), threading.Event(), threading.Event(), []

    def held(*args, **kwargs):
        threads.append(threading.current_thread())
        entered.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenizer, gated, held)
    client = server.client()
    with ThreadPoolExecutor(1) as pool:
        if route == "chat":
            reply = pool.submit(client.chat.completions.create, model=MODEL, messages=prompt(1), max_tokens=2,
                                **GREEDY)
        else:
            reply = pool.submit(client.completions.create, model=MODEL, prompt="def add(a, b):", max_tokens=2,
                                **GREEDY)
        try:
            assert entered.wait(30), "the request never reached its prompt's tokenization"
            health = httpx.get(server.url + "/health", timeout=10)
        finally:
            release.set()
        assert health.status_code == 200
        assert reply.result(60).usage.completion_tokens == 2
    assert server.thread not in threads


def test_tokenizing_a_long_prompt_lets_other_threads_run(server):
    """The event loop's thread must get the interpreter while a worker thread tokenizes: counted
    as the loop-like thread's wake-ups during the one tokenizer call (a call that held the GIL
    throughout would allow none, or one or two at its edges)."""
    tokenizer = server.async_engine.engine.tokenizer
    text = "def add(a, b):\n    return a + b\n" * 12000
    wakeups, during, done = [0], [], threading.Event()

    def tokenize():
        start = wakeups[0]
        tokenizer.encode(text)
        during.append(wakeups[0] - start)
        done.set()

    worker = threading.Thread(target=tokenize)
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        wakeups[0] += 1
    worker.join()
    assert during[0] >= 20, f"only {during[0]} wake-ups while the tokenizer ran"
