"""The `bandwidth` part: how much of the card's memory bandwidth a decode step reaches.

A decode step reads every weight once (the embedding table excepted: it reads one row a token) and the
KV of every row's context; with cascade attention the shared trunk's KV once for all rows. Bytes read
over the step's time (the timings part's median), against two peaks: the card's own, measured here
as the best of several device-to-device copies of COPY_BYTES (each byte read once and written once),
and the datasheet's by device name where known.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.gpu_check.context import PartContext, PartSkipped

COPY_BYTES = {"cuda": 2 << 30, "cpu": 256 << 20}
COPY_REPEATS = 6
DATASHEET_BYTES_PER_S = {   # device-name fragment (as torch names the card) -> peak memory bandwidth
    "H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12, "A100 80GB PCIe": 1.935e12, "A100": 1.555e12, "L40S": 864e9,
    "RTX 4090": 1008e9, "MI325X": 6.0e12, "MI300X": 5.3e12, "MI250X": 3.2768e12,
    "RX 9070 XT": 644.6e9, "RX 7900 XTX": 960e9,
}


@dataclass(frozen=True, slots=True)
class DecodeTraffic:
    """What one decode step of `agents` rows reads."""

    weight_bytes: int          # every weight, less the embedding table
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


def decode_traffic(weight_bytes: int, embedding_bytes: int, kv_bytes_per_token: int, agents: int,
                   trunk: int, private_tokens: float, cascade: bool) -> DecodeTraffic:
    """private_tokens: each row's context beyond the trunk, on average over the steps timed."""
    trunk_reads = 1 if cascade and agents > 1 else agents
    kv_tokens = trunk * trunk_reads + agents * private_tokens
    return DecodeTraffic(weight_bytes - embedding_bytes, int(kv_tokens * kv_bytes_per_token))


def run(context: PartContext) -> dict:
    peak = measured_copy_bytes_per_s(context.device)
    sheet = datasheet_bytes_per_s(torch.cuda.get_device_name(0)) if context.on_gpu else None
    details = {"measured_copy_bytes_per_s": peak, "datasheet_bytes_per_s": sheet,
               "copy_bytes": COPY_BYTES[context.device]}
    cases = context.inputs.get("timings", {}).get("details", {}).get("cases", [])
    rows = [_fractions(case, measured, peak, sheet) for case in cases for measured in case.get("runs", [])
            if measured["decode_ms_per_step"]]
    if not rows:
        raise PartSkipped("no decode timings to divide (the timings part did not run or measured nothing)", details)
    details["decode"] = rows
    return details


def _fractions(case: dict, measured: dict, peak: float, sheet: float | None) -> dict:
    achieved = measured["decode_bytes_per_step"] / (measured["decode_ms_per_step"] / 1e3)
    return {"weights": case["weights"], "graphs": case["graphs"], "agents": measured["agents"],
            "bytes_per_step": measured["decode_bytes_per_step"], "ms_per_step": measured["decode_ms_per_step"],
            "achieved_bytes_per_s": achieved, "of_measured_peak": round(achieved / peak, 4),
            "of_datasheet": None if sheet is None else round(achieved / sheet, 4)}


def measured_copy_bytes_per_s(device: str) -> float:
    """Bytes moved (read + written) per second by the fastest of COPY_REPEATS copies."""
    size = COPY_BYTES[device]
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)        # the first copy pays for what starts up lazily
    best = float("inf")
    for _ in range(COPY_REPEATS):
        _synchronize(device)
        began = time.perf_counter()
        target.copy_(source)
        _synchronize(device)
        best = min(best, time.perf_counter() - began)
    return 2 * size / best


def datasheet_bytes_per_s(name: str) -> float | None:
    for fragment in sorted(DATASHEET_BYTES_PER_S, key=len, reverse=True):
        if fragment.lower() in name.lower():
            return DATASHEET_BYTES_PER_S[fragment]
    return None


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
