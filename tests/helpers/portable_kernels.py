"""Builds a kernel's narrower code paths for tests, beside the native build: the plain-C one (AVX2
and FMA off) and the AVX2 one (AVX-512 off, where the compiler and this CPU have AVX2). Each comes
back loaded with its functions declared (kernels.cpu.entry_points.SIGNATURES), for a wrapper's `library=`.

The builds are cached beside the native ones (kernels.cpu.native.cache_dir), keyed like them by the
source, its headers, the flags and the compiler: some kernels take many seconds to compile."""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
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
    _, libraries = native.build_flags(name)
    target = native.cache_dir() / f"{name}-{variant}-{_key(source, flags + list(libraries), compiler)}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
        os.close(fd)
        built = subprocess.run([compiler, *flags, "-fopenmp", "-shared", "-fPIC", str(source), *libraries, "-o",
                                partial], capture_output=True, text=True)
        if built.returncode != 0:
            os.unlink(partial)
            pytest.skip(f"this compiler cannot build {' '.join(flags)}: {built.stderr.strip()[:200]}")
        os.replace(partial, target)
    return native.declare(ctypes.CDLL(str(target)), entry_points.SIGNATURES[name])


def _key(source: Path, flags: list[str], compiler: str) -> str:
    headers = b"".join(header.read_bytes() for header in sorted(native.SOURCE_DIR.glob("*.h")))
    parts = [source.read_bytes(), headers, " ".join(flags).encode(), compiler.encode(),
             native._compiler_version(compiler).encode(), native._cpu_flags().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
