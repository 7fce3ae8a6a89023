"""swarm/run/local_backend.py: what a run on swarm's own engine learns from the engine as it opens."""
from safetensors import safe_open

from engine.llm_engine import EngineOptions, LLMEngine
from swarm.run.local_backend import LocalBackend, run_kv_floor
from swarm.run.memory import MemorySnapshot, RunMemory
from swarm.run.summary import RunInfo, RunTimings, build_summary
from swarm.spec.schema import load_spec
from swarm.trunk.fit import stand_in_prompts
from tests.helpers.runs import tiny_model, write_run_spec


def test_opening_carries_the_engines_weights_by_format_into_the_run_and_its_summary(tmp_path, tmp_path_factory):
    model = tiny_model(tmp_path_factory.getbasetemp())
    spec = load_spec(write_run_spec(tmp_path, model, agents=1))
    engine = LLMEngine(str(model), EngineOptions(device="cpu", dtype="float32", kv_budget_tokens=1024))
    info = RunInfo("run-1", tmp_path, str(spec.path))
    LocalBackend(spec, engine).open(info, RunTimings(), note=lambda text: None)
    assert info.weights == engine.weights and info.weight_bytes == engine.weights.total_bytes
    summary = build_summary(info, "completed", [], RunMemory(MemorySnapshot(), []), RunTimings(), {})
    # a float32 Hugging Face folder kept in float32: the weights are the checkpoint's own bytes
    with safe_open(str(model / "model.safetensors"), "pt") as checkpoint:
        tensors = [checkpoint.get_slice(name) for name in checkpoint.keys()]
        assert {tensor.get_dtype() for tensor in tensors} == {"F32"}
        file_bytes = sum(_numel(tensor.get_shape()) * 4 for tensor in tensors)
    assert summary["weights"] == {"total_bytes": file_bytes, "by_format": {"F32": file_bytes}, "label": "F32"}
    assert summary["weight_bytes"] == file_bytes


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def test_the_run_asks_the_engine_for_its_trunk_and_the_longest_first_prompt_after_it(tmp_path):
    model = tiny_model(tmp_path)
    spec = load_spec(write_run_spec(tmp_path / "run", model, agents=2))
    floor = run_kv_floor(spec)
    prompts = stand_in_prompts(spec, spec.out or spec.path.parent)
    assert floor.trunk_tokens == len(prompts.trunk.token_ids) > 0
    longest = max(len(agent.prompt_ids) for agent in prompts.agents)
    assert floor.trunk_tokens + floor.agent_tokens == longest + 1 > floor.trunk_tokens
