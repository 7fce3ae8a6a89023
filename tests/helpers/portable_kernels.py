"""Builds a kernel's narrower code paths for tests, beside the native build: the plain-C one (AVX2
and FMA off) and the AVX2 one (AVX-512 off, where the compiler and this CPU have AVX2). Each comes
back loaded with its functions declared (kernels.cpu.entry_points.SIGNATURES), for a wrapper's `library=`."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from kernels.cpu import entry_points, native


def portable_library(name: str, folder: Path) -> ctypes.CDLL:
    return _build(name, folder / f"{name}-portable.so", ["-O2", "-mno-avx2", "-mno-fma"])


def avx2_library(name: str, folder: Path) -> ctypes.CDLL:
    if not {"avx2", "fma"} <= set(native._cpu_flags().split()):
        pytest.skip("this CPU has no AVX2 and FMA")
    return _build(name, folder / f"{name}-avx2.so", ["-O3", "-march=native", "-mno-avx512f", "-ffp-contract=off"])


def _build(name: str, target: Path, flags: list[str]) -> ctypes.CDLL:
    compiler = native._compiler()
    if compiler is None or shutil.which(compiler) is None:
        pytest.skip("no C compiler")
    built = subprocess.run([compiler, *flags, "-fopenmp", "-shared", "-fPIC", str(native.SOURCE_DIR / f"{name}.c"),
                            *native.link_flags(), "-o", str(target)], capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"this compiler cannot build {' '.join(flags)}: {built.stderr.strip()[:200]}")
    return native.declare(ctypes.CDLL(str(target)), entry_points.SIGNATURES[name])
