"""The `device` part: what the check ran on."""
from __future__ import annotations

import platform
from importlib import metadata

import torch

from engine.gpu_check.context import PartContext

TRITON_PACKAGES = ("triton", "pytorch-triton-rocm", "pytorch-triton")


def run(context: PartContext) -> dict:
    details = {"torch": torch.__version__, "triton": triton_version(), "python": platform.python_version(),
               "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
               "backend": backend(), "device": context.device}
    if context.on_gpu:
        details |= gpu_details()
    else:
        details |= {"name": platform.processor() or platform.machine(), "gpu_available": torch.cuda.is_available()}
    return details


def backend() -> str:
    if getattr(torch.version, "hip", None):
        return "rocm"
    return "cuda" if torch.version.cuda else "cpu"


def triton_version() -> str | None:
    for package in TRITON_PACKAGES:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return None


def gpu_details() -> dict:
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    return {"name": props.name, "count": torch.cuda.device_count(), "total_memory_bytes": props.total_memory,
            "free_memory_bytes": free, "mem_get_info_total_bytes": total,
            "compute_capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
            "arch": getattr(props, "gcnArchName", None), "bf16_supported": torch.cuda.is_bf16_supported()}
