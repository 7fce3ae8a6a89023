"""What this machine's CPU can do, measured in a few seconds: for the bench's floor (swarm/bench/floor.py), and
for `dtype: auto`, which takes bfloat16 products for prompts where they measure faster (engine/prompt_matmul.py).

    matmul_flop_s     per dtype: 2·m·k·n over the seconds of the fastest `a @ b` through torch (oneDNN) at
                      prefill shapes, [2048 x 576] @ [576 x 1536] (a SmolLM2 MLP projection over a 2,048-token
                      trunk) and a square 2048. float32 and bfloat16 always; float16 only where oneDNN runs it
                      natively (`cpu_has_native`, as the engine decides). Each dtype first times a small
                      [128 x 576] @ [576 x 1536]; a larger shape runs only where that rate says two runs of it fit
                      what is left of the dtype's budget (emulated bfloat16 runs about 1 GFLOP/s, where one square
                      2048 takes 17 s), so a rate may come from a smaller shape: `shape` says which.
                      bfloat16_kernel: swarm's own bfloat16 kernel (kernels/cpu/bf16_matmul.py), its inputs' rounding
                      and layout included, where it was built for AVX512-BF16 (its plain build is never timed).
                      int8_kernel: swarm's integer products (kernels/cpu/code_prompt.py) from a Q4_1 weight's code
                      panels, x's quantizing included, where it was built for AVX512-VNNI.
    float32_sums      of the bfloat16 rate: whether float32 matmuls in oneDNN's bf16 mode, as prompt rows take them
                      (engine/prompt_matmul.py), sum the bfloat16 products in float32. Measured, not assumed: on a
                      Zen 4 with AVX512-BF16 and no AMX, oneDNN's mode was off by 2^-9 of the outputs' size, as if
                      its partial sums were rounded to bfloat16, where AMX's agreed with float64 sums.
    read_bytes_per_s  bytes over the seconds of the fastest `sum()` of a 256 MiB float32 tensor: every byte read
                      once and nothing written, as a decode step reads its weights and KV.
    attention_flop_s  per precision of its products (float32; bfloat16 where the C kernel's build multiplies
                      them on AVX512-BF16; int8 where it multiplies integers on AVX512-VNNI): swarm's prompt
                      attention (kernels/cpu/csrc/rows_attention.c), a causal
                      1,024-token prompt of SmolLM2's heads, for `dtype: auto`'s choice of the prompts' attention.
    decode_flop_s     per precision of its products (the same two), per row count (1 and 8): swarm's decode matmul
                      (kernels/cpu/csrc/quant_matmul.c) of DECODE_SHAPE in Q4_1, for `dtype: auto`'s choice of the
                      decode rows' products.
    panels_speedup    per row count (1 and 8), where both bfloat16 kernels are native: the decode matmul's time in
                      bfloat16 products from a PANELS_SHAPE Q4_1 weight's blocks over its time from the same
                      weight's bfloat16 panels (engine/packed_weights.py), both from memory, timed side by side:
                      above 1, panels are faster here.
    int8_speedup      the same in integer products from the code panels (kernels/cpu/code_prompt.py), where
                      they are native, for `dtype: auto`'s choice of the decode rows' products.
    codes_speedup     the same, the decode matmul's time from the weight's blocks over its time from its code
                      panels (engine/code_panels.py), timed side by side with the other two.

The last four time swarm's kernels (engine/kernel_probes.py, which holds their shapes). Every probe is the best of
a few repeats after one untimed run, stopping early once its time budget is spent (engine/probe_timing.py); the
attention's and the decode matmul's precisions, which `dtype: auto` compares with each other, are timed side by
side, a round of each in turn (fastest_each).
Threads: torch's, as the engine set them (engine/cpu_threads.py: the usable cores unless OMP_NUM_THREADS says).

Cached in $SWARM_CACHE_DIR (default ~/.cache/swarm)/machine-probe.json, one entry per `machine_key`: the CPU's
model and the flags that matter (one VM's "AMD EPYC" showed AVX-512 one day and AVX2 alone the next), cores,
threads and torch's version. The key names what the numbers depend on and nothing about a run, so
the engine and the bench read the same entry.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from engine.kernel_probes import (
    attention_precisions,
    attention_rates,
    decode_precisions,
    decode_rates,
    layout_speedups,
    panels_probed,
    random_q4_1,
)
from engine.probe_timing import fastest_s

CALIBRATION_SHAPE = (128, 576, 1536)
PREFILL_SHAPES = ((2048, 576, 1536), (2048, 2048, 2048))
MATMUL_DTYPES = ("float32", "bfloat16", "float16")
KERNEL = "bfloat16_kernel"   # swarm's bfloat16 kernel, timed beside the dtypes
INT8_KERNEL = "int8_kernel"  # swarm's integer products from code panels (kernels/cpu/code_prompt.py)
READ_BYTES = 256 << 20
BUDGET_S = {"matmul": 1.5, "read": 1.0, "attention": 0.5, "decode": 0.2,   # per dtype, the read probe, per attention
            "panels": 0.2}                                                # precision, per decode (precision, rows),
                                                                          # per (blocks or panels, rows)
FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_tile")
CACHE_FILE = "machine-probe.json"
SUMS_SHAPE = (64, 2048, 64)
SUMS_TOLERANCE = 1e-5    # of the largest output: float32 sums of 2,048 products stay far inside it, bfloat16 ones not


@dataclass(frozen=True, slots=True)
class MatmulRate:
    flop_s: float
    shape: tuple[int, int, int]    # (m, k, n) of the fastest shape that ran
    native: bool                   # False: the dtype runs emulated on this CPU
    float32_sums: bool = True      # bfloat16: oneDNN's bf16 mode sums its products in float32 (module docstring)


@dataclass(slots=True)
class MachineProbe:
    cpu: str                       # the CPU's model name
    cores: int
    flags: list[str]               # those of FLAGS_THAT_MATTER the CPU has
    threads: int
    torch_version: str
    matmul_flop_s: dict[str, MatmulRate]
    read_bytes_per_s: float
    probe_s: float                 # seconds the probes took
    attention_flop_s: dict[str, float] = field(default_factory=dict)   # per precision of its products
    decode_flop_s: dict[str, dict[str, float]] = field(default_factory=dict)   # per precision, per rows ("1", "8")
    panels_speedup: dict[str, float] = field(default_factory=dict)             # per rows: blocks' time / panels'
    codes_speedup: dict[str, float] = field(default_factory=dict)              # per rows: blocks' / code panels'
    int8_speedup: dict[str, float] = field(default_factory=dict)   # per rows: blocks' / code panels' in int8
    from_cache: bool = field(default=False, compare=False)

    @property
    def key(self) -> str:
        return machine_key(self.cpu, self.flags, self.cores, self.threads, self.torch_version)

    def fastest_dtype(self) -> str:
        return max(self.matmul_flop_s, key=lambda dtype: self.matmul_flop_s[dtype].flop_s)

    def to_json(self) -> dict:
        data = asdict(self)
        data["matmul_flop_s"] = {dtype: {**asdict(rate), "shape": list(rate.shape)}
                                 for dtype, rate in self.matmul_flop_s.items()}
        return {"key": self.key, **data}

    @classmethod
    def from_json(cls, data: dict) -> MachineProbe:
        rates = {dtype: MatmulRate(rate["flop_s"], tuple(rate["shape"]), rate["native"], rate["float32_sums"])
                 for dtype, rate in data["matmul_flop_s"].items()}
        return cls(data["cpu"], data["cores"], list(data["flags"]), data["threads"], data["torch_version"],
                   rates, data["read_bytes_per_s"], data["probe_s"], dict(data.get("attention_flop_s", {})),
                   {precision: dict(rows) for precision, rows in data.get("decode_flop_s", {}).items()},
                   dict(data.get("panels_speedup", {})), dict(data.get("codes_speedup", {})),
                   dict(data.get("int8_speedup", {})), from_cache=True)


def cpu_has_native(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies `dtype` on this CPU's own units (AVX512-BF16, AMX) rather than emulating it."""
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return True


