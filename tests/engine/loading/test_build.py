"""load_model on tiny quantized GGUF files: which kind each linear layer becomes, what the counts
say, and that the swapped layers compute what the plain ones do."""
import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.linear import Linear, PackedLinear, QuantizedLinear
from engine.llm_engine import LLMEngine
from engine.loading.build import load_model
from engine.loading.gguf_file import read_gguf_quantized
from engine.loading.loader import load_model_config, resolve_model
from engine.options import EngineOptions
from engine.sampling import SamplingParams
from kernels.cpu import onednn_linear, quant_matmul
from tests.helpers.tiny_gguf import tiny_model, write_model

pytestmark = pytest.mark.skipif(not (quant_matmul.available() and onednn_linear.available()),
                                reason="needs the quantized decode kernel (a C compiler) and torch's oneDNN")

V = gguf.GGUFValueType
TOKENIZER = {"tokenizer.ggml.model": ("gpt2", V.STRING),   # enough for an engine fed token ids
             "tokenizer.ggml.tokens": ([f"t{i}" for i in range(512)], V.ARRAY)}
CPU = torch.device("cpu")
PROJECTIONS = 7   # q, k, v, o, gate, up, down
KINDS = {   # (quantized_decode, onednn_weights) -> (the layer's class, that of the layer it stands in for)
    (True, True): (QuantizedLinear, PackedLinear),
    (True, False): (QuantizedLinear, Linear),
    (False, True): (PackedLinear, None),
    (False, False): (Linear, None),
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny llama as a Q8_0 GGUF file, with its lm_head tied to the embedding or not."""
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


def kind(layer) -> tuple[type, type | None]:
    return type(layer), type(layer.dense) if isinstance(layer, QuantizedLinear) else None


def linear_layers(net) -> dict:
    return {name: module for name, module in net.named_modules() if name.endswith("_proj") or name == "lm_head"}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize(("quantized_decode", "onednn_weights"), list(KINDS))
def test_each_linear_layer_is_the_kind_the_options_ask_for(tiny_gguf, tied, quantized_decode, onednn_weights):
    net = load(tiny_gguf(tied), quantized_decode=quantized_decode, onednn_weights=onednn_weights).net
    layers = linear_layers(net)
    assert len(layers) == PROJECTIONS * net.config.num_layers + 1
    expected = KINDS[(quantized_decode, onednn_weights)]
    assert {name: kind(layer) for name, layer in layers.items() if name != "lm_head"} == {
        name: expected for name in layers if name != "lm_head"}
    if not tied:
        assert kind(net.lm_head) == expected
    else:   # the embedding reads the plain weight, so a tied lm_head is never packed
        assert kind(net.lm_head) == ((QuantizedLinear, Linear) if quantized_decode else (Linear, None))


def test_a_tied_lm_head_decodes_from_the_embeddings_blocks_and_keeps_the_embeddings_weight(tiny_gguf):
    path = tiny_gguf(tied=True)
    net = load(path).net
    embedding_blocks = read_gguf_quantized(path)["model.embed_tokens.weight"]
    assert torch.equal(net.lm_head.quantized.codes, embedding_blocks.codes)
    assert net.lm_head.dense.weight is net.model.embed_tokens.weight


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_counts_are_the_files_blocks_and_the_weights_packed(tiny_gguf, tied):
    path = tiny_gguf(tied)
    loaded, plain = load(path), load(path, quantized_decode=False, onednn_weights=False)
    blocks = read_gguf_quantized(path)   # the embedding's are held only by a tied lm_head, once
    held = blocks if tied else {name: b for name, b in blocks.items() if name != "model.embed_tokens.weight"}
    quantized_bytes = sum(b.nbytes for b in held.values())
    assert loaded.quantized_bytes == quantized_bytes > 0
    assert loaded.weight_bytes == plain.weight_bytes + quantized_bytes
    assert plain.weight_bytes == sum(p.numel() * p.element_size() for p in plain.net.parameters())
    assert loaded.packed == PROJECTIONS * loaded.net.config.num_layers + (0 if tied else 1)
    assert (plain.quantized_bytes, plain.packed) == (0, 0)


def test_bfloat16_and_a_safetensors_folder_keep_plain_linear_layers(tiny_gguf, tiny_model_dir):
    in_bfloat16 = load(tiny_gguf(tied=False), dtype=torch.bfloat16)
    folder = load(tiny_model_dir("llama"))
    assert {kind(layer) for layer in linear_layers(in_bfloat16.net).values()} == {(Linear, None)}
    assert (in_bfloat16.quantized_bytes, in_bfloat16.packed) == (0, 0)
    assert {kind(layer) for layer in linear_layers(folder.net).values()} == {(PackedLinear, None)}
    assert folder.quantized_bytes == 0


def greedy_with_logits(path, **options):
    engine = LLMEngine(str(path), EngineOptions(device="cpu", dtype="float32", kv_budget_tokens=512, **options))
    prompts = [[5, 17, 42, 99, 3, 250, 7, 61, 8, 13, 21, 34, 55, 89, 144, 233, 19][: 9 + 4 * i] for i in range(3)]
    seqs = [engine.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True)) for p in prompts]
    logits = []
    while engine.has_work():
        logits.append(engine.step().logits)
    return [seq.output_token_ids for seq in seqs], torch.cat([rows for rows in logits if rows is not None])


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q4_0], ids=lambda q: q.name)
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_swapped_layers_give_the_greedy_tokens_and_logits_of_plain_ones(tiny_gguf, tied, qtype):
    path = tiny_gguf(tied, qtype)
    tokens, logits = greedy_with_logits(path)
    plain_tokens, plain_logits = greedy_with_logits(path, quantized_decode=False, onednn_weights=False)
    assert tokens == plain_tokens
    assert logits.shape == (3 * 6, 512)
    torch.testing.assert_close(logits, plain_logits, rtol=1e-4, atol=1e-4)
