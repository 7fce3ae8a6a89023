"""load_model on tiny GGUF files and checkpoints: which kind each layer becomes, what the weights hold
by format, and that the layers kept in blocks compute what float ones do."""
import warnings

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.errors import OptionError
from engine.linear import Linear, PackedLinear
from engine.llm_engine import LLMEngine
from engine.loading.build import load_model
from engine.loading.loader import load_model_config, resolve_model
from engine.options import EngineOptions
from engine.quantized_layers import QuantizedEmbedding, QuantizedLinear
from engine.sampling import SamplingParams
from kernels.cpu import onednn_linear, quant_matmul
from tests.helpers.tiny_gguf import tiny_model, write_model
from tests.helpers.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not (quant_matmul.available() and onednn_linear.available()),
                                reason="needs the quantized decode kernel (a C compiler) and torch's oneDNN")

V = gguf.GGUFValueType
TOKENIZER = {"tokenizer.ggml.model": ("gpt2", V.STRING),   # enough for an engine fed token ids
             "tokenizer.ggml.tokens": ([f"t{i}" for i in range(512)], V.ARRAY)}
CPU = torch.device("cpu")
PROJECTIONS = 7   # q, k, v, o, gate, up, down
KEPT = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny llama as a GGUF file of one block type, with its lm_head tied to the embedding or not."""
    root = tmp_path_factory.mktemp("tiny_gguf")

    def write(tied: bool, qtype: Q = Q.Q8_0):
        path = root / f"tiny-{qtype.name}-{'tied' if tied else 'untied'}.gguf"
        if not path.exists():
            write_model(path, tiny_model("llama", tie_word_embeddings=tied), qtype, extra=TOKENIZER)
        return path

    return write


def load(path, dtype=torch.float32, **options):
    source = resolve_model(str(path))
    return load_model(source, load_model_config(source), CPU, dtype, EngineOptions(**options))


def linear_layers(net) -> dict:
    return {name: module for name, module in net.named_modules() if name.endswith("_proj") or name == "lm_head"}


def file_bytes(path) -> dict[str, int]:
    """The file's tensor bytes by type, read by gguf's own reader."""
    by_type = {}
    for tensor in gguf.GGUFReader(path).tensors:
        by_type[tensor.tensor_type.name] = by_type.get(tensor.tensor_type.name, 0) + int(tensor.n_bytes)
    return by_type


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_gguf_files_matrices_stay_in_its_blocks_and_nothing_is_packed(tiny_gguf, tied):
    loaded = load(tiny_gguf(tied))
    net = loaded.net
    layers = linear_layers(net)
    assert len(layers) == PROJECTIONS * net.config.num_layers + 1
    assert {type(layer) for layer in layers.values()} == {QuantizedLinear}
    assert {layer.quantized.format for layer in layers.values()} == {"Q8_0"}
    assert isinstance(net.model.embed_tokens, QuantizedEmbedding)
    assert (net.lm_head.quantized is net.model.embed_tokens.quantized) == tied
    assert loaded.packed == 0


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_weights_hold_exactly_the_files_tensor_bytes(tiny_gguf, tied):
    path = tiny_gguf(tied)
    weights = load(path).weights
    assert weights.by_format == file_bytes(path)   # norms are F32 in the file and in the engine
    assert weights.total_bytes == sum(file_bytes(path).values())
    assert weights.label == "Q8_0"


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_weights_float_dequantizes_at_load_into_packed_or_plain_layers(tiny_gguf, tied):
    packed = load(tiny_gguf(tied), weights="float")
    plain = load(tiny_gguf(tied), weights="float", onednn_weights=False)
    kinds = {name: type(layer) for name, layer in linear_layers(packed.net).items()}
    assert set(kinds.values()) == ({PackedLinear, Linear} if tied else {PackedLinear})
    if tied:   # the embedding reads the plain weight, so a tied lm_head is never packed
        assert kinds["lm_head"] is Linear and packed.net.lm_head.weight is packed.net.model.embed_tokens.weight
    assert {type(layer) for layer in linear_layers(plain.net).values()} == {Linear}
    assert packed.packed == PROJECTIONS * packed.net.config.num_layers + (0 if tied else 1)
    assert set(plain.weights.by_format) == {"F32"} and plain.weights.label == "F32"
    assert plain.weights.total_bytes == sum(p.numel() * 4 for p in plain.net.parameters())


def test_a_safetensors_folder_keeps_its_float_weights(tiny_model_dir):
    folder = load(tiny_model_dir("llama"))
    assert {type(layer) for layer in linear_layers(folder.net).values()} == {PackedLinear}
    assert set(folder.weights.by_format) == {"F32"}


def test_bfloat16_keeps_the_blocks_and_multiplies_through_the_scratch(tiny_gguf):
    loaded = load(tiny_gguf(tied=False), dtype=torch.bfloat16)
    assert {type(layer) for layer in linear_layers(loaded.net).values()} == {QuantizedLinear}
    x = torch.randn(3, loaded.net.config.hidden_size, dtype=torch.bfloat16)
    assert loaded.net.lm_head(x).dtype == torch.bfloat16


def greedy_with_logits(path, **options):
    engine = LLMEngine(str(path), EngineOptions(device="cpu", dtype="float32", kv_budget_tokens=512, **options))
    prompts = [[5, 17, 42, 99, 3, 250, 7, 61, 8, 13, 21, 34, 55, 89, 144, 233, 19][: 9 + 4 * i] for i in range(3)]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts]
    logits = []
    while engine.has_work():
        logits.append(engine.step().logits)
    return [seq.output_token_ids for seq in seqs], torch.cat([rows for rows in logits if rows is not None])


@pytest.mark.parametrize("qtype", KEPT, ids=lambda q: q.name)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_layers_kept_in_blocks_give_the_greedy_tokens_and_logits_of_float_ones(tiny_gguf, tied, qtype):
    path = tiny_gguf(tied, qtype)
    tokens, logits = greedy_with_logits(path)
    float_tokens, float_logits = greedy_with_logits(path, weights="float", onednn_weights=False)
    assert tokens == float_tokens
    assert logits.shape == (3 * 6, 512)
    # Summation order alone: the decode kernel's against BLAS's, through two layers and six steps. Random
    # K-quant blocks make weights up to ~10 and logits of ~200, where float32 sums of 512 products then
    # differ by up to ~2e-4 of the largest logit (Q6_K, tied: 0.042 of 225); so the bound scales with it.
    torch.testing.assert_close(logits, float_logits, rtol=1e-4, atol=5e-4 * max(1.0, float_logits.abs().max()))


def test_a_checkpoint_quantized_at_load_equals_the_same_model_written_as_q8_0_by_gguf(tmp_path):
    """gguf's quantizer makes both: at load from the folder, and in the file gguf's writer wrote."""
    from transformers import AutoModelForCausalLM

    folder = make_tiny_model(tmp_path / "folder", "llama")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    vocabulary = {**TOKENIZER, "tokenizer.ggml.tokens": ([f"t{i}" for i in range(model.config.vocab_size)], V.ARRAY)}
    path = write_model(tmp_path / "tiny-Q8_0.gguf", model, Q.Q8_0, extra=vocabulary)
    from_folder = load(folder, weights="q8_0")
    assert {layer.quantized.format for layer in linear_layers(from_folder.net).values()} == {"Q8_0"}
    assert from_folder.weights.by_format == load(path).weights.by_format
    assert from_folder.weights.label == "Q8_0"
    tokens, logits = greedy_with_logits(folder, weights="q8_0")
    file_tokens, file_logits = greedy_with_logits(path)
    assert tokens == file_tokens
    torch.testing.assert_close(logits, file_logits, rtol=1e-5, atol=1e-5)


def test_a_format_no_kernel_reads_is_dequantized_at_load_with_a_one_line_note(tiny_gguf):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load(tiny_gguf(tied=False, qtype=Q.Q3_K))
    notes = [str(w.message) for w in caught if "dequantized at load" in str(w.message)]
    assert len(notes) == 1 and "\n" not in notes[0]
    assert "Q3_K (16," in notes[0] and "GB more than in the file" in notes[0]   # 7 x 2 layers, lm_head, embedding
    assert {type(layer) for layer in linear_layers(loaded.net).values()} == {PackedLinear}


def test_quantizing_a_gguf_file_again_is_refused(tiny_gguf):
    with pytest.raises(OptionError, match="keeps its own formats"):
        load(tiny_gguf(tied=False), weights="q8_0")
    with pytest.raises(OptionError, match="use one of auto, float, q8_0"):
        load(tiny_gguf(tied=False), weights="q3_k")


def test_quantizing_a_qwen3_5_checkpoint_at_load_is_refused_in_one_line(tiny_model_dir):
    with pytest.raises(OptionError, match="not supported for Qwen3.5 yet") as caught:
        load(tiny_model_dir("qwen3_5"), weights="q8_0")
    assert "\n" not in str(caught.value)
    assert type(load(tiny_model_dir("qwen3_5"), weights="float").net).__name__ == "HybridCausalLM"
