"""swarm/run/summary.py: summary.json carries the weights by format beside the total it always had."""
import json

from engine.weight_memory import WeightMemory
from swarm.run.facts import OPENAI_FACTS
from swarm.run.memory import MemorySnapshot, RunMemory
from swarm.run.server_metrics import ServerMetrics
from swarm.run.summary import RunInfo, RunTimings, build_summary, write_summary


def test_the_summary_has_the_weights_by_format_and_keeps_weight_bytes(tmp_path):
    weights = WeightMemory(5_021_827_072, {"Q4_K": 3_704_979_456, "Q6_K": 1_315_614_720, "F32": 1_232_896}, "Q4_K_M")
    info = RunInfo("run-1", tmp_path, "swarm.yaml", "qwen3-8b.gguf", "cuda:0", "float16", weights.total_bytes, weights)
    summary = build_summary(info, "completed", [], RunMemory(MemorySnapshot(), []), RunTimings(), {})
    written = json.loads(write_summary(tmp_path, summary).read_text())
    assert written["weight_bytes"] == 5_021_827_072
    assert written["weights"] == {"total_bytes": 5_021_827_072, "label": "Q4_K_M",
                                  "by_format": {"Q4_K": 3_704_979_456, "Q6_K": 1_315_614_720, "F32": 1_232_896}}


def test_a_run_on_a_server_knows_no_weights(tmp_path):
    info = RunInfo("run-1", tmp_path, "swarm.yaml", "Qwen/Qwen3-8B", facts=OPENAI_FACTS, base_url="http://gpu:8000/v1")
    memory = RunMemory(ServerMetrics(), metrics_url="http://gpu:8000/metrics")
    summary = build_summary(info, "completed", [], memory, RunTimings(), {})
    assert summary["weights"] is None and summary["weight_bytes"] == 0
