"""`swarm bench --plot`: the PNG. Per trunk length, a column of two panels:

    KV held at peak, two bars per N (shared trunk vs. a copy per agent), as in the article;
    end-to-end wall time of every system in seconds, per N, each bar labelled with its multiple of the
    machine's floor (swarm/bench/floor.py), which is drawn as a black line across each N's bars.

matplotlib is optional (`pip install 'swarm-llm[bench]'`); the bench runs without it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from engine import SwarmError
from swarm.bench.report import BenchReport, ConfigResult
from swarm.bench.workload import SYSTEMS
from swarm.spec.kv_budget import format_bytes

KB, MB = 1e3, 1e6
COLORS = {"swarm": "#2a7ab0", "swarm_no_sharing": "#c8553d", "hf": "#e3a33b", "llamacpp": "#6a8d3a"}


class ChartError(SwarmError):
    exit_code = 2


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise ChartError("--plot needs matplotlib: pip install 'swarm-llm[bench]' (or pip install matplotlib)")


def write_chart(report: BenchReport, path: Path) -> Path:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trunks = list(dict.fromkeys(c.trunk for c in report.configs))
    fig, axes = plt.subplots(2, len(trunks), figsize=(4.6 * len(trunks) + 1.2, 8), squeeze=False)
    for col, trunk in enumerate(trunks):
        configs = [c for c in report.configs if c.trunk == trunk]
        _kv_panel(axes[0][col], configs, trunk)
        _wall_panel(axes[1][col], configs)
    o = report.options
    cpu = f", {report.machine.cpu}" if report.machine else ""
    kv_dtype = (report.kernels or {}).get("kv_dtype", report.dtype)
    precision = f"({report.dtype})" if kv_dtype == report.dtype else f"\n({report.dtype}, its KV cache in {kv_dtype})"
    fig.suptitle(f"swarm bench: {Path(o.model).name} on {report.device}{cpu} {precision}\n"
                 f"N agents, shared trunk, {o.suffix}-token suffix and {o.new_tokens} new tokens each")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _kv_panel(ax, configs: list[ConfigResult], trunk: int) -> None:
    """Every system's KV at its peak, side by side for each N, as the wall panel draws their times."""
    systems = _drawn_systems(configs)
    largest = max([_value(c, name, "kv_bytes_peak") or 0 for c in configs for name in systems] or [0])
    unit, scale = ("MB", MB) if largest >= MB else ("KB", KB)
    for i, name in enumerate(systems):
        values = [_value(c, name, "kv_bytes_peak") or 0 for c in configs]
        bars = _system_bars(ax, configs, systems, i, [v / scale for v in values])
        ax.bar_label(bars, labels=[format_bytes(v) if v else "" for v in values], fontsize=6, padding=1,
                     rotation=90)
    ax.set_xticks(range(len(configs)), [f"N={c.agents}" for c in configs])
    ax.set_ylabel(f"KV held at peak ({unit})")
    ax.set_title(f"KV memory, trunk {trunk:,} tokens (swarm stores it once)")
    ax.set_ylim(0, largest / scale * 1.35 or 1)
    ax.legend(fontsize=8, loc="upper left", ncols=2)


def _wall_panel(ax, configs: list[ConfigResult]) -> None:
    systems, highest = _drawn_systems(configs), 0.0
    for i, name in enumerate(systems):
        walls = [_value(c, name, "wall_s") or 0 for c in configs]
        bars = _system_bars(ax, configs, systems, i, walls)
        ax.bar_label(bars, labels=[_wall_label(c, name) for c in configs], fontsize=7, padding=1)
        highest = max([highest, *walls])
    for x, config in enumerate(configs):
        if config.floor is not None:
            ax.hlines(config.floor.total_s, x - 0.45, x + 0.45, color="black", linewidth=1.5,
                      label="machine floor" if x == 0 else None)
            highest = max(highest, config.floor.total_s)
    ax.set_ylim(0, highest * 1.35 or 1)
    ax.set_xticks(range(len(configs)), [f"N={c.agents}" for c in configs])
    ax.set_ylabel("wall time (s)")
    ax.set_title("End-to-end time (lower: faster)")
    ax.legend(fontsize=8, loc="upper left", ncols=2)


def _drawn_systems(configs: list[ConfigResult]) -> list[str]:
    """The systems measured in any of these configurations, in the table's order."""
    return [name for name in SYSTEMS if any(_ok(c, name) for c in configs)]


def _system_bars(ax, configs: list[ConfigResult], systems: list[str], index: int, heights: list[float]):
    """System `index`'s bars, one per configuration, beside the other systems' in each N's slot."""
    width = 0.8 / max(1, len(systems))
    xs = [x - 0.4 + width * (index + 0.5) for x in range(len(configs))]
    return ax.bar(xs, heights, width=width, label=_legend_label(configs, systems[index]),
                  color=COLORS[systems[index]])


def _legend_label(configs: list[ConfigResult], name: str) -> str:
    """The system's labels in these configurations: one, unless a peer fell back to its plain path midway."""
    return " / ".join(dict.fromkeys(c.systems[name].label for c in configs if _ok(c, name)))


def _wall_label(config: ConfigResult, name: str) -> str:
    if not _ok(config, name):
        return ""
    result = config.systems[name]
    over = result.wall_over_floor
    return f"{result.measurement.wall_s:.2f} s" + ("" if over is None else f"\n{over:.1f}× floor")


def _ok(config: ConfigResult, name: str) -> bool:
    result = config.systems.get(name)
    return result is not None and result.measurement is not None


def _value(config: ConfigResult, name: str, metric: str) -> float:
    return config.systems[name].measurement.metric(metric) if _ok(config, name) else 0.0
