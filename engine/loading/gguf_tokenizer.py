"""A `tokenizers` backend rebuilt from the tokenizer a GGUF file describes in its metadata.

A GGUF file has no tokenizer.json. llama.cpp stores the pieces instead:

    tokenizer.ggml.model       "gpt2" for byte-level BPE (the only kind read here)
    tokenizer.ggml.tokens      every token, spelled in the byte-level alphabet ("Ġhello")
    tokenizer.ggml.merges      "Ġ h" pairs, best first
    tokenizer.ggml.token_type  per token: control tokens (<|im_start|>) and user-defined ones
                               are matched whole in text, never cut by BPE
    tokenizer.ggml.pre         which split regex runs before BPE ("smollm", "llama-bpe", "qwen2")
    tokenizer.chat_template    the Jinja template of the original tokenizer_config.json

The split regexes are llama.cpp's, keyed by the same `pre` names, so ids match llama.cpp's.
"""
from __future__ import annotations

from gguf import TokenType
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from engine.errors import ModelLoadError
from engine.loading.tokenizer import Tokenizer

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SINGLE_DIGITS = r"\p{N}"

LLAMA3_PRES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}
QWEN2_PRES = {"qwen2", "deepseek-r1-qwen", "stablelm2"}
DIGIT_SPLIT_PRES = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}


def tokenizer_from_metadata(metadata: dict, source: str) -> Tokenizer:
    """The tokenizer of a GGUF file, from its metadata dict. `source` names the file in errors."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(
            f"{source}: tokenizer model {model!r} is not supported; supported: 'gpt2' (byte-level BPE)")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens or not isinstance(tokens, list):
        raise ModelLoadError(f"{source}: metadata has no tokenizer.ggml.tokens; the file carries no tokenizer")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    try:
        backend = _byte_level_bpe(tokens, metadata.get("tokenizer.ggml.merges", []), pre)
        _add_whole_tokens(backend, tokens, metadata.get("tokenizer.ggml.token_type") or [])
    except Exception as err:  # tokenizers raises plain Exceptions; a bad list type raises others
        raise ModelLoadError(f"{source}: the tokenizer metadata is inconsistent "
                             f"({str(err).splitlines()[0]}); the GGUF file is corrupt") from None
    return Tokenizer(backend, metadata.get("tokenizer.chat_template"),
                     bos_token=_token_at(tokens, metadata.get("tokenizer.ggml.bos_token_id")),
                     eos_token=_token_at(tokens, metadata.get("tokenizer.ggml.eos_token_id")),
                     add_bos_token=_adds_bos(metadata, pre),
                     eos_token_ids=end_token_ids(metadata))


def end_token_ids(metadata: dict) -> list[int]:
    """Ids that end a generation: end of sequence, end of turn, end of message."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    ids = [metadata[key] for key in keys if metadata.get(key) is not None]
    return list(dict.fromkeys(ids))


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str) -> Backend:
    vocab = {token: index for index, token in reversed(list(enumerate(tokens)))}  # first id wins
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    backend = Backend(models.BPE(vocab, pairs, ignore_merges=pre in LLAMA3_PRES))
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    return backend


def _pre_tokenizer(pre: str):
    """llama.cpp's split for this `pre` name; GPT-2's byte-level split for "gpt-2" and for any name
    (or none) not listed above, where llama.cpp itself would refuse the file or guess."""
    if pre in LLAMA3_PRES:
        return _split_then_bytes(LLAMA3_SPLIT)
    if pre in QWEN2_PRES:
        return _split_then_bytes(QWEN2_SPLIT)
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGIT_SPLIT_PRES:
        return pre_tokenizers.Sequence([_isolate(SINGLE_DIGITS), gpt2])
    return gpt2


def _split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([_isolate(pattern),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _isolate(pattern: str):
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated")


def _add_whole_tokens(backend: Backend, tokens: list[str], token_types: list[int]) -> None:
    """Control tokens become special tokens, user-defined ones plain added tokens: both match whole."""
    typed = list(zip(tokens, token_types))
    backend.add_special_tokens([_whole(token) for token, kind in typed if kind == TokenType.CONTROL])
    backend.add_tokens([_whole(token) for token, kind in typed if kind == TokenType.USER_DEFINED])


def _whole(token: str) -> AddedToken:
    return AddedToken(token, normalized=False)


def _adds_bos(metadata: dict, pre: str) -> bool:
    """The file's flag; without one, llama.cpp adds BOS for Llama 3 style vocabularies only."""
    flag = metadata.get("tokenizer.ggml.add_bos_token")
    return bool(flag) if flag is not None else pre in LLAMA3_PRES


def _token_at(tokens: list[str], index: int | None) -> str | None:
    if index is None or not 0 <= index < len(tokens):
        return None
    return tokens[index]
