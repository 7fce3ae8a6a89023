"""The one seam through which the KV pool's sizing reads the device: how much memory is free, and the
most a piece of work allocates beyond what was allocated when it began. Tests substitute only the free
figure; the peak is always measured on a real run.

    GPU   free_bytes:  torch.cuda.mem_get_info, after the caching allocator gives back what it holds
          peak_during: torch.cuda.max_memory_allocated - memory_allocated before, peak stats reset
    CPU   peak_during: the allocator's own events (torch.profiler, profile_memory=True)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

MEMORY_EVENT = "[memory]"   # the profiler's name for an allocator event (torch.autograd.profiler)


class DeviceMemory(Protocol):
    def free_bytes(self) -> int:
        """Bytes the device can still hand out."""

    def peak_during(self, work: Callable[[], object]) -> int:
        """Runs `work`; the most bytes it held allocated at once, beyond what was allocated before it."""


def device_memory(device: torch.device) -> DeviceMemory | None:
    """What sizes the KV pool on `device`: its memory on a GPU; None on the CPU (engine.kv.sizing)."""
    return CudaMemory(device) if device.type == "cuda" else None


class CudaMemory:
    """A GPU's memory, read through torch's caching allocator ("cuda" covers ROCm's HIP too)."""

    def __init__(self, device: torch.device):
        self.device = device

    def free_bytes(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return free

    def peak_during(self, work: Callable[[], object]) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        work()
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - before


class HostAllocations:
    """The CPU allocator's peak during a piece of work, replayed from the profiler's allocator events.

    Exact in the sense max_memory_allocated is on a GPU: every allocation torch's CPU allocator makes
    is an event, the buffers an op allocates inside itself (a fused attention's workspace) as well as
    the tensors it returns, which a TorchDispatchMode watching op outputs would miss. It has no free
    figure: host memory is not what the KV pool is sized by (engine.kv.sizing)."""

    def free_bytes(self) -> int:
        raise NotImplementedError("host memory does not size the KV pool; see engine.kv.sizing")

    def peak_during(self, work: Callable[[], object]) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            work()
        events = [e for e in prof.profiler.kineto_results.events()
                  if e.name() == MEMORY_EVENT and e.device_type() == DeviceType.CPU]
        return running_peak(e.nbytes() for e in sorted(events, key=lambda e: e.start_ns()))


def running_peak(changes) -> int:
    """The highest running total of byte changes (+ allocated, - freed), from zero."""
    total = peak = 0
    for change in changes:
        total += change
        peak = max(peak, total)
    return peak
