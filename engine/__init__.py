"""swarm's inference engine: paged, shared KV cache behind vLLM's API.

The public names load on first use (PEP 562), so that `import engine.errors` or a CLI usage error
does not pay for importing torch (about 2 s of CPU).
"""
from importlib import import_module

from engine.cpu_threads import configure_openmp

configure_openmp()   # before anything imports torch: its OpenMP runtime reads its settings as it loads

_EXPORTS = {
    "LLM": "engine.llm",
    "RequestOutput": "engine.llm",
    "SamplingParams": "engine.sampling",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
