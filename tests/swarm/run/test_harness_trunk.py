"""swarm/run/harness_trunk.py on a real server and engine: two agents' first requests, through the OpenAI
SDK with their own keys, pin the whole blocks they share, computing nothing more."""
import pytest

from swarm.run.harness_trunk import WITH_TOOLS, HarnessTrunk, common_prefix
from tests.helpers.runs import TINY_HARNESS, tiny_model
from tests.helpers.serving import MODEL, ServerThread, start_engine

KEYS = {"key-a": "a", "key-b": "b"}
SYSTEM = "You are a careful coding agent. " * 12
TOOLS = TINY_HARNESS["tools"]


def ask(server, key: str, task: str, tools: bool = True) -> str:
    extra = {"tools": TOOLS} if tools else {}
    reply = server.client(api_key=key).chat.completions.create(
        model=MODEL, max_tokens=2, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}], **extra)
    return reply.id


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


def serve(model_dir, source: str):
    trunk = HarnessTrunk(None, ["a", "b"], source)
    return trunk, ServerThread(start_engine(model_dir), agent_keys=KEYS, exchanges=[trunk])


def test_common_prefix():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == [1, 2]
    assert common_prefix([[1, 2], [1, 2, 3]]) == [1, 2] and common_prefix([[7], [8]]) == []


def test_the_first_two_agents_first_requests_pin_the_whole_blocks_they_share(model_dir):
    trunk, running = serve(model_dir, "first-request")
    with running as server:
        trunk.engine = server.async_engine
        engine = server.async_engine.engine
        ask(server, "key-a", "Fix a.py, please.")
        assert trunk.ready.is_set() and not trunk.blocks   # the first agent alone: nothing to compare yet
        ask(server, "key-b", "Write tests for b.py.")
        trunk.wait_pinned()
        prompts = list(trunk.prompts.values())
        shared = len(common_prefix(prompts))
        size = engine.blocks.block_size
        assert trunk.tokens == shared // size * size > 0 and len(trunk.blocks) == shared // size
        assert all(engine.blocks.pool.is_pinned(block) for block in trunk.blocks)
        computed = engine.runner.tokens_computed
        stats = server.async_engine.snapshot_blocking().kv
        assert stats.blocks_pinned == len(trunk.blocks) and engine.runner.tokens_computed == computed
        ask(server, "key-a", "And c.py.")   # later requests change nothing
        assert trunk.pinned_from == ["a", "b"] and len(trunk.blocks) == shared // size
        trunk.unpin()
        assert server.async_engine.snapshot_blocking().kv.blocks_pinned == 0


@pytest.mark.parametrize("source, pinned", [("first-request", False), (WITH_TOOLS, True)])
def test_with_tools_the_trunk_request_is_the_first_that_carries_them(model_dir, source, pinned):
    trunk, running = serve(model_dir, source)
    with running as server:
        trunk.engine = server.async_engine
        title = ask(server, "key-a", "Name this session.", tools=False)   # as OpenCode's title request
        assert trunk.ready.is_set() != pinned and (title in trunk.requests.values()) != pinned
        ask(server, "key-a", "Fix a.py, please.")
        ask(server, "key-b", "Write tests for b.py.")
        trunk.wait_pinned()
        assert trunk.ready.is_set()
        # the title request shares only the system text; the tools-bearing ones share the tools too
        assert (trunk.tokens > len(server.async_engine.engine.tokenizer.encode(SYSTEM))) == pinned