def machine_key(cpu: str, flags: list[str], cores: int, threads: int, torch_version: str) -> str:
    return f"{cpu} | {' '.join(flags) or 'no avx2'} | {cores} cores | {threads} threads | torch {torch_version}"


def this_machine_key() -> str:
    return machine_key(cpu_model_name(), cpu_flags(), os.cpu_count() or 1, torch.get_num_threads(), torch.__version__)


def cached_probe(reprobe: bool = False, budget_s: dict[str, float] = BUDGET_S) -> MachineProbe:
    """This machine's entry in the cache, or a fresh probe (stored there) where it has none or `reprobe`."""
    path = cache_path()
    entries = _read_cache(path)
    key = this_machine_key()
    if not reprobe and key in entries:
        try:
            cached = MachineProbe.from_json(entries[key])
        except (KeyError, TypeError, ValueError):
            cached = None   # an entry from another version of this file: probe again
        if (cached is not None and set(cached.matmul_flop_s) >= set(probed_paths())
                and set(cached.attention_flop_s) >= set(attention_precisions())
                and set(cached.decode_flop_s) >= set(decode_precisions())
                and ((cached.panels_speedup and cached.codes_speedup) or not panels_probed())
                and (cached.int8_speedup or not int8_probed())):
            return cached
    probe = probe_machine(budget_s)
    entries[probe.key] = probe.to_json()
    _write_cache(path, entries)
    return probe


