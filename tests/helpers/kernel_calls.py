"""Counting a CPU kernel set's cascade prefills: the backend picks its kernel set from
engine.attention.kernel_sets when it is built, so a set swapped in there is the one it runs."""
import dataclasses

from engine.attention import kernel_sets

CPU_SETS = {"sdpa": "SDPA_KERNELS", "native": "NATIVE_KERNELS"}


def count_cascade_prefills(monkeypatch, backend: str) -> list:
    """A list that grows by one each time `backend`'s kernel set runs its cascade prefill."""
    attribute = CPU_SETS[backend]
    kernels = getattr(kernel_sets, attribute)
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return kernels.cascade_prefill(*args, **kwargs)

    monkeypatch.setattr(kernel_sets, attribute, dataclasses.replace(kernels, cascade_prefill=counted))
    return calls
