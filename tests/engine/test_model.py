"""Our transformer against Hugging Face transformers on tiny random models of every family."""
import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.conftest import ALL_VARIANTS
from tests.helpers.tiny_models import HYBRID_VARIANTS, load_reference, reference_greedy

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 8, 13, 21, 34, 55, 89, 144, 233, 19, 23, 29, 31, 37]


def _our_greedy_with_logits(llm: LLM, prompt: list[int], steps: int):
    engine = llm.engine
    seq = engine.add_request(prompt, SamplingParams(max_tokens=steps, ignore_eos=True))
    logits = []
    while not seq.is_finished:
        result = engine.step()
        for (s, _), row in zip(result.new_tokens, result.logits if result.logits is not None else []):
            if s is seq:
                logits.append(row)
    engine.release(seq)
    return seq.output_token_ids, torch.stack(logits)


@pytest.mark.parametrize("variant", ALL_VARIANTS + list(HYBRID_VARIANTS))
def test_logits_and_greedy_tokens_match_transformers(tiny_model_dir, variant):
    folder = tiny_model_dir(variant)
    llm = LLM(str(folder), dtype="float32", kv_budget_tokens=1024)
    tokens, logits = _our_greedy_with_logits(llm, PROMPT, steps=21)
    reference = load_reference(folder)
    with torch.no_grad():
        expected = reference_greedy(reference, PROMPT, 21)
        full = torch.tensor([PROMPT + tokens[:-1]])
        ref_logits = reference(full).logits[0, len(PROMPT) - 1:]
    assert tokens == expected
    assert logits.shape == ref_logits.shape
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)


def test_batched_greedy_equals_one_at_a_time(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("qwen3")), dtype="float32", kv_budget_tokens=2048)
    prompts = [PROMPT[: 5 + 3 * i] for i in range(5)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    batched = [out.token_ids for out in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    assert batched == alone


def test_bfloat16_runs_and_stays_close_to_float32(tiny_model_dir):
    folder = str(tiny_model_dir("llama"))
    f32 = LLM(folder, dtype="float32", kv_budget_tokens=512)
    bf16 = LLM(folder, dtype="bfloat16", kv_budget_tokens=512)
    _, a = _our_greedy_with_logits(f32, PROMPT, steps=1)
    _, b = _our_greedy_with_logits(bf16, PROMPT, steps=1)
    assert bf16.engine.runner.kv.layers[0][0].dtype == torch.bfloat16
    assert torch.allclose(a, b.float(), atol=0.1)


def test_cpu_float32_weights_are_multiplied_by_onednn_and_the_tied_lm_head_keeps_the_embeddings(tiny_model_dir):
    from engine.linear import Linear, PackedLinear
    from kernels.cpu import onednn_linear
    if not onednn_linear.available():
        pytest.skip("this torch build has no oneDNN linear")
    folder = str(tiny_model_dir("llama-tied"))
    packed = LLM(folder, dtype="float32", kv_budget_tokens=512)
    plain = LLM(folder, dtype="float32", kv_budget_tokens=512, onednn_weights=False)
    net = packed.engine.runner.model
    layer = net.model.layers[0]
    assert isinstance(layer.mlp.down_proj, PackedLinear) and layer.mlp.down_proj.weight.layout == torch._mkldnn
    assert layer.self_attn.q_proj.weight.layout == torch._mkldnn
    assert net.lm_head.weight is net.model.embed_tokens.weight and type(net.lm_head) is Linear
    assert type(plain.engine.runner.model.model.layers[0].mlp.down_proj) is Linear
    assert packed.engine.weight_bytes == plain.engine.weight_bytes
    tokens, logits = _our_greedy_with_logits(packed, PROMPT, steps=8)
    plain_tokens, plain_logits = _our_greedy_with_logits(plain, PROMPT, steps=8)
    assert tokens == plain_tokens
    torch.testing.assert_close(logits, plain_logits, atol=1e-4, rtol=1e-4)