def int8_probed() -> bool:
    """Whether a probe times the decode matmul in integer products: beside the panels, where they are native."""
    from kernels.cpu import code_prompt
    return panels_probed() and code_prompt.native()


def probed_paths() -> list[str]:
    """The matmul paths a probe of this machine times: the dtypes, and swarm's kernel where it is native."""
    dtypes = [dtype for dtype in MATMUL_DTYPES if dtype != "float16" or cpu_has_native(torch.float16)]
    from kernels.cpu import bf16_matmul, code_prompt  # builds the kernels, once per machine
    return dtypes + ([KERNEL] if bf16_matmul.native() else []) + ([INT8_KERNEL] if code_prompt.native() else [])


def probe_machine(budget_s: dict[str, float] = BUDGET_S) -> MachineProbe:
    began = time.perf_counter()
    kernels = {KERNEL: kernel_rate, INT8_KERNEL: int8_kernel_rate}
    rates = {path: kernels[path](budget_s["matmul"]) if path in kernels else matmul_rate(getattr(torch, path),
                                                                                         budget_s["matmul"])
             for path in probed_paths()}
    read = read_bytes_per_s(budget_s["read"])
    attention = attention_rates(attention_precisions(), budget_s.get("attention", BUDGET_S["attention"]))
    decode = decode_rates(decode_precisions(), budget_s.get("decode", BUDGET_S["decode"]))
    layouts = layout_speedups(budget_s.get("panels", BUDGET_S["panels"])) if panels_probed() else {}
    return MachineProbe(cpu_model_name(), os.cpu_count() or 1, cpu_flags(), torch.get_num_threads(),
                        torch.__version__, rates, read, time.perf_counter() - began, attention, decode,
                        layouts.get("panels", {}), layouts.get("codes", {}), layouts.get("int8", {}))


def matmul_rate(dtype: torch.dtype, budget_s: float) -> MatmulRate:
    """`a @ b` in `dtype`: the best FLOP/s of the shapes that fit the budget, the small calibration shape always."""
    sums = dtype != torch.bfloat16 or bf16_mode_sums_in_float32()
    return _best_rate(lambda shape, left: _matmul_flop_s(shape, dtype, left), budget_s, cpu_has_native(dtype), sums)


