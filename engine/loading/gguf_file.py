"""GGUF files (llama.cpp's one-file checkpoints) read into the engine's Hugging Face shapes.

    magic "GGUF" | version u32 | tensor count u64 | metadata count u64
    metadata:  key, value type u32, value          (strings are a u64 length + UTF-8 bytes)
    tensors:   name, n_dims u32, dims u64 x n_dims (fastest-moving first), ggml type u32, offset u64
    padding to general.alignment, then the data; each tensor starts at data start + its offset

The header is parsed here (metadata and tensor table only, through a memory map, so it is cheap),
and so is the config it describes; block formats are decoded by the `gguf` package's own
`gguf.quants.dequantize`. The weights stream under their Hugging Face names from gguf_weights.py.
"""
from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType
from gguf.quants import dequantize

from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.loading.config import MODEL_TYPES
from engine.loading.gguf_tokenizer import end_token_ids, tokenizer_from_metadata
from engine.loading.tokenizer import Tokenizer

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4
SCALAR_FORMATS = {GGUFValueType[name]: fmt for name, fmt in [
    ("UINT8", "B"), ("INT8", "b"), ("UINT16", "H"), ("INT16", "h"), ("UINT32", "I"), ("INT32", "i"),
    ("FLOAT32", "f"), ("BOOL", "?"), ("UINT64", "Q"), ("INT64", "q"), ("FLOAT64", "d")]}

# general.architecture -> the Hugging Face model_type it is (llama.cpp names Qwen3.5's text model "qwen35")
GGUF_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                    "qwen35": "qwen3_5_text"}
HYBRID_ARCHITECTURES = ("qwen35",)

ROPE_FACTORS = "rope_freqs.weight"
LLAMA3_DEFAULTS = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}


@dataclass(slots=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]          # torch order: rows first
    qtype: GGMLQuantizationType
    start: int                      # byte offset in the file
    nbytes: int


