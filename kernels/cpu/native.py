"""Builds the C kernels next to this file once per machine and loads them with ctypes.

The shared library is cached under $SWARM_CACHE_DIR (default ~/.cache/swarm) by a hash of
the source (with the headers beside it), the flags, the compiler and this CPU, so later runs
load it in milliseconds. Where no C compiler works, `load` returns None and the callers keep
their PyTorch path.

The kernels run their parallel loops on torch's OpenMP runtime, not on a second one of their own:
two runtimes are two pools of threads, each sized to every core and each spinning while it waits,
on the same cores. A compiler links -fopenmp code against its own libgomp.so.1, and a torch wheel
may bundle a copy under another name (libgomp-<hash>.so.1): so the kernels are linked against the
very file torch runs on (`openmp_runtime`), found by where its omp_get_max_threads lives.

The decode kernels run their tasks on csrc/task_pool.c's threads instead (engine/cpu_threads.py says why).
That pool is a library of its own, built first, and every kernel that includes task_pool.h is linked against
that one file, so the process holds one such pool however many kernels use it. A kernel that calls another's
functions (decode_layer.c calls quant_matmul.c's) includes its header and is linked against its library alike.

    CC   the compiler to use (default: cc, then gcc, then clang)
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from kernels.cpu import build_choice

FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")
POOL = "task_pool"   # csrc/task_pool.c: the decode kernels' threads, a library of its own
POOL_FLAGS = ("-O2", "-pthread", "-shared", "-fPIC")
SOURCE_DIR = Path(__file__).parent / "csrc"


def cache_dir() -> Path:
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = os.environ.get("SWARM_CACHE_DIR") or user_cache / "swarm"
    return Path(root) / "kernels"


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """kernels/<name>.c as a loaded library, built on first use; None where it cannot be built."""
    path = library_path(name)   # loaded once already there, to know it loads
    return None if path is None else ctypes.CDLL(str(path))


def library_path(name: str, extra_flags: tuple[str, ...] | None = None) -> Path | None:
    """The built library of csrc/<name>.c in the cache, built first where it is not there; None (with a
    warning) where it cannot be built. extra_flags: after FLAGS; None: the build kernels/cpu/build_choice.py
    measured faster on this CPU, for a kernel it chooses for (quant_matmul), else none."""
    if extra_flags is None:
        extra_flags = chosen_flags(name)
    headers = b"".join(header.read_bytes() for header in sorted(SOURCE_DIR.glob("*.h")))
    source = (SOURCE_DIR / f"{name}.c").read_bytes() + headers
    compiler = _compiler()
    if compiler is None:
        warnings.warn(f"no C compiler found (set CC): the {name} kernel is off, using PyTorch instead")
        return None
    flags, libraries = build_flags(name, extra_flags)
    target = cache_dir() / f"{name}-{_build_key(source, flags + libraries, compiler)}.so"
    for _ in range(2):   # a cached library that does not load (cut short by a full disk) is rebuilt once
        error = None if target.exists() else _build(compiler, SOURCE_DIR / f"{name}.c", flags, libraries, target)
        if error:
            break
        try:
            ctypes.CDLL(str(target))
            return target
        except OSError as err:
            error = str(err)
            target.unlink(missing_ok=True)
    warnings.warn(f"could not build the {name} kernel with {compiler} ({error}): using PyTorch instead")
    return None


def chosen_flags(name: str) -> tuple[str, ...]:
    """The flags, after FLAGS, of the build of csrc/<name>.c this process loads (kernels/cpu/build_choice.py)."""
    return build_choice.extra_flags(name, _cpu_flags(), lambda extra_flags: library_path(name, extra_flags))


def build_flags(name: str, extra_flags: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The compiler's arguments for csrc/<name>.c: those before the source and the libraries after it."""
    if name == POOL:
        return POOL_FLAGS, ()
    return FLAGS + extra_flags, link_flags() + linked_libraries(name)


def linked_libraries(name: str) -> tuple[str, ...]:
    """The built libraries of the other kernels csrc/<name>.c calls (those whose header it includes: task_pool.h,
    quant_matmul.h), to link against and find again at load by their paths: one task pool, one copy of each
    kernel, in the process however many kernels use it."""
    source = (SOURCE_DIR / f"{name}.c").read_text()
    paths = []
    for other in sorted(path.stem for path in SOURCE_DIR.glob("*.c")):
        if other != name and f'#include "{other}.h"' in source:
            path = library_path(other)
            if path is not None:
                paths.append(str(path))
    return tuple(paths)


@functools.cache
def openmp_runtime() -> Path | None:
    """The file of the OpenMP runtime torch runs on (torch/lib/libgomp*.so.1 in a pip wheel), or
    None where torch has none or the C library cannot say (dladdr is glibc's and macOS's)."""
    try:
        torch_c = ctypes.CDLL(torch._C.__file__)   # already loaded: this only gets a handle on it
        function = ctypes.cast(torch_c.omp_get_max_threads, ctypes.c_void_p)
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    info = _DlInfo()
    if not dladdr(function, ctypes.byref(info)) or not info.dli_fname:
        return None
    return Path(os.fsdecode(info.dli_fname)).resolve()


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def link_flags() -> tuple[str, ...]:
    """Linker arguments that put the kernels on torch's OpenMP runtime: its file, found again at
    load through the rpath, comes before the -lgomp that -fopenmp adds, which --as-needed drops."""
    runtime = openmp_runtime()
    if runtime is None or not sys.platform.startswith("linux"):
        return ()
    return ("-Wl,--as-needed", str(runtime), f"-Wl,-rpath,{runtime.parent}")


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def _build_key(source: bytes, flags: tuple[str, ...], compiler: str) -> str:
    parts = [source, " ".join(flags).encode(), compiler.encode(), _compiler_version(compiler).encode(),
             platform.machine().encode(), _cpu_flags().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


@functools.cache
def _compiler_version(compiler: str) -> str:
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line for line in lines if line.startswith(("flags", "Features"))), "")


def _build(compiler: str, source: Path, flags: tuple[str, ...], libraries: tuple[str, ...],
           target: Path) -> str | None:
    """Compiles to a temporary file and renames it into place, so a half-written library is never loaded."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
        os.close(fd)
    except OSError as err:
        return f"cannot write to {target.parent}: {err.strerror or err}; set SWARM_CACHE_DIR"
    try:
        done = subprocess.run([compiler, *flags, str(source), *libraries, "-o", partial], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            return lines[0] if lines else f"exit code {done.returncode}"
        os.replace(partial, target)
        return None
    except (OSError, subprocess.SubprocessError) as err:
        return str(err)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
