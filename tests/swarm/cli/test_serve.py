"""The real `swarm serve` CLI as a subprocess: one-line start-up errors, and a spec whose trunk is
pinned at start, so that eight agents hit it at once and memory holds it once."""
import asyncio
import json
import random
import sys

import httpx
import openai
import pytest

from engine import EngineOptions
from swarm.cli.main import main
from swarm.cli.serve import _settings
from swarm.server.loopback import bind
from swarm.spec.tool_schema import canonical_tools
from swarm.trunk.canonical import tools_block
from tests.helpers.runs import TINY_HARNESS, tiny_model, tiny_tokenizer, write_run_spec
from tests.helpers.serving import metric, parse_metrics, serve_cli
from tests.helpers.spec_files import MINIMAL, load

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """The `swarm` entry point in this process, as the console script runs it."""
    monkeypatch.setattr(sys, "argv", ["swarm", "serve", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def test_a_taken_port_or_a_bad_model_is_one_line_and_a_nonzero_exit(model_dir, tmp_path, monkeypatch, capsys):
    taken = bind("127.0.0.1", 0)
    try:
        busy = run_main(monkeypatch, capsys, "--model", str(model_dir), "--port", str(taken.getsockname()[1]))
    finally:
        taken.close()
    missing = run_main(monkeypatch, capsys, "--model", str(tmp_path / "no-such-model"), "--port", "0")
    bad_budget = run_main(monkeypatch, capsys, "--model", str(model_dir), "--kv-budget", "lots")
    for (code, stderr), words in zip((busy, missing, bad_budget),
                                     ("cannot listen on 127.0.0.1", "no-such-model", "--kv-budget")):
        assert code != 0
        assert stderr.count("\n") == 1 and words in stderr
        assert stderr.startswith("error: ") and "Traceback" not in stderr


def test_eight_agents_on_a_served_spec_hit_the_pinned_trunk_and_memory_holds_it_once(model_dir, tmp_path):
    spec = write_run_spec(tmp_path, model_dir, agents=8)
    system = "\n\n".join(rule.strip() for rule in TINY_HARNESS["rules"])
    trunk_tokens, common = expected_prompts(system)
    with serve_cli(str(spec), "--served-model-name", "agents") as (ready, process):
        assert ready["trunk_tokens"] == trunk_tokens
        assert ready["trunk_blocks"] == -(-trunk_tokens // BLOCK_SIZE)
        held, usages = asyncio.run(eight_agents(ready["url"], system))
        process.terminate()
        assert process.wait(15) in (0, -15, 143)
    pinned, whole_trunk_blocks = ready["trunk_blocks"], trunk_tokens // BLOCK_SIZE
    shared = metric(held, "swarm_kv_blocks", state="shared")
    # Every whole block of the trunk is read by all eight. The trunk's last, partial block is filled
    # on by the first agent admitted; when the others come a step later they find it whole (their
    # suffixes start alike) and it is shared too; those that come in the same step copy it.
    assert shared in (whole_trunk_blocks, common // BLOCK_SIZE) and common // BLOCK_SIZE == pinned
    block_bytes = metric(held, "swarm_kv_total_bytes") / metric(held, "swarm_kv_blocks", state="total")
    private = metric(held, "swarm_kv_private_bytes") / block_bytes
    assert metric(held, "swarm_num_requests_running") == 8
    assert metric(held, "swarm_kv_blocks", state="pinned") == pinned
    assert metric(held, "swarm_kv_blocks", state="in_use") == shared + private
    assert metric(held, "swarm_kv_shared_bytes") == shared * block_bytes
    assert 7 * whole_trunk_blocks * block_bytes <= metric(held, "swarm_kv_saved_bytes") <= 7 * shared * block_bytes
    for usage in usages:
        assert trunk_tokens - BLOCK_SIZE < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def expected_prompts(system: str) -> tuple[int, int]:
    """Tokens of the trunk (the system message with its tools block) and of the agents' common prefix."""
    tokenizer = tiny_tokenizer()
    content = f"{tools_block(canonical_tools(TINY_HARNESS['tools']))}\n\n{system}"
    trunk = tokenizer.encode(tokenizer.apply_chat_template([{"role": "system", "content": content}],
                                                           add_generation_prompt=False))
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "system", "content": content},
                                                               {"role": "user", "content": task(n)}]))
               for n in range(8)]
    common = next(i for i in range(len(prompts[0])) if len({p[i] for p in prompts}) > 1)
    assert prompts[0][:len(trunk)] == trunk
    return len(trunk), common


