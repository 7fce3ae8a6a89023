"""What `swarm bench` found: per configuration, per system, and as JSON (schema in the README)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine import MachineProbe
from swarm.bench.floor import Floor
from swarm.bench.workload import METRICS, SYSTEMS, BenchOptions, Measurement

SCHEMA_VERSION = 1


@dataclass(slots=True)
class BusyResult:
    """One system's run of a configuration beside `processes` busy-loop processes (`--busy`)."""
    processes: int
    status: str                      # "ok" or "error"
    reason: str = ""
    measurement: Measurement | None = None
    matches_quiet: float | None = None

    def to_json(self, quiet: Measurement | None) -> dict:
        data = {"processes": self.processes, "status": self.status, "reason": self.reason}
        m = self.measurement
        if m is None:
            return data
        data.update(prompt_tokens_computed=m.prompt_tokens_computed, decode_tok_s=m.decode_tok_s,
                    decode_tokens=m.decode_tokens, decode_s=m.decode_s, wall_s=m.wall_s,
                    decode_over_quiet=_over(m.decode_tok_s, quiet and quiet.decode_tok_s),
                    wall_over_quiet=_over(m.wall_s, quiet and quiet.wall_s), matches_quiet=self.matches_quiet)
        return data


def _over(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


@dataclass(slots=True)
class SystemResult:
    name: str
    status: str                      # "ok", "not installed", "unavailable" or "error"
    reason: str = ""
    measurement: Measurement | None = None
    ratios: dict[str, float | None] = field(default_factory=dict)
    matches_swarm: float | None = None
    busy: BusyResult | None = None   # with --busy: the same configuration beside busy processes
    wall_over_floor: float | None = None
    note: str = ""                   # how it ran, if not as it ships (a peer on its plain CPU path)

    @property
    def label(self) -> str:
        """The system's name, and the note if there is one: "llama.cpp (plain CPU path: ...)"."""
        return f"{SYSTEMS[self.name]} ({self.note})" if self.note else SYSTEMS[self.name]

    def to_json(self) -> dict:
        data = {"label": self.label, "status": self.status, "reason": self.reason}
        m = self.measurement
        if m is not None:
            data.update(kv_bytes_peak=m.kv_bytes_peak, bytes_per_token=m.bytes_per_token,
                        prompt_tokens_computed=m.prompt_tokens_computed, ttft_last_s=m.ttft_last_s,
                        decode_tok_s=m.decode_tok_s, decode_tokens=m.decode_tokens, decode_s=m.decode_s,
                        wall_s=m.wall_s, generated_tokens=sum(len(o) for o in m.outputs),
                        matches_swarm=self.matches_swarm, ratios=dict(self.ratios),
                        wall_over_floor=self.wall_over_floor)
        if self.busy is not None:
            data["busy"] = self.busy.to_json(m)
        return data


@dataclass(slots=True)
class ConfigResult:
    agents: int
    trunk: int
    suffix: int
    new_tokens: int
    systems: dict[str, SystemResult] = field(default_factory=dict)
    floor: Floor | None = None       # None off a CPU: the probes measure the CPU

    def to_json(self) -> dict:
        return {"agents": self.agents, "trunk": self.trunk, "suffix": self.suffix,
                "new_tokens": self.new_tokens, "floor": self.floor and self.floor.to_json(),
                "systems": {name: result.to_json() for name, result in self.systems.items()}}

    def fill_floor(self, floor: Floor | None) -> None:
        """The machine's floor for this configuration, and each system's wall time over it."""
        self.floor = floor
        for system in self.systems.values():
            if floor is not None and system.measurement is not None:
                system.wall_over_floor = floor.over(system.measurement.wall_s)

    def fill_ratios(self) -> None:
        """Each system's metrics over swarm-with-sharing's: 8.0 on wall_s is eight times slower."""
        base = self.systems["swarm"].measurement
        for system in self.systems.values():
            if system.measurement is None or base is None:
                continue
            for metric in METRICS:
                system.ratios[metric] = _over(system.measurement.metric(metric), base.metric(metric))


@dataclass(slots=True)
class BenchReport:
    options: BenchOptions
    device: str
    dtype: str
    versions: dict[str, str | None]
    configs: list[ConfigResult]
    kernels: dict[str, object] | None = None
    machine: MachineProbe | None = None

    def to_json(self) -> dict:
        o = self.options
        return {
            "schema_version": SCHEMA_VERSION,
            "model": o.model,
            "device": self.device,
            "dtype": self.dtype,
            "hf_dtype": o.hf_dtype,
            "kernels": dict(self.kernels or {}),
            "machine": self.machine and self.machine.to_json(),
            "workload": {"agents": list(o.agents), "trunks": list(o.trunks), "suffix": o.suffix,
                         "new_tokens": o.new_tokens, "repeats": o.repeats, "seed": o.seed, "busy": o.busy},
            "systems": {name: SYSTEMS[name] for name in ("swarm", "swarm_no_sharing", *o.peers)},
            "versions": dict(self.versions),
            "configs": [config.to_json() for config in self.configs],
        }
