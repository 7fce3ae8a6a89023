"""engine/loading/gguf_tokenizer.py (through read_gguf_tokenizer) against transformers' GGUF tokenizer."""
from __future__ import annotations

import unicodedata

import pytest
from gguf import GGUFValueType as V
from tokenizers import Tokenizer as Backend
from tokenizers import pre_tokenizers

from engine.errors import ModelLoadError
from engine.loading.gguf_file import read_gguf_tokenizer
from tests.helpers.tiny_gguf import smollm2_or_skip, tokenizer_metadata, write_metadata_only

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello, world!",
    "",
    'def fib(n):\n    """Return the n-th Fibonacci number."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n',
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot\r\n",
    "naïve café — Ünïcödé façade; Ελληνικά; русский текст",
    "日本語のテキストと中文混合，한국어도 있어요。",
    "emoji 😀👍🏽👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "a  b   c\t\td\n\n\n  e    \n",
    "   leading and trailing   ",
    "line1\r\nline2\rline3\n\n",
    "In 2024, 3.14159 * 1,000,000 = 3141590.0 and x² + y³ ½; call +1-555-0100",
    "return  1\n\t42",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start |> <im_end> <|endoftext|>text<|unknown|><repo_name>x<file_sep>",
    "I'm sure they'll say it's what we'd've done, DON'T YOU?",
    '{"name": "swarm", "tools": [{"type": "function", "parameters": {}}]}',
]
NO_NUMBERS = [text for text in TEXTS if not any(unicodedata.category(c).startswith("N") for c in text)]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Leaves fall\nquietly"},
     {"role": "user", "content": "Another, with émojis 🍂"}],
]


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_or_skip()


@pytest.fixture(scope="module")
def ours(smollm2):
    return read_gguf_tokenizer(smollm2)


@pytest.fixture(scope="module")
def theirs(smollm2):
    return transformers.AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)


@pytest.fixture(scope="module")
def smollm2_reference(theirs):
    """transformers' GGUF tokenizer with the pre-tokenizer SmolLM2's own tokenizer.json declares:
    single digits, then byte-level GPT-2 splitting. transformers ignores tokenizer.ggml.pre="smollm"
    and splits " 1" as one piece; llama.cpp, like the original tokenizer, splits digits first."""
    reference = Backend.from_str(theirs.backend_tokenizer.to_str())
    reference.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return reference


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_smollm2_reference(ours, smollm2_reference, text):
    assert ours.encode(text) == smollm2_reference.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("text", NO_NUMBERS)
def test_ids_match_transformers_where_digits_play_no_part(ours, theirs, text):
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips_and_matches_transformers(ours, theirs, text):
    ids = ours.encode(text)
    assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_control_tokens_are_whole_and_special(ours, theirs):
    for token_id in range(17):  # SmolLM2 marks its first 17 tokens as control tokens
        token = theirs.convert_ids_to_tokens(token_id)
        assert ours.encode(f"x{token}y") == [ours.encode("x")[0], token_id, ours.encode("y")[0]]
    assert ours.decode(ours.encode("<|im_start|>hi<|im_end|>")) == "hi"


def test_special_token_settings_match_transformers(ours, theirs):
    assert (ours.bos_token, ours.eos_token) == (theirs.bos_token, theirs.eos_token)
    assert (ours.bos_token_id, ours.eos_token_ids) == (1, [2])
    assert ours.add_bos_token is False
    assert ours.vocab_size == len(theirs) == 49152
    assert ours.encode("hi", add_special_tokens=True) == theirs.encode("hi")


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_renders_like_transformers(ours, theirs, messages, generation_prompt):
    expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt) == expected


# --- other pre-tokenizers, on SmolLM2's vocabulary --------------------------------------------

@pytest.fixture(scope="module")
def smollm2_tokenizer_metadata(smollm2):
    return tokenizer_metadata(smollm2)


