"""Greedy output and logits on GGUF files made by llama.cpp's own quantizer (tests/helpers/kquant_files),
against transformers loading the same files.

SmolLM2-135M-Instruct in Q4_K_M mixes types: its rows are 576 wide, not a multiple of 256, so llama.cpp
gives every matrix but ffn_down its fallback (Q5_0 for Q4_K, Q8_0 for Q6_K); ffn_down (1536 wide) is
Q4_K or Q6_K. A tiny llama with rows of 256 is K-quant throughout, in Q4_K_M, Q5_K_M and Q6_K.
"""
import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.kquant_files import smollm2_quantized, tensor_table
from tests.helpers.shared_trunk import assert_sharing_changes_no_output
from tests.helpers.tiny_models import reference_greedy

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse coding assistant."},
     {"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "List three prime numbers."}],
]
TINY_PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 8, 13, 21, 34, 55, 89, 144, 233, 19, 23, 29, 31, 37]
K_QUANTS = {"Q4_K", "Q5_K", "Q6_K"}
MATRIX_PARTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@pytest.fixture(scope="module")
def q4_k_m():
    return smollm2_quantized("Q4_K_M")


@pytest.fixture(scope="module")
def llm(q4_k_m):
    return LLM(str(q4_k_m), dtype="float32", kv_budget_tokens=8192)


def greedy_with_logits(llm: LLM, prompts: list[list[int]], steps: int) -> list[tuple[list[int], torch.Tensor]]:
    """Our greedy tokens for each prompt, batched, and the logits each token was chosen from."""
    engine = llm.engine
    seqs = [engine.add_request(p, SamplingParams(max_tokens=steps, ignore_eos=True)) for p in prompts]
    logits = {id(seq): [] for seq in seqs}
    while engine.has_work():
        result = engine.step()
        for (seq, _), row in zip(result.new_tokens, result.logits if result.logits is not None else []):
            logits[id(seq)].append(row)
    for seq in seqs:
        engine.release(seq)
    return [(seq.output_token_ids, torch.stack(logits[id(seq)])) for seq in seqs]


def assert_transformers_agrees(model, prompt: list[int], tokens: list[int], logits: torch.Tensor, atol: float):
    """transformers, fed the prompt and our tokens in one forward pass, picks each of our tokens
    itself (so its own greedy decoding gives the same tokens, by induction) from the same logits."""
    with torch.no_grad():
        theirs = model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
    assert theirs.argmax(dim=-1).tolist() == tokens
    torch.testing.assert_close(logits, theirs, rtol=1e-4, atol=atol)


def chat_ids(llm: LLM, messages: list[dict]) -> list[int]:
    return llm.tokenizer.encode(llm.tokenizer.apply_chat_template(messages))


def types_of(table, part: str) -> set[str]:
    return {entry.type for name, entry in table.items() if f".{part}." in name}


def test_llama_cpp_gave_smollm2_k_quants_where_rows_fit_and_fallbacks_elsewhere(q4_k_m):
    table = tensor_table(q4_k_m)
    assert types_of(table, "ffn_down") == {"Q4_K", "Q6_K"}
    narrow = set().union(*(types_of(table, part) for part in MATRIX_PARTS if part != "ffn_down"))
    assert narrow and narrow.isdisjoint(K_QUANTS), narrow


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "Q6_K"])
def test_the_engine_holds_every_tensor_in_the_files_own_format(llm, file_type):
    path = smollm2_quantized(file_type)
    loaded = llm if file_type == "Q4_K_M" else LLM(str(path), dtype="float32", kv_budget_tokens=64)
    in_file = {}
    for entry in tensor_table(path).values():
        in_file[entry.type] = in_file.get(entry.type, 0) + entry.nbytes
    assert loaded.weight_memory().by_format == in_file


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "Q6_K"])
def test_tiny_file_is_k_quant_in_every_matrix(tiny_kquant, file_type):
    table = tensor_table(tiny_kquant(file_type))
    matrices = {entry.type for name, entry in table.items() if not name.endswith("norm.weight")}
    assert matrices <= K_QUANTS and file_type[:4] in matrices


def test_smollm2_q4_k_m_greedy_and_logits_equal_transformers(llm, smollm2_q4_k_m_in_transformers):
    prompts = [chat_ids(llm, messages) for messages in PROMPTS]
    for prompt, (tokens, logits) in zip(prompts, greedy_with_logits(llm, prompts, 32)):
        # 30 float32 layers summed in another order than transformers': 1.5e-4 seen, 1e-4 holds on 2
        assert_transformers_agrees(smollm2_q4_k_m_in_transformers, prompt, tokens, logits, atol=5e-4)


def test_sharing_on_off_and_alone_give_identical_greedy_output_on_q4_k_m(llm, q4_k_m):
    unshared = LLM(str(q4_k_m), dtype="float32", kv_budget_tokens=8192, enable_prefix_caching=False)
    assert_sharing_changes_no_output(llm, unshared, max_tokens=8, alone=2)


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q5_K_M", "Q6_K"])
def test_tiny_k_quant_greedy_and_logits_equal_transformers(tiny_kquant, file_type):
    import transformers

    path = tiny_kquant(file_type)
    llm = LLM(str(path), dtype="float32", kv_budget_tokens=1024)
    [(tokens, logits)] = greedy_with_logits(llm, [TINY_PROMPT], 21)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                  dtype=torch.float32).eval()
    assert tokens == reference_greedy(reference, TINY_PROMPT, 21)   # its own decoding, KV cache and all
    assert_transformers_agrees(reference, TINY_PROMPT, tokens, logits, atol=1e-4)