def task(n: int) -> str:
    return f"Agent {n}: fix a.py"


async def eight_agents(url: str, system: str):
    """Eight streams held open (metrics scraped while all decode, then dropped), then eight short
    requests, each agent listing the tools in its own order."""
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    metrics_url = url.removesuffix("/v1") + "/metrics"

    def request(n: int, **options):
        tools = random.Random(n).sample(TINY_HARNESS["tools"], 2)
        return client.chat.completions.create(
            model="agents", tools=tools, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": task(n)}],
            extra_body={"ignore_eos": True}, **options)

    async with httpx.AsyncClient() as http:
        streams = await asyncio.gather(*(request(n, max_tokens=600, stream=True) for n in range(8)))
        assert [m.id async for m in client.models.list()] == ["agents"]
        held = await wait_for_async(lambda: scrape_when_running(http, metrics_url, 8))
        for stream in streams:
            await stream.close()
        await wait_for_async(lambda: scrape_when_running(http, metrics_url, 0))
        replies = await asyncio.gather(*(request(n, max_tokens=2) for n in range(8)))
    return held, [reply.usage for reply in replies]


async def scrape_when_running(http: httpx.AsyncClient, metrics_url: str, running: int):
    samples = parse_metrics((await http.get(metrics_url)).text)
    decoding = running == 0 or metric(samples, "swarm_generation_tokens_total") >= running
    return samples if metric(samples, "swarm_num_requests_running") == running and decoding else None


async def wait_for_async(probe, timeout: float = 20.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        found = await probe()
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("the server never reached the expected state")


def test_swarm_api_key_from_the_environment_guards_the_api(model_dir):
    with serve_cli("--model", str(model_dir), "--device", "cpu", env={"SWARM_API_KEY": "k-123"}) as (info, _):
        assert httpx.get(info["url"] + "/models").status_code == 401
        keyed = httpx.get(info["url"] + "/models", headers={"Authorization": "Bearer k-123"})
        assert keyed.status_code == 200 and keyed.json()["data"][0]["id"] == info["model"]
        assert httpx.get(info["url"].removesuffix("/v1") + "/health").status_code == 200


def test_no_graphs_or_the_specs_graphs_false_serve_with_eager_decode(tmp_path):
    assert _settings(None, "m", None, None, None, None).graphs is True
    assert _settings(None, "m", None, None, None, None, no_graphs=True).graphs is False
    assert _settings(load(tmp_path, MINIMAL + "graphs: false\n"), None, None, None, None, None).graphs is False


def test_canonicalize_comes_from_the_flag_or_the_spec(tmp_path):
    assert _settings(None, "m", None, None, None, None).canonicalize is False
    assert _settings(None, "m", None, None, None, None, canonicalize=True).canonicalize is True
    assert _settings(load(tmp_path, MINIMAL + "canonicalize: true\n"), None, None, None, None, None).canonicalize


def test_requests_at_once_come_from_the_flag_or_the_spec_s_agents_and_the_trunk(tmp_path):
    assert _settings(None, "m", None, None, None, None).max_num_seqs == EngineOptions().max_num_seqs == 64
    assert _settings(load(tmp_path, MINIMAL), None, None, None, None, None).max_num_seqs == 3 + 1
    assert _settings(load(tmp_path, MINIMAL), None, None, None, None, None, max_num_seqs=12).max_num_seqs == 12


def test_max_model_len_past_the_trained_context_is_served_with_a_warning(model_dir):
    trained = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    doubled = str(trained * 2)
    with serve_cli("--model", str(model_dir), "--device", "cpu", "--max-model-len", doubled,
                   "--max-num-seqs", "5") as (info, process):
        card = httpx.get(info["url"] + "/models").json()["data"][0]
    assert info["max_num_seqs"] == 5
    assert card["max_model_len"] == trained * 2
    assert f"beyond the {trained} tokens this model was trained for" in process.stderr.read()
