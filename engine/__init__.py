"""swarm's inference engine: paged, shared KV cache behind vLLM's API."""
from engine.cpu_threads import configure_openmp

configure_openmp()   # before anything imports torch: its OpenMP runtime reads its settings as it loads

from engine.llm import LLM, RequestOutput  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
