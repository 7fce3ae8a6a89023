"""swarm/cli/plain_view.py: the first line of a run says what the engine holds of the weights."""
import io

from engine.weight_memory import WeightMemory
from swarm.cli.plain_view import PlainView, describe_weights
from swarm.run.memory import MemorySnapshot, RunMemory
from swarm.run.summary import RunInfo
from tests.helpers.runs import REPO


def test_the_start_line_names_the_weights_bytes_and_format():
    info = RunInfo("run-1", REPO, "swarm.yaml", "qwen3-8b.gguf", "cuda:0", "float16", 5_021_827_072,
                   WeightMemory(5_021_827_072, {"Q4_K": 3_704_979_456, "Q6_K": 1_316_847_616}, "Q4_K_M"))
    stream = io.StringIO()
    PlainView(stream).start(info, [], RunMemory(MemorySnapshot(), []))
    assert stream.getvalue() == (f"swarm: run run-1: 0 agents, qwen3-8b.gguf on cuda:0 (float16), weights 5.02 GB · "
                                 f"Q4_K_M, writing to {REPO}\n")


def test_without_the_engines_count_by_format_the_total_is_all_it_says():
    assert describe_weights(RunInfo("run-1", REPO, "swarm.yaml", weight_bytes=269_030_000)) == "weights 269.03 MB"
