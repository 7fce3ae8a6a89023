"""Decode graphs change nothing but speed: the static, padded step (run eagerly here, replayed as a graph on a
GPU) gives the eager engine's greedy tokens as agents finish and the batch shrinks, with the trunk shared and
without, and padded rows write only the scratch block."""
import random

import pytest
import torch

from engine import LLM, SamplingParams
from engine.decode_graphs import GraphSettings, buckets, engine_settings
from engine.options import EngineOptions

AGENTS = 8
MAX_TOKENS = [4, 4, 4, 9, 9, 9, 9, 14]   # 8 agents decode, then 5, then 1


def swarm_prompts(trunk_len: int, suffix_len: int, agents: int) -> list[list[int]]:
    """A shared trunk, then suffixes that differ from their first token on."""
    rng = random.Random(0)
    trunk = [rng.randrange(4, 300) for _ in range(trunk_len)]
    return [trunk + [10 + i] + [rng.randrange(4, 300) for _ in range(suffix_len - 1)] for i in range(agents)]


def _engine(folder, cascade=True, device="cpu", **options):
    """On the CPU unless asked (also on a GPU machine): float32, where a padded row must change no bit that matters.
    On the CPU float32 is asked for: auto may take bfloat16 products, whose decode attention rounds the trunk read
    in a padded step's pieces (not cut at whole chunks) a bfloat16 rounding away from the eager step's."""
    if device == "cpu":
        options.setdefault("dtype", "float32")
    return LLM(folder, kv_budget_tokens=4096, max_num_seqs=AGENTS, cascade_attention=cascade, device=device,
               **options).engine


def _static_settings(engine, capture: bool) -> GraphSettings:
    return GraphSettings(AGENTS, max_blocks_per_seq=32, scratch_block=engine.blocks.pool.num_blocks, capture=capture)


def _add_agents(engine, prompts):
    return [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(prompts, MAX_TOKENS)]


def _side_by_side(eager, other, prompts, after_each_step=lambda: None) -> tuple[list, list]:
    """The same agents on both engines, stepped in lockstep: each engine's tokens."""
    eager_seqs, other_seqs = _add_agents(eager, prompts), _add_agents(other, prompts)
    while eager.has_work():
        eager.step()
        other.step()
        after_each_step()
    return [s.token_ids for s in eager_seqs], [s.token_ids for s in other_seqs]


def _pool(engine) -> torch.Tensor:
    """Every layer's K and V of the block pool's blocks (the scratch block left out): [layers, 2, blocks, ...]."""
    blocks = engine.blocks.pool.num_blocks
    return torch.stack([torch.stack((k[:blocks], v[:blocks])) for k, v in engine.runner.kv.layers])


def _scratch(engine) -> torch.Tensor:
    return torch.stack([torch.stack((k[-1], v[-1])) for k, v in engine.runner.kv.layers])


@pytest.mark.parametrize("cascade", [True, False], ids=["trunk-shared", "cascade-off"])
def test_static_padded_decode_gives_the_eager_tokens_and_pool_as_the_batch_shrinks(tiny_model_dir, cascade):
    folder = str(tiny_model_dir("llama"))
    prompts = swarm_prompts(trunk_len=100, suffix_len=7, agents=AGENTS)
    eager, static = _engine(folder, cascade), _engine(folder, cascade)
    static.runner.use_graphs(_static_settings(static, capture=False))

    def pools_match():   # a padded row writing into any block of the pool would show here, in the step it happens
        torch.testing.assert_close(_pool(static), _pool(eager), rtol=1e-5, atol=1e-5)

    eager_tokens, static_tokens = _side_by_side(eager, static, prompts, pools_match)
    assert static_tokens == eager_tokens
    graphs = static.runner.decode_graphs
    assert graphs.steps_run == max(MAX_TOKENS) - 1   # every decode step ran static and padded
    assert {key.rows for key in graphs.steps} == {8, 1}
    # the trunk is read once while agents share it; one agent alone reads it as its own blocks
    assert [bool(key.prefixes) for key in graphs.steps if key.rows == 8] == [cascade]
    assert _scratch(static).abs().sum() > 0 and _scratch(eager).abs().sum() == 0
    assert static.kernels()["decode_graphs"] == "13 steps in 2 static layouts, not captured"


