"""Builds a kernel's narrower code paths for tests, beside the native build: the plain-C one (AVX2
and FMA off) and the AVX2 one (AVX-512 off, where the compiler and this CPU have AVX2). Each comes
back loaded with its functions declared (kernels.cpu.entry_points.SIGNATURES), for a wrapper's `library=`.

The builds are cached beside the native ones (kernels.cpu.native.cache_dir), keyed like them by the
source, its headers, the flags and the compiler: some kernels take many seconds to compile."""
import ctypes
import shutil
from pathlib import Path

import pytest

from kernels.cpu import entry_points, native


def portable_library(name: str, folder: Path | None = None) -> ctypes.CDLL:
    """folder: unused, kept for callers; the build is cached."""
    return _build(name, "portable", ["-O2", "-mno-avx2", "-mno-fma"])


def avx2_library(name: str, folder: Path | None = None) -> ctypes.CDLL:
    """folder: unused, kept for callers; the build is cached."""
    if not {"avx2", "fma"} <= set(native._cpu_flags().split()):
        pytest.skip("this CPU has no AVX2 and FMA")
    return _build(name, "avx2", ["-O3", "-march=native", "-mno-avx512f", "-ffp-contract=off"])


def _build(name: str, variant: str, flags: list[str]) -> ctypes.CDLL:
    compiler = native._compiler()
    if compiler is None or shutil.which(compiler) is None:
        pytest.skip("no C compiler")
    source = native.SOURCE_DIR / f"{name}.c"
    headers = b"".join(header.read_bytes() for header in sorted(native.SOURCE_DIR.glob("*.h")))
    all_flags = (*flags, "-fopenmp", "-shared", "-fPIC")
    _, libraries = native.build_flags(name)
    key = native._build_key(source.read_bytes() + headers, all_flags + libraries, compiler)
    target = native.cache_dir() / f"{name}-{variant}-{key}.so"
    if not target.exists() and (error := native._build(compiler, source, all_flags, libraries, target)):
        pytest.skip(f"this compiler cannot build {' '.join(flags)}: {error[:200]}")
    return native.declare(ctypes.CDLL(str(target)), entry_points.SIGNATURES[name])
