"""engine/kv/device_memory.py: the peak a piece of work allocates, read from torch's own allocator."""
import pytest
import torch

from engine.kv.device_memory import CudaMemory, HostAllocations, device_memory, running_peak

ELEMENTS = 250_000


def test_the_host_peak_counts_tensors_alive_together_once_each():
    def both_alive():
        a = torch.empty(ELEMENTS)
        b = torch.empty(ELEMENTS)
        return a, b

    assert HostAllocations().peak_during(both_alive) == 2 * torch.empty(ELEMENTS).nbytes


def test_the_host_peak_does_not_count_a_tensor_freed_before_the_next_is_made():
    def one_after_another():
        for _ in range(3):
            torch.empty(ELEMENTS)

    assert HostAllocations().peak_during(one_after_another) == torch.empty(ELEMENTS).nbytes


def test_the_host_peak_sees_what_an_op_allocates_beside_its_result():
    x = torch.randn(64, 64)
    result_bytes = torch.empty(64).nbytes
    # the sum of a product: the product is a temporary no one holds, yet it was allocated
    assert HostAllocations().peak_during(lambda: (x * x).sum(dim=1)) >= x.nbytes + result_bytes


def test_the_host_peak_leaves_out_what_was_allocated_before():
    held = torch.empty(4 * ELEMENTS)
    # in place: at most the few bytes of the scalar operand are new
    assert HostAllocations().peak_during(lambda: held.add_(1)) < 64


def test_the_running_peak_is_the_highest_total_from_zero():
    assert running_peak([100, 50, -120, 200, -230]) == 230
    assert running_peak([-10, 5]) == 0
    assert running_peak([]) == 0


def test_the_cpu_has_no_device_memory_to_size_by():
    assert device_memory(torch.device("cpu")) is None
    with pytest.raises(NotImplementedError):
        HostAllocations().free_bytes()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_gpu_peak_is_what_the_caching_allocator_saw():
    memory = CudaMemory(torch.device("cuda"))
    peak = memory.peak_during(lambda: torch.empty(ELEMENTS, device="cuda"))
    assert peak == torch.empty(ELEMENTS, device="cuda").nbytes   # a multiple of the allocator's 512 B rounding
    assert memory.free_bytes() > 0
