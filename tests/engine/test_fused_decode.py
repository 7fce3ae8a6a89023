"""A decode step's layers as one C call (the stack), or as three C calls each (engine.fused_decode), give the
logits of the PyTorch path bit for bit, on quantized tiny models of each family and on SmolLM2's own file, with
mixed steps (which take the PyTorch path for their decode rows) and shared trunks among them."""
import pytest
import torch

from engine import SamplingParams, fused_decode
from engine.llm_engine import EngineOptions, LLMEngine
from kernels.cpu.decode_layer import DecodeLayer
from tests.helpers.engine_runs import prompts_of, run_with_logits
from tests.helpers.tiny_gguf import smollm2_or_skip

pytestmark = pytest.mark.skipif(not DecodeLayer.available(), reason="no C compiler for the kernels")


def counted(monkeypatch, name: str) -> list:
    """A list that grows by one each time fused_decode.<name> runs: a layer's decode step (layer_step) or a whole
    step's layers (stack_step) in C."""
    calls, original = [], getattr(fused_decode, name)

    def counting(*args):
        result = original(*args)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(fused_decode, name, counting)
    return calls


def staggered_with_logits(engine, prompts, params):
    """Each prompt's greedy tokens and the logits they came from, the later prompts arriving once the first
    decodes (so their chunks run in mixed steps beside it); and how many mixed steps ran."""
    first = engine.add_request(prompts[0], params)
    logits = {first.seq_id: []}
    def step():
        result = engine.step()
        for (seq, _), row in zip(result.new_tokens, result.logits if result.logits is not None else []):
            logits[seq.seq_id].append(row)
        return result
    while first.num_output_tokens < 2:
        step()
    later = [engine.add_request(prompt, params) for prompt in prompts[1:]]
    logits.update({seq.seq_id: [] for seq in later})
    mixed_steps = 0
    while not all(seq.is_finished for seq in [first, *later]):
        decoding = not first.is_finished
        mixed_steps += bool(step().prompt_tokens and decoding)
    for seq in [first, *later]:
        engine.release(seq)
    return [(seq.output_token_ids, torch.stack(logits[seq.seq_id])) for seq in [first, *later]], mixed_steps


def fused_and_unfused(make_engine, prompts, params, monkeypatch, run=staggered_with_logits):
    """The runs stacked, layer by layer and unfused, each on an engine of its own (a prompt whose blocks another
    run left cached would compute fewer rows); the first two must equal the third."""
    stacked, by_layer = counted(monkeypatch, "stack_step"), counted(monkeypatch, "layer_step")
    fused, mixed_steps = run(make_engine(), prompts, params)
    assert any(stacked), "no decode step ran as one C call"
    with fused_decode.layer_by_layer():
        layered, _ = run(make_engine(), prompts, params)
    assert by_layer, "no decode step ran layer by layer in C"
    with fused_decode.unfused():
        unfused, _ = run(make_engine(), prompts, params)
    assert_same_runs(layered, unfused)
    return fused, unfused, mixed_steps


def assert_same_runs(runs, want):
    """The same tokens, from bitwise-equal logits, run for run."""
    assert len(runs) == len(want)
    for (tokens, logits), (want_tokens, want_logits) in zip(runs, want):
        assert tokens == want_tokens
        assert torch.equal(logits, want_logits)


@pytest.mark.parametrize("weights", ["q8_0", "q4_1"])
@pytest.mark.parametrize("variant", ["llama", "llama-1kv", "qwen2", "qwen3", "llama3-rope"])
def test_decode_steps_in_c_give_the_pytorch_paths_logits(tiny_model_dir, variant, weights, monkeypatch):
    options = EngineOptions(kv_budget_tokens=4096, mixed_step_tokens=24, weights=weights)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    fused, unfused, mixed_steps = fused_and_unfused(lambda: LLMEngine(str(tiny_model_dir(variant)), options),
                                                    prompts_of([5, 30, 61, 90], seed=2), params, monkeypatch)
    assert mixed_steps >= 1
    assert_same_runs(fused, unfused)


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_decode_steps_in_bfloat16_products_give_the_pytorch_paths_logits(tiny_model_dir, variant, monkeypatch):
    """Decode rows in bfloat16 products (engine.prompt_matmul.choose_decode, as auto takes them where measured
    faster): the stack, the layer-by-layer calls and the PyTorch path take the same weight sets, so the same bits."""
    from engine import prompt_matmul
    monkeypatch.setattr(prompt_matmul, "choose_decode", lambda precision: "bfloat16")
    options = EngineOptions(kv_budget_tokens=4096, mixed_step_tokens=24, weights="q4_1")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    fused, unfused, _ = fused_and_unfused(lambda: LLMEngine(str(tiny_model_dir(variant)), options),
                                          prompts_of([5, 30, 61, 90], seed=2), params, monkeypatch)
    assert_same_runs(fused, unfused)


def test_smollm2s_decode_steps_in_c_give_the_pytorch_paths_logits(monkeypatch):
    def make_engine():
        engine = LLMEngine(str(smollm2_or_skip()), EngineOptions(kv_budget_tokens=4096))
        assert all(layer.decode_kernel() is not None for layer in engine.runner.model.model.layers)
        return engine
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    fused, unfused, _ = fused_and_unfused(make_engine, prompts_of([40, 300, 7], seed=5), params, monkeypatch,
                                          run_with_logits)
    assert_same_runs(fused, unfused)


def test_float_weights_keep_the_pytorch_path(tiny_model_dir):
    engine = LLMEngine(str(tiny_model_dir("llama")), EngineOptions(kv_budget_tokens=4096, weights="float"))
    assert all(layer.decode_kernel() is None for layer in engine.runner.model.model.layers)


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_stacked_steps_read_a_shared_trunk_as_the_cascade_does(tiny_model_dir, variant, monkeypatch):
    trunk_reads = []
    trunks = fused_decode._trunks
    monkeypatch.setattr(fused_decode, "_trunks", lambda plan: trunk_reads.append(len(plan.prefixes)) or trunks(plan))
    trunk = prompts_of([300], seed=3)[0]   # past a chunk of the C decode kernels', where they cut a trunk
    prompts = [trunk + suffix for suffix in prompts_of([3, 20, 9], seed=4)] + prompts_of([40], seed=6)
    options = EngineOptions(kv_budget_tokens=4096, weights="q8_0")
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    fused, unfused, _ = fused_and_unfused(lambda: LLMEngine(str(tiny_model_dir(variant)), options), prompts, params,
                                          monkeypatch, run_with_logits)
    assert max(trunk_reads) == 1, "the three prompts' decode steps shared no trunk"
    assert_same_runs(fused, unfused)