def write_variant(folder, metadata, **changes):
    """A metadata-only GGUF: `metadata` with `changes`, where None removes a key."""
    path = folder / f"variant-{len(list(folder.iterdir()))}.gguf"
    changed = {key: value for key, value in (metadata | changes).items() if value is not None}
    return write_metadata_only(path, "llama", changed)


def transformers_backend(path):
    """The backend AutoTokenizer.from_pretrained(gguf_file=...) builds, without its slow config pass."""
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokenizer_dict, _ = get_gguf_tokenizer(str(path))
    return convert_gguf_tokenizer(architecture, tokenizer_dict)[0]


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt-2", "no-such-pre-tokenizer"])
def test_pre_tokenizer_variants_match_transformers(tmp_path, smollm2_tokenizer_metadata, pre):
    path = write_variant(tmp_path, smollm2_tokenizer_metadata, **{"tokenizer.ggml.pre": (pre, V.STRING)})
    ours, theirs = read_gguf_tokenizer(path), transformers_backend(path)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids, text


# A five-token vocabulary, for what needs no real one.
TINY_VOCAB = {
    "tokenizer.ggml.model": ("gpt2", V.STRING),
    "tokenizer.ggml.tokens": (["<s>", "</s>", "a", "b", "ab"], V.ARRAY),
    "tokenizer.ggml.token_type": ([3, 3, 1, 1, 1], V.ARRAY),
    "tokenizer.ggml.merges": (["a b"], V.ARRAY),
    "tokenizer.ggml.bos_token_id": (0, V.UINT32),
    "tokenizer.ggml.eos_token_id": (1, V.UINT32),
}


def test_llama3_vocabularies_add_bos_unless_told_not_to(tmp_path):
    # llama.cpp (llama-vocab.cpp) turns add_bos on for llama3-style `pre` names when the key is absent
    llama3 = write_variant(tmp_path, TINY_VOCAB, **{"tokenizer.ggml.pre": ("llama-bpe", V.STRING)})
    gpt2 = write_variant(tmp_path, TINY_VOCAB, **{"tokenizer.ggml.pre": ("gpt-2", V.STRING)})
    told = write_variant(tmp_path, TINY_VOCAB, **{"tokenizer.ggml.pre": ("llama-bpe", V.STRING),
                                                   "tokenizer.ggml.add_bos_token": (False, V.BOOL)})
    assert read_gguf_tokenizer(llama3).encode("abab", add_special_tokens=True) == [0, 4, 4]
    assert read_gguf_tokenizer(gpt2).encode("abab", add_special_tokens=True) == [4, 4]
    assert read_gguf_tokenizer(told).add_bos_token is False


def test_end_of_turn_token_also_ends_generation(tmp_path):
    path = write_variant(tmp_path, TINY_VOCAB, **{"tokenizer.ggml.eot_token_id": (4, V.UINT32)})
    tokenizer = read_gguf_tokenizer(path)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.eos_token_ids) == ("<s>", "</s>", [1, 4])


# --- tokenizers that cannot be built --------------------------------------------------------

@pytest.mark.parametrize("changes", [
    {"tokenizer.ggml.model": ("llama", V.STRING)},
    {"tokenizer.ggml.merges": (["a b", "no-such-piece another-missing-piece"], V.ARRAY)},
    {"tokenizer.ggml.tokens": None},
])
def test_unusable_tokenizer_metadata_is_a_model_load_error(tmp_path, changes):
    path = write_variant(tmp_path, TINY_VOCAB, **changes)
    with pytest.raises(ModelLoadError) as info:
        read_gguf_tokenizer(path)
    assert "\n" not in str(info.value) and path.name in str(info.value)


def test_file_without_tokenizer_is_a_model_load_error(tmp_path):
    path = write_metadata_only(tmp_path / "bare.gguf", "llama", {"llama.block_count": (2, V.UINT32)})
    with pytest.raises(ModelLoadError) as info:
        read_gguf_tokenizer(path)
    assert "\n" not in str(info.value) and path.name in str(info.value)