def test_an_agent_leaving_the_trunk_group_changes_members_not_the_graph(tiny_model_dir):
    folder = str(tiny_model_dir("llama"))
    prompts = swarm_prompts(trunk_len=100, suffix_len=7, agents=AGENTS)
    prompts[2] = [7] * 40   # shares nothing: reads no trunk, in the same graph as the agents that do
    eager, static = _engine(folder), _engine(folder)
    static.runner.use_graphs(_static_settings(static, capture=False))
    eager_tokens, static_tokens = _side_by_side(eager, static, prompts)
    assert static_tokens == eager_tokens
    assert [key.prefixes for key in static.runner.decode_graphs.steps if key.rows == 8] == [((0, 6, None),)]


def test_steps_past_the_largest_bucket_run_eagerly_beside_the_static_ones(tiny_model_dir):
    folder = str(tiny_model_dir("llama"))
    prompts = swarm_prompts(trunk_len=100, suffix_len=7, agents=AGENTS)
    eager, static = _engine(folder), _engine(folder)
    static.runner.use_graphs(GraphSettings(4, max_blocks_per_seq=32, scratch_block=static.blocks.pool.num_blocks,
                                           capture=False))
    eager_tokens, static_tokens = _side_by_side(eager, static, prompts)
    assert static_tokens == eager_tokens
    assert static.runner.decode_graphs.steps_run == max(MAX_TOKENS) - max(MAX_TOKENS[:-1])   # the lone agent's


def test_an_engine_on_a_gpu_gets_graphs_with_the_scratch_block_after_the_pool():
    gpu = torch.device("cuda")
    settings = engine_settings(EngineOptions(max_num_seqs=32), gpu, num_blocks=1000, context_tokens=40960)
    assert settings == GraphSettings(32, max_blocks_per_seq=1000, scratch_block=1000)
    assert engine_settings(EngineOptions(), gpu, 1000, context_tokens=2048).max_blocks_per_seq == 128
    assert engine_settings(EngineOptions(cuda_graphs=False), gpu, 1000, 2048) is None
    assert engine_settings(EngineOptions(), torch.device("cpu"), 1000, 2048) is None


def test_graphs_are_off_on_a_cpu_and_with_cuda_graphs_false(tiny_model_dir):
    folder = str(tiny_model_dir("llama"))
    for engine in (_engine(folder), _engine(folder, cuda_graphs=False)):
        assert engine.runner.decode_graphs is None and engine.kernels()["decode_graphs"] == "off"


def test_a_failing_capture_warns_once_and_decodes_eagerly_from_then_on(tiny_model_dir):
    folder = str(tiny_model_dir("llama"))
    prompts = swarm_prompts(trunk_len=100, suffix_len=7, agents=3)
    eager, failing = _engine(folder), _engine(folder)
    failing.runner.use_graphs(_static_settings(failing, capture=True))   # no GPU here: the capture raises
    with pytest.warns(UserWarning, match="decode graphs are off: capture failed") as caught:
        eager_tokens, failing_tokens = _side_by_side(eager, failing, prompts)
    assert len([w for w in caught if "decode graphs" in str(w.message)]) == 1
    assert failing_tokens == eager_tokens
    graphs = failing.runner.decode_graphs
    assert graphs.failure is not None and graphs.steps_run == 0 and not graphs.steps
    assert failing.kernels()["decode_graphs"].startswith("failed: ")


def test_buckets_double_up_to_the_largest():
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert buckets(1) == [1]
    assert buckets(100, 16) == [16, 32, 64, 100]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA/HIP graphs: needs a GPU")
def test_graphs_on_and_off_give_identical_greedy_tokens_on_the_gpu(tiny_model_dir):
    folder = str(tiny_model_dir("llama"))
    prompts = swarm_prompts(trunk_len=100, suffix_len=7, agents=AGENTS)
    outputs = {}
    for graphs in (True, False):
        engine = _engine(folder, device="cuda", dtype="float32", cuda_graphs=graphs)
        seqs = _add_agents(engine, prompts)
        while engine.has_work():
            engine.step()
        outputs[graphs] = [s.token_ids for s in seqs]
        if graphs:
            decode_graphs = engine.runner.decode_graphs
            assert decode_graphs.failure is None, decode_graphs.failure
            assert decode_graphs.steps_run == max(MAX_TOKENS) - 1
            assert all(step.graph is not None for step in decode_graphs.steps.values())
    assert outputs[True] == outputs[False]
