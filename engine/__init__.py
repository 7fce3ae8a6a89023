"""swarm's inference engine: paged, shared KV cache behind vLLM's API. Everything the app uses is
exported here; the app imports `from engine import ...` and nothing below it (tests/test_layers.py).

The names load on first use (PEP 562), so that a CLI usage error or `import engine` for an error
type does not pay for importing torch (about 2 s of CPU).
"""
from importlib import import_module

from engine.cpu_threads import configure_openmp

configure_openmp()   # before anything imports torch: its OpenMP runtime reads its settings as it loads

_PUBLIC = {   # the module that defines them -> the names exported here
    "engine.llm": ("LLM", "RequestOutput"),
    "engine.sampling": ("SamplingParams",),
    "engine.llm_engine": ("LLMEngine", "StepResult", "pick_device", "pick_dtype", "pick_kv_dtype"),
    "engine.machine_probe": ("MachineProbe", "MatmulRate", "cached_probe", "cpu_has_native", "cpu_model_name"),
    "engine.options": ("EngineOptions", "KVFloor", "RUNTIME_RESERVE_BYTES", "WEIGHT_SCHEMES"),
    "engine.kv.sizing": ("KVSizing", "KVPoolTooSmall"),
    "engine.weight_memory": ("WeightMemory",),
    "engine.async_engine": ("AsyncEngine", "EngineSnapshot", "GenerationDelta", "RequestFailed"),
    "engine.kv.stats": ("KVStats", "RequestKV"),
    "engine.sequence": ("Sequence",),
    "engine.loading.tokenizer": ("Tokenizer",),
    "engine.loading.config": ("ModelConfig", "DTYPE_BYTES"),
    "engine.linear_attention.state_pool": ("state_bytes_per_sequence", "state_reserve_bytes", "state_reserve_slots"),
    "engine.loading.loader": ("load_model_config", "load_tokenizer"),
    "engine.loading.model_source": ("ModelSource", "resolve_model"),
    "engine.loading.weight_estimate": ("estimate_weights", "gguf_file_weights", "WEIGHT_FILE_TYPES"),
    "engine.loading.named_models": ("DEFAULT_MODEL", "NAMED_MODELS"),
    "engine.attention.plan": ("MIN_PREFIX_TOKENS",),
    "engine.cpu_threads": ("environment_without_ours", "wait_settings"),
    "engine.errors": ("SwarmError", "ModelLoadError", "UnsupportedArchitectureError", "OptionError", "SpecError"),
}
_EXPORTS = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