def kernel_rate(budget_s: float) -> MatmulRate:
    """swarm's bfloat16 kernel, as matmul_rate times a dtype; it sums in float32 by construction."""
    from kernels.cpu import bf16_matmul

    def flop_s(shape: tuple[int, int, int], left: float) -> float:
        m, k, n = shape
        x, w = torch.randn(m, k), torch.randn(n, k)
        return _flops(shape) / fastest_s(lambda: bf16_matmul.linear(x, w), left)

    return _best_rate(flop_s, budget_s, native=True, float32_sums=True)


def int8_kernel_rate(budget_s: float) -> MatmulRate:
    """swarm's integer products (kernels/cpu/code_prompt.py) against a Q4_1 weight's code panels, packed
    beforehand as an engine packs them at load; as matmul_rate times a dtype. It sums in float32."""
    from kernels.cpu import code_matmul, code_prompt

    def flop_s(shape: tuple[int, int, int], left: float) -> float:
        m, k, n = shape
        x, panels = torch.randn(m, k), code_matmul.pack(random_q4_1(n, k))
        return _flops(shape) / fastest_s(lambda: code_prompt.linear(x, panels, "Q4_1", n), left)

    return _best_rate(flop_s, budget_s, native=True, float32_sums=True)


def _best_rate(flop_s: Callable[[tuple[int, int, int], float], float], budget_s: float, native: bool,
               float32_sums: bool) -> MatmulRate:
    """flop_s(shape, seconds left): the best of the shapes that fit the budget, the calibration shape always."""
    began = time.perf_counter()
    best = MatmulRate(flop_s(CALIBRATION_SHAPE, budget_s), CALIBRATION_SHAPE, native, float32_sums)
    for shape in PREFILL_SHAPES:
        left = budget_s - (time.perf_counter() - began)
        if 2 * _flops(shape) / best.flop_s > left:
            continue
        rate = flop_s(shape, left)
        if rate > best.flop_s:
            best = MatmulRate(rate, shape, native, float32_sums)
    return best


def bf16_mode_sums_in_float32() -> bool:
    """Whether a float32 matmul in oneDNN's bf16 mode equals float64 sums of its bfloat16-rounded inputs' products,
    to SUMS_TOLERANCE; False where torch has no such mode."""
    settings = getattr(torch.backends.mkldnn, "matmul", None)
    if settings is None or not hasattr(settings, "fp32_precision"):
        return False
    m, k, n = SUMS_SHAPE
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    before = settings.fp32_precision
    settings.fp32_precision = "bf16"
    try:
        got = (a @ b).double()
    finally:
        settings.fp32_precision = before
    exact = a.bfloat16().double() @ b.bfloat16().double()
    return bool((got - exact).abs().max() <= SUMS_TOLERANCE * exact.abs().max())


def read_bytes_per_s(budget_s: float) -> float:
    data = torch.ones(READ_BYTES // 4, dtype=torch.float32)
    return READ_BYTES / fastest_s(data.sum, budget_s)


def _matmul_flop_s(shape: tuple[int, int, int], dtype: torch.dtype, budget_s: float) -> float:
    m, k, n = shape
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    return _flops(shape) / fastest_s(lambda: a @ b, budget_s)


def _flops(shape: tuple[int, int, int]) -> int:
    m, k, n = shape
    return 2 * m * k * n


def cpu_model_name() -> str:
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    present = set(_cpuinfo_field("flags").split())
    return [flag for flag in FLAGS_THAT_MATTER if flag in present]


def _cpuinfo_field(name: str) -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.split(":", 1)[0].strip() == name:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cache_path() -> Path:
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("SWARM_CACHE_DIR") or user_cache / "swarm") / CACHE_FILE


def _read_cache(path: Path) -> dict[str, dict]:
    """The cached entries by key; none where the file is missing or unreadable (it is written again)."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict[str, dict]) -> None:
    """Best effort: a cache that cannot be written costs the next run a few seconds, nothing more."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries, indent=2) + "\n")
        temporary.replace(path)
    except OSError:
        pass
