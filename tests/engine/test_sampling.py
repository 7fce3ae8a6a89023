"""Sampling through the engine: seeds reproduce whatever the batch, limits hold, stops stop
(tests/engine/test_sampler.py tests the sampler itself)."""
import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), kv_budget_tokens=4096)


def test_seeded_request_is_reproducible_whatever_else_is_in_the_batch(llm):
    prompt = list(range(5, 30))
    params = SamplingParams(max_tokens=15, temperature=1.0, seed=1234, ignore_eos=True)
    alone = llm.generate([prompt], params)[0].token_ids
    noisy = SamplingParams(max_tokens=15, temperature=1.5, ignore_eos=True)
    batched = llm.generate([list(range(40, 60)), prompt, list(range(7, 19))], [noisy, params, noisy])
    assert batched[1].token_ids == alone


def test_different_seeds_differ(llm):
    prompt = list(range(5, 30))
    runs = {tuple(llm.generate([prompt], SamplingParams(max_tokens=12, temperature=2.0, seed=s,
                                                            ignore_eos=True))[0].token_ids) for s in range(4)}
    assert len(runs) > 1


def test_top_k_one_is_greedy(llm):
    prompt = list(range(5, 30))
    greedy = llm.generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True))[0].token_ids
    top1 = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.8, top_k=1, seed=3,
                                                 ignore_eos=True))[0].token_ids
    assert top1 == greedy


def test_stop_token_ids_and_max_tokens(llm):
    prompt = list(range(5, 30))
    greedy = llm.generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 10
    stop_at = greedy.token_ids[3]
    stopped = llm.generate([prompt], SamplingParams(max_tokens=10, stop_token_ids=[stop_at], ignore_eos=True))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == greedy.token_ids[:greedy.token_ids.index(stop_at) + 1]


def test_stop_string_truncates_text(llm):
    prompt = list(range(5, 30))
    greedy = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    text = greedy.text
    cut = text[len(text) // 2: len(text) // 2 + 2]
    if not cut.strip():
        pytest.skip("generated text has no usable middle")
    stopped = llm.generate([prompt], SamplingParams(max_tokens=12, stop=[cut], ignore_eos=True))[0]
    assert stopped.finish_reason == "stop"
    assert cut not in stopped.text and text.startswith(stopped.text)


def test_eos_stops_unless_ignored(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_budget_tokens=4096)
    prompt = list(range(5, 30))
    first = llm.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0].token_ids[0]
    llm.engine.eos_token_ids = {first}
    assert llm.generate([prompt], SamplingParams(max_tokens=5))[0].finish_reason == "stop"
    assert len(llm.generate([prompt], SamplingParams(max_tokens=5, ignore_eos=True))[0].token_ids) == 5


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
