"""swarm/run/harness_trunk.py on a real server and engine: two agents' first requests, through the OpenAI
SDK with their own keys: the tokens they share become the trunk's own request, pinned."""
import pytest

from swarm.run.harness_trunk import WITH_TOOLS, HarnessTrunk
from swarm.run.memory import TRUNK_REQUEST_ID
from swarm.trunk.canonical import common_prefix_length
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


def attach(trunk: HarnessTrunk, server):
    """The trunk on the server's engine, as the run sets it up; returns the engine."""
    trunk.engine = server.async_engine
    server.async_engine.watch_steps(trunk.after_step)
    return server.async_engine.engine


def test_the_tokens_the_first_two_agents_first_requests_share_are_the_pinned_trunk(model_dir):
    trunk, running = serve(model_dir, "first-request")
    with running as server:
        engine = attach(trunk, server)
        ask(server, "key-a", "Fix a.py, please.")
        assert trunk.ready.is_set() and not trunk.blocks   # the first agent alone: nothing to compare yet
        computed = engine.runner.prompt_tokens_computed
        ask(server, "key-b", "Write tests for b.py.")
        trunk.wait_pinned()
        shared = common_prefix_length(list(trunk.prompts.values()))
        size = engine.blocks.block_size
        assert trunk.tokens == shared > size and len(trunk.blocks) == -(-shared // size)
        assert all(engine.blocks.pool.is_pinned(block) for block in trunk.blocks)
        rows = {row.request_id: row for row in server.async_engine.snapshot_blocking().kv.requests}
        assert rows[TRUNK_REQUEST_ID].tokens == shared   # its own request holds it, as a built-in run's trunk
        # b computed what it does not share with a; the trunk's request, only its last token
        b_prompt = len(trunk.prompts["b"])
        assert engine.runner.prompt_tokens_computed - computed == b_prompt - shared + 1
        ask(server, "key-a", "And c.py.")   # later requests change nothing
        assert trunk.pinned_from == ["a", "b"] and len(trunk.blocks) == -(-shared // size)


@pytest.mark.parametrize("source, pinned", [("first-request", False), (WITH_TOOLS, True)])
def test_with_tools_the_trunk_request_is_the_first_that_carries_them(model_dir, source, pinned):
    trunk, running = serve(model_dir, source)
    with running as server:
        attach(trunk, server)
        title = ask(server, "key-a", "Name this session.", tools=False)   # as OpenCode's title request
        assert trunk.ready.is_set() != pinned and (title in trunk.requests.values()) != pinned
        ask(server, "key-a", "Fix a.py, please.")
        ask(server, "key-b", "Write tests for b.py.")
        trunk.wait_pinned()
        assert trunk.ready.is_set()
        # the title request shares only the system text; the tools-bearing ones share the tools too
        assert (trunk.tokens > len(server.async_engine.engine.tokenizer.encode(SYSTEM))) == pinned
