"""Builds a kernel's code paths for tests, beside the one the process loads: the plain-C one (AVX2 and FMA
off), the AVX2 one (AVX-512 off, where the compiler and this CPU have AVX2), the -march=native one, and that one
without AVX512-VNNI. Each comes back loaded with its functions declared (kernels.cpu.signatures.SIGNATURES), for
a wrapper's `library=`.

The builds are cached beside the native ones (kernels.cpu.native.cache_dir), keyed like them by the
source, its headers, the flags and the compiler: some kernels take many seconds to compile."""
import ctypes
import shutil
from pathlib import Path

import pytest

from kernels.cpu import build_choice, native
from kernels.cpu.signatures import SIGNATURES, declare


def portable_library(name: str, folder: Path | None = None) -> ctypes.CDLL:
    """folder: unused, kept for callers; the build is cached."""
    return _build(name, "portable", ["-O2", "-mno-avx2", "-mno-fma"])


def avx2_library(name: str, folder: Path | None = None) -> ctypes.CDLL:
    """folder: unused, kept for callers. The build kernels/cpu/build_choice.py may choose: one file for both."""
    if not {"avx2", "fma"} <= set(native._cpu_flags().split()):
        pytest.skip("this CPU has no AVX2 and FMA")
    return _cached(name, build_choice.NARROWER)


def without_vnni_library(name: str) -> ctypes.CDLL:
    """The -march=native build less AVX512-VNNI: integer products in plain C, the rest as native."""
    return _cached(name, ("-mno-avx512vnni",))


def widest_library(name: str) -> ctypes.CDLL:
    """The -march=native build, whichever build kernels/cpu/build_choice.py chose for the process."""
    return _cached(name, ())


def _cached(name: str, extra_flags: tuple[str, ...]) -> ctypes.CDLL:
    path = native.library_path(name, extra_flags)
    if path is None:
        pytest.skip("no C compiler")
    return declare(ctypes.CDLL(str(path)), SIGNATURES[name])


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
    return declare(ctypes.CDLL(str(target)), SIGNATURES[name])