@dataclass(slots=True)
class GGUFHeader:
    path: Path
    metadata: dict
    tensors: dict[str, TensorEntry]
    blob: mmap.mmap

    @property
    def family(self) -> str:
        """general.architecture, once known to be one the engine runs. llama.cpp writes Mistral
        models as "llama" (the same network), so those load as Llama, as transformers loads them."""
        arch = self.metadata.get("general.architecture")
        if arch is None:
            raise ModelLoadError(f"{self.path}: metadata has no general.architecture; the GGUF file is incomplete")
        if arch not in GGUF_MODEL_TYPES:
            raise UnsupportedArchitectureError(
                f"{self.path}: architecture {arch!r} is not supported; supported: {', '.join(GGUF_MODEL_TYPES)}")
        return arch

    def arch_value(self, key: str, default=...):
        """`{general.architecture}.{key}`; a missing key without a default means the file is incomplete."""
        full_key = f"{self.metadata['general.architecture']}.{key}"
        if full_key in self.metadata:
            return self.metadata[full_key]
        if default is ...:
            raise ModelLoadError(f"{self.path}: metadata has no {full_key}; the GGUF file is incomplete")
        return default

    def arch_count(self, key: str, default=...) -> int:
        """A size or count from the metadata: a positive whole number, or the file is corrupt."""
        value = self.arch_value(key, default)
        if type(value) is not int or value <= 0:
            raise ModelLoadError(f"{self.path}: metadata {key} is {value!r}, not a positive whole number; "
                                 "the GGUF file is corrupt")
        return value

    def read(self, entry: TensorEntry) -> np.ndarray:
        """One tensor as float32 in its torch shape, owning its memory (not a view of the file)."""
        raw = self.raw_blocks(entry)
        try:
            values = dequantize(raw, entry.qtype)
        except NotImplementedError:
            raise ModelLoadError(f"{self.path}: tensor {entry.name} is stored as {entry.qtype.name}, which "
                                 "cannot be dequantized; use a file quantized to another type") from None
        if entry.qtype == GGMLQuantizationType.F32:
            values = values.copy()  # dequantize returns F32 as a view of the file
        return values.reshape(entry.shape)

    def release(self, entry: TensorEntry) -> None:
        """Drops the file's pages of a tensor already copied out from this process's resident memory
        (they stay in the page cache), so a load does not hold the file and its copy at once."""
        start = entry.start // mmap.PAGESIZE * mmap.PAGESIZE
        self.blob.madvise(mmap.MADV_DONTNEED, start, entry.start + entry.nbytes - start)

    def raw_blocks(self, entry: TensorEntry) -> np.ndarray:
        """A tensor's bytes as stored, one row of blocks per row of the weight (a view of the file)."""
        block, block_bytes = GGML_QUANT_SIZES[entry.qtype]
        rows = (*entry.shape[:-1], entry.shape[-1] // block * block_bytes)
        return np.frombuffer(self.blob, np.uint8, entry.nbytes, entry.start).reshape(rows)


def read_gguf_config(path: str | Path) -> dict:
    """A Hugging Face config.json-style dict from the file's metadata, for `ModelConfig.from_dict`."""
    header = read_gguf_header(path)
    model_type = GGUF_MODEL_TYPES[header.family]
    hidden, heads = header.arch_count("embedding_length"), header.arch_count("attention.head_count")
    tensors = header.tensors
    config = {
        "architectures": [MODEL_TYPES[model_type]],
        "model_type": model_type,
        "vocab_size": _vocab_size(header),
        "hidden_size": hidden,
        "intermediate_size": header.arch_count("feed_forward_length"),
        "num_hidden_layers": text_block_count(header),
        "num_attention_heads": heads,
        "num_key_value_heads": header.arch_count("attention.head_count_kv", heads),
        "head_dim": header.arch_count("attention.key_length", hidden // heads),
        "rms_norm_eps": header.arch_value("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": header.arch_value("rope.freq_base", 10000.0),
        "max_position_embeddings": header.arch_value("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "bos_token_id": header.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": _one_or_list(end_token_ids(header.metadata)),
    }
    if header.family in HYBRID_ARCHITECTURES:
        return config | _linear_attention_fields(header, config["head_dim"])
    rope_scaling = _rope_scaling(header, config)
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    return config


def _linear_attention_fields(header: GGUFHeader, head_dim: int) -> dict:
    """Qwen3.5's Gated DeltaNet sizes under the ssm.* names convert_hf_to_gguf writes them with (state_size: the
    key head dim, group_count: key heads, time_step_rank: value heads, inner_size: value heads x value head dim),
    its layer pattern, and the rotated part of each head. Its rotary is llama.cpp's multi-section kind, which on
    text (every section at the token's position) is the plain one over rope.dimension_count dims."""
    value_heads = header.arch_count("ssm.time_step_rank")
    inner = header.arch_count("ssm.inner_size")
    if inner % value_heads:
        raise ModelLoadError(f"{header.path}: metadata ssm.inner_size {inner} is not a multiple of "
                             f"ssm.time_step_rank {value_heads}; the GGUF file is corrupt")
    return {
        "full_attention_interval": header.arch_count("full_attention_interval", 4),
        "partial_rotary_factor": header.arch_count("rope.dimension_count", head_dim) / head_dim,
        "linear_conv_kernel_dim": header.arch_count("ssm.conv_kernel"),
        "linear_key_head_dim": header.arch_count("ssm.state_size"),
        "linear_num_key_heads": header.arch_count("ssm.group_count"),
        "linear_num_value_heads": value_heads,
        "linear_value_head_dim": inner // value_heads,
    }


def text_block_count(header: GGUFHeader) -> int:
    """block_count less the multi-token-prediction layers convert_hf_to_gguf appends to a Qwen3.5 file after the
    model's own (nextn_predict_layers), which the engine does not run."""
    layers = header.arch_count("block_count") - header.arch_value("nextn_predict_layers", 0)
    if layers <= 0:
        raise ModelLoadError(f"{header.path}: metadata nextn_predict_layers leaves no layer of block_count; "
                             "the GGUF file is corrupt")
    return layers


def gguf_file_type(path: str | Path) -> str | None:
    """What the file says it is, as llama.cpp names it ("Q4_K_M", "Q8_0", "F16"); None if it does not say."""
    value = read_gguf_header(path).metadata.get("general.file_type")
    try:
        name = LlamaFileType(value).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def model_header(path: str | Path) -> GGUFHeader:
    """The header of a file whose architecture this engine runs: reading `family` refuses the others."""
    header = read_gguf_header(path)
    header.family
    return header


def read_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer the file describes, with its chat template."""
    header = read_gguf_header(path)
    return tokenizer_from_metadata(header.metadata, str(header.path))


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Metadata and tensor table; every problem with the file becomes a one-line ModelLoadError."""
    path = Path(path)
    blob = _map_file(path)
    if blob[:4] != MAGIC:
        raise ModelLoadError(f"{path}: not a GGUF file (it does not start with 'GGUF'); pass a llama.cpp .gguf file")
    try:
        metadata, tensors = _parse(blob)
    except (struct.error, ValueError, KeyError, TypeError, OverflowError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelLoadError(f"{path}: truncated or corrupt GGUF file ({reason}); "
                             "download or convert it again") from None
    return GGUFHeader(path, metadata, tensors, blob)


def _map_file(path: Path) -> mmap.mmap:
    try:
        with path.open("rb") as file:
            return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file; pass the path of a .gguf model file") from None
    except IsADirectoryError:
        raise ModelLoadError(f"{path}: is a folder; pass the path of a .gguf model file inside it") from None
    except ValueError:  # mmap refuses empty files
        raise ModelLoadError(f"{path}: empty file, not a GGUF model; download or convert it again") from None
    except OSError as err:
        raise ModelLoadError(f"{path}: cannot be read ({err.strerror}); check its permissions") from None


def _parse(blob: mmap.mmap) -> tuple[dict, dict[str, TensorEntry]]:
    cursor = _Cursor(blob, 4)
    version = cursor.scalar("I")
    if version not in VERSIONS:
        raise ValueError(f"GGUF version {version}; this reader handles versions 2 and 3")
    tensor_count, metadata_count = cursor.scalar("Q"), cursor.scalar("Q")
    cursor.check_count(metadata_count)
    metadata = {}
    for _ in range(metadata_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("I"))
    table = [_table_entry(cursor) for _ in range(cursor.check_count(tensor_count))]
    alignment = metadata.get("general.alignment", 32)
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment {alignment} is not a power of two")
    data_start = -(-cursor.pos // alignment) * alignment
    return metadata, {name: _tensor_entry(name, shape, qtype, data_start + offset, len(blob))
                      for name, shape, qtype, offset in table}


def _table_entry(cursor: "_Cursor") -> tuple:
    name = cursor.string()
    n_dims = cursor.scalar("I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise ValueError(f"tensor {name} has {n_dims} dimensions")
    dims = cursor.scalars("Q", n_dims)
    qtype, offset = cursor.scalar("I"), cursor.scalar("Q")
    return name, tuple(reversed(dims)), GGMLQuantizationType(qtype), offset


def _tensor_entry(name, shape, qtype, start, file_size) -> TensorEntry:
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if 0 in shape:
        raise ValueError(f"tensor {name} has an empty dimension {shape}")
    if shape[-1] % block:
        raise ValueError(f"tensor {name} rows of {shape[-1]} do not fill whole {qtype.name} blocks")
    nbytes = math.prod(shape) // block * block_bytes
    if start + nbytes > file_size:
        raise ValueError(f"tensor {name} ends at byte {start + nbytes} but the file has {file_size}")
    return TensorEntry(name, shape, qtype, start, nbytes)


class _Cursor:
    """Reads little-endian GGUF values from `blob`, advancing `pos`; short reads raise struct.error."""

    def __init__(self, blob: mmap.mmap, pos: int):
        self.blob, self.pos = blob, pos

    def scalar(self, fmt: str):
        return self.scalars(fmt, 1)[0]

    def scalars(self, fmt: str, count: int) -> tuple:
        values = struct.unpack_from(f"<{count}{fmt}", self.blob, self.pos)
        self.pos += count * struct.calcsize(fmt)
        return values

    def string(self) -> str:
        length = self.check_count(self.scalar("Q"))
        self.pos += length
        return self.blob[self.pos - length:self.pos].decode("utf-8", errors="replace")

    def check_count(self, count: int) -> int:
        """Guards against a corrupt length: no count can exceed the bytes left."""
        if count > len(self.blob) - self.pos:
            raise ValueError(f"a length of {count} at byte {self.pos} runs past the end of the file")
        return count

    def value(self, kind: int):
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            return self.array(GGUFValueType(self.scalar("I")), self.check_count(self.scalar("Q")))
        value = self.scalar(SCALAR_FORMATS[kind])
        return _shortest_float32(value) if kind == GGUFValueType.FLOAT32 else value

    def array(self, kind: GGUFValueType, count: int) -> list:
        if kind in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            return [self.value(kind) for _ in range(count)]
        return list(self.scalars(SCALAR_FORMATS[kind], count))


def _shortest_float32(value: float) -> float:
    """9.999999747378752e-06 read from a float32 is 1e-05 in the original config: keep that."""
    return float(str(np.float32(value)))


def _vocab_size(header: GGUFHeader) -> int:
    """The stated size, else the token list's length, else the embedding's rows."""
    embedding = header.tensors.get("token_embd.weight")
    size = (header.arch_value("vocab_size", None) or len(header.metadata.get("tokenizer.ggml.tokens") or [])
            or (embedding and embedding.shape[0]))
    if not size:
        raise ModelLoadError(f"{header.path}: no vocab_size, token list or token_embd.weight; "
                             "the GGUF file is incomplete")
    return size


def _one_or_list(ids: list[int]) -> int | list[int] | None:
    if not ids:
        return None
    return ids[0] if len(ids) == 1 else ids


def _rope_scaling(header: GGUFHeader, config: dict) -> dict | None:
    """From rope.scaling.* metadata if present, else from a Llama 3 rope_freqs tensor."""
    kind = header.arch_value("rope.scaling.type", "none")
    if kind != "none":
        scaling = {"rope_type": kind, "factor": header.arch_value("rope.scaling.factor", 1.0)}
        original = header.arch_value("rope.scaling.original_context_length", None)
        if original is not None:
            scaling["original_max_position_embeddings"] = original
        if kind == "llama3":
            scaling = LLAMA3_DEFAULTS | scaling
        return scaling
    if ROPE_FACTORS not in header.tensors:
        return None
    factors = header.read(header.tensors[ROPE_FACTORS])
    return _llama3_scaling(factors, config["rope_theta"], config["head_dim"], header.path)


def _llama3_scaling(factors: np.ndarray, theta: float, head_dim: int, path: Path) -> dict:
    """convert_hf_to_gguf stores Llama 3 rope scaling only as per-frequency factors. Every Llama 3.x
    checkpoint uses the defaults above with its own `factor`; accept the file only if they reproduce it."""
    scaling = LLAMA3_DEFAULTS | {"factor": float(factors.max())}
    if not np.allclose(_llama3_rope_factors(scaling, theta, head_dim), factors, rtol=1e-4):
        raise UnsupportedArchitectureError(
            f"{path}: {ROPE_FACTORS} is not Llama 3 rope scaling with low_freq_factor 1, high_freq_factor 4 "
            "and original context 8192; only those rope factors are supported")
    return scaling


def _llama3_rope_factors(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """What each rotary frequency is divided by under Llama 3 rope scaling (one per pair of dims)."""
    original, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelength = 2 * np.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    smooth = (original / wavelength - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelength < original / high, 1.0, np.where(wavelength > original / low, factor, blended))
