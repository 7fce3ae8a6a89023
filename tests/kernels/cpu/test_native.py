"""kernels/cpu/native.py links the C kernels against the OpenMP runtime torch runs on, so that a process
holds one pool of OpenMP threads, and the decode kernels against one build of task_pool.c, so that it holds one
pool of theirs: checked in real subprocesses by the files mapped into them."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.cpu import native

ROOT = Path(__file__).parents[3]
KERNELS = sorted(source.stem for source in native.SOURCE_DIR.glob("*.c"))
OPENMP_KERNELS = [name for name in KERNELS if "#pragma omp" in (native.SOURCE_DIR / f"{name}.c").read_text()]
POOL_KERNELS = [name for name in KERNELS if str(native.library_path(native.POOL)) in native.linked_libraries(name)]
HANG_GUARD_S = 300   # seconds; reaching it means a hang, never a slow machine
MAPPED_RUNTIMES = """
import json, os, re
def mapped(pattern):
    paths = {line.split(maxsplit=5)[5].strip() for line in open("/proc/self/maps") if len(line.split(maxsplit=5)) == 6}
    return sorted({os.path.realpath(p) for p in paths if re.match(pattern, os.path.basename(p))})
def mapped_openmp_runtimes():
    return mapped(r"lib(gomp|iomp5|omp)\\b")
"""

pytestmark = [pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps (Linux)"),
              pytest.mark.skipif(native.openmp_runtime() is None, reason="this torch has no OpenMP runtime")]


def mapped_runtimes_after(code: str, listed: str = "mapped_openmp_runtimes()") -> list[str]:
    """the files `listed` names (a call of the helpers above) once `code` has run in a fresh process"""
    script = MAPPED_RUNTIMES + code + f"\nprint(json.dumps({listed}))"
    done = subprocess.run([sys.executable, "-c", script],
                          cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def built(name: str) -> str:
    library = native.load(name)
    if library is None:
        pytest.skip("no C compiler for the kernels")
    return library._name


def test_openmp_runtime_is_the_one_torch_calls():
    runtime = native.openmp_runtime()
    assert re.match(r"lib(gomp|iomp5|omp)\b", runtime.name), runtime
    assert str(runtime) in mapped_runtimes_after("import torch")


@pytest.mark.parametrize("name", OPENMP_KERNELS)
def test_a_kernel_loaded_on_its_own_finds_torchs_runtime(name):
    """Without torch in the process, the dynamic linker finds the runtime from the kernel alone:
    the file it was linked against, not the compiler's libgomp.so.1."""
    path = built(name)
    assert mapped_runtimes_after(f"import ctypes; ctypes.CDLL({path!r})") == [str(native.openmp_runtime())]


def test_torch_and_every_kernel_share_one_openmp_runtime():
    for name in KERNELS:
        built(name)   # here, so that the subprocess finds them in the cache
    code = f"from kernels.cpu import native\nfor name in {KERNELS!r}:\n    assert native.load(name) is not None, name"
    assert mapped_runtimes_after(code) == [str(native.openmp_runtime())]


def test_the_decode_kernels_are_on_the_task_pool():
    assert {"quant_matmul", "paged_decode", "prefix_attention"} <= set(POOL_KERNELS)
    assert native.POOL not in OPENMP_KERNELS


def test_every_decode_kernel_shares_one_task_pool():
    code = "import ctypes\n" + "".join(f"ctypes.CDLL({built(name)!r})\n" for name in POOL_KERNELS)
    assert mapped_runtimes_after(code, "mapped(r'task_pool-')") == [str(native.library_path(native.POOL))]


def test_a_kernel_that_calls_another_maps_the_one_build_of_it_python_loads():
    """decode_layer.c calls quant_matmul.c's matmul: the process holds one quant_matmul library, so one copy of
    its code and one task pool, however it was loaded first."""
    code = f"import ctypes\nctypes.CDLL({built('decode_layer')!r})\nctypes.CDLL({built('quant_matmul')!r})\n"
    assert mapped_runtimes_after(code, "mapped(r'quant_matmul-')") == [built("quant_matmul")]
