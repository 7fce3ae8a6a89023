"""swarm's inference engine: paged, shared KV cache behind vLLM's API."""
from engine.llm import LLM, RequestOutput
from engine.sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
