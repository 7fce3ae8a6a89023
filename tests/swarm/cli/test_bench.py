"""`swarm bench`'s table and chart with the machine's floor, from a report built by hand (tests/swarm/bench/
test_bench.py runs the bench itself)."""
from rich.console import Console

from engine import MachineProbe, MatmulRate
from swarm.bench.chart import write_chart
from swarm.bench.floor import Floor
from swarm.bench.report import BenchReport, ConfigResult, SystemResult
from swarm.bench.workload import BenchOptions, Measurement
from swarm.cli.bench import _print_report

MACHINE = MachineProbe("Test CPU 9000", 2, ["avx512f", "amx_bf16"], 2, "2.13.0+cpu",
                       {"float32": MatmulRate(4e11, (2048, 576, 1536), native=True),
                        "bfloat16": MatmulRate(2.5e12, (2048, 2048, 2048), native=True)}, 2e10, 3.1)
FLOOR = Floor("bfloat16", 5e11, 0.2, 63, 9e7, 2e9, 0.0127, 0.8)   # total 1.0 s


def report() -> BenchReport:
    config = ConfigResult(8, 2048, 64, 64)
    for name, wall in (("swarm", 2.0), ("swarm_no_sharing", 6.5)):
        measurement = Measurement(10_000, 100, 2560, 1.2, 504, 0.8, wall, [[1] * 64] * 8)
        config.systems[name] = SystemResult(name, "ok", measurement=measurement, matches_swarm=1.0)
    config.fill_ratios()
    config.fill_floor(FLOOR)
    options = BenchOptions(model="tiny", agents=(8,), trunks=(2048,), peers=())
    return BenchReport(options, "cpu", "float32", {"python": "3.11"}, [config], machine=MACHINE)


def test_the_table_shows_the_floor_row_and_every_wall_over_it():
    console = Console(record=True, width=220)
    _print_report(report(), console, None, None)
    text = console.export_text()
    assert "Test CPU 9000, 2 cores (avx512f amx_bf16), 2 threads" in text
    assert "bfloat16 2,500.0 GFLOP/s" in text and "read 20.0 GB/s" in text
    assert "× floor" in text
    floor_row = next(line for line in text.splitlines() if "machine floor" in line)
    assert "0.20 s" in floor_row and "1.00 s" in floor_row
    assert "2.0×" in next(line for line in text.splitlines() if "│ swarm " in line)
    assert "6.5×" in text


def test_the_chart_draws_the_floor(tmp_path):
    path = write_chart(report(), tmp_path / "bench.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
