"""Builds a kernel's plain-C path (AVX2 and FMA off) for tests, beside the native build."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from kernels import native


def portable_library(name: str, signatures: dict, folder: Path) -> ctypes.CDLL:
    compiler = native._compiler()
    if compiler is None or shutil.which(compiler) is None:
        pytest.skip("no C compiler")
    target = folder / f"{name}.so"
    flags = ["-O2", "-fopenmp", "-shared", "-fPIC", "-mno-avx2", "-mno-fma"]
    built = subprocess.run([compiler, *flags, str(native.SOURCE_DIR / f"{name}.c"), "-o", str(target)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"this compiler cannot turn AVX2 off: {built.stderr.strip()[:200]}")
    return native.declare(ctypes.CDLL(str(target)), signatures)
