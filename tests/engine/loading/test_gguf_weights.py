"""engine/loading/gguf_weights.py (and gguf_file.py's config) on Qwen3.5 GGUF files ("qwen35"), written from tiny
random transformers models as llama.cpp's converter writes them, against transformers on the same weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine import LLM, SamplingParams
from engine.loading.config import ModelConfig
from engine.loading.gguf_file import read_gguf_config
from engine.loading.gguf_weights import iter_gguf_weights, read_gguf_tensors
from kernels.reference.quant_blocks import QuantizedTensor
from tests.helpers.tiny_models import load_reference, reference_greedy
from tests.helpers.tiny_qwen35_gguf import round_like_the_file, write_qwen35

PROMPT = [5, 17, 42, 99, 3, 250, 7, 61, 8, 13, 21, 34, 55, 89, 144, 233, 19]
STEPS = 21   # the prefill's token and 20 decode steps
# "qwen3_5": 2 key heads, 4 value heads (the file tiles them); "qwen3_5-odd-tied": 1 key head, 3 value heads
VARIANTS = ["qwen3_5", "qwen3_5-odd-tied"]


@pytest.fixture
def qwen35_file(tiny_model_dir, tmp_path):
    """(the GGUF, transformers on the weights the file holds) for a variant and a type."""

    def make(variant: str, qtype: Q, conv1d_type: Q = Q.F32):
        reference = load_reference(tiny_model_dir(variant))
        round_like_the_file(reference, qtype, conv1d_type)
        path = write_qwen35(tmp_path / f"{variant}.{qtype.name}.gguf", reference, qtype, conv1d_type)
        return path, reference

    return make


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_config_is_the_checkpoints(tiny_model_dir, qwen35_file, variant):
    path, _ = qwen35_file(variant, Q.F32)
    ours = ModelConfig.from_dict(read_gguf_config(path))
    theirs = ModelConfig.from_file(tiny_model_dir(variant) / "config.json")
    assert ours.architecture == "Qwen3_5ForCausalLM" and ours.family == "qwen3_5"
    for field in ("layer_types", "linear_attention", "partial_rotary_factor", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "hidden_size", "intermediate_size", "vocab_size", "tie_word_embeddings",
                  "qk_norm", "attention_bias"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rotary_dim == theirs.rotary_dim and ours.kv_layers == theirs.kv_layers


@pytest.mark.parametrize("variant", VARIANTS)
def test_float32_tensors_are_the_checkpoints_under_its_names(qwen35_file, variant):
    path, reference = qwen35_file(variant, Q.F32)
    ours = read_gguf_tensors(path)
    theirs = {name: t for name, t in reference.state_dict().items()
              if not (name == "lm_head.weight" and reference.config.tie_word_embeddings)}
    assert set(ours) == set(theirs)
    for name, tensor in ours.items():
        # 1 + w and -exp(A_log) undone in float32: a rounding off; everything else bit for bit
        tolerance = 1e-6 if name.endswith(("norm.weight", "A_log")) else 0.0
        torch.testing.assert_close(tensor, theirs[name], atol=tolerance, rtol=tolerance, msg=name)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16])
def test_logits_and_greedy_tokens_match_transformers(qwen35_file, variant, qtype):
    path, reference = qwen35_file(variant, qtype, conv1d_type=qtype)   # an F16 conv1d: not kept as a matrix
    tokens, logits = engine_run(path)
    expected_tokens, expected_logits = transformers_run(reference, tokens)
    assert tokens == expected_tokens
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)


def test_the_multi_token_prediction_layer_the_converter_appends_is_skipped_with_a_note(tiny_model_dir, tmp_path):
    reference = load_reference(tiny_model_dir("qwen3_5"))
    path = write_qwen35(tmp_path / "with-mtp.gguf", reference, Q.F32, mtp_layer=True)
    assert ModelConfig.from_dict(read_gguf_config(path)).num_layers == 4
    with pytest.warns(UserWarning, match="skipped 2 multi-token-prediction tensors of with-mtp.gguf"):
        tokens, logits = engine_run(path)
    expected_tokens, expected_logits = transformers_run(reference, tokens)
    assert tokens == expected_tokens
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)


def test_q8_0_matrices_stay_in_blocks_and_match_transformers_on_the_dequantized_weights(qwen35_file):
    path, reference = qwen35_file("qwen3_5", Q.Q8_0)
    kept = {name for name, value in iter_gguf_weights(path, lambda *_: True) if isinstance(value, QuantizedTensor)}
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in kept and "model.layers.3.self_attn.q_proj.weight" in kept
    # out_proj's value heads move by 8 columns, inside Q8_0's blocks of 32: it is dequantized to be put back
    assert "model.layers.0.linear_attn.out_proj.weight" not in kept
    assert not any("conv1d" in name for name in kept)
    tokens, logits = engine_run(path)
    expected_tokens, expected_logits = transformers_run(reference, tokens)
    assert tokens == expected_tokens
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)


def test_llama_cpp_reads_the_file_as_transformers_computes_it(qwen35_file):
    """The writer's tiled value heads, 1 + w norms and -exp(A_log) are what llama.cpp itself expects: its logits
    are transformers' to its own rounding (0.009 here; the value heads left grouped give 0.36). Its loader wants
    value heads as wide as key heads, which "qwen3_5" has."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path, reference = qwen35_file("qwen3_5", Q.F32)
    tokens = PROMPT + list(range(40, 60))
    model = llama_cpp.Llama(str(path), logits_all=True, verbose=False, n_ctx=256, n_threads=1, type_k=0, type_v=0)
    model.eval(tokens)
    theirs = torch.tensor(np.array(model.scores[:len(tokens)]))
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]
    assert (theirs - expected).abs().max() < 0.03


def engine_run(path) -> tuple[list[int], torch.Tensor]:
    """The engine's greedy tokens on the file, and the logits of each."""
    engine = LLM(str(path), dtype="float32", kv_budget_tokens=1024).engine
    seq = engine.add_request(PROMPT, SamplingParams(max_tokens=STEPS, ignore_eos=True))
    logits = []
    while not seq.is_finished:
        logits += list(engine.step().logits)   # one sequence: a row each step
    return seq.output_token_ids, torch.stack(logits)


def transformers_run(reference, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.no_grad():
        expected = reference_greedy(reference, PROMPT, STEPS)
        logits = reference(torch.tensor([PROMPT + tokens[:-1]])).logits[0, len(PROMPT) - 1:]
    return expected, logits
