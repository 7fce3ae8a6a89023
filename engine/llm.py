"""The user-facing API, in vLLM's shape: `LLM(model).generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

from dataclasses import dataclass, fields

from engine.kv.stats import KVStats
from engine.llm_engine import LLMEngine
from engine.loading.named_models import DEFAULT_MODEL
from engine.loading.tokenizer import Tokenizer
from engine.options import EngineOptions
from engine.sampling import SamplingParams
from engine.sequence import Sequence
from engine.weight_memory import WeightMemory


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    num_cached_tokens: int
    error: str | None = None


class LLM:
    def __init__(self, model: str = DEFAULT_MODEL, **options):
        """options: any of EngineOptions' fields, by name (device, dtype, kv_budget_tokens, ...)."""
        self.engine = LLMEngine(model, _engine_options(options))

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    @property
    def config(self):
        return self.engine.config

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        """One output per prompt, in order. Prompts are strings or lists of token ids."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.engine.add_request(self._ids(p), sp, request_id=str(i))
                for i, (p, sp) in enumerate(zip(prompts, params_list))]
        while any(not s.is_finished for s in seqs):
            self.engine.step()
        for seq in seqs:
            self.engine.release(seq)
        return [self._output(seq) for seq in seqs]

    def kv_stats(self) -> KVStats:
        return self.engine.kv_stats()

    def reset_prefix_cache(self) -> int:
        """Forget the cached prefixes (as vLLM's LLM.reset_prefix_cache): the next prompts compute every token.
        Returns the KV blocks forgotten."""
        return self.engine.reset_prefix_cache()

    def weight_memory(self) -> WeightMemory:
        """The bytes the weights hold, by storage format (the engine's own count)."""
        return self.engine.weights

    @property
    def tokens_computed(self) -> int:
        return self.engine.tokens_computed

    def _ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return list(prompt)

    def _output(self, seq: Sequence) -> RequestOutput:
        text = self.tokenizer.decode(seq.output_token_ids)
        for stop in seq.params.stop:
            if stop in text:
                text = text[:text.index(stop)]
        return RequestOutput(seq.request_id, seq.token_ids[:seq.num_prompt_tokens], seq.output_token_ids,
                             text, seq.finish_reason, seq.num_cached_tokens, seq.error)


def _engine_options(options: dict) -> EngineOptions:
    known = [f.name for f in fields(EngineOptions)]
    unknown = [name for name in options if name not in known]
    if unknown:
        raise TypeError(f"LLM() has no option {unknown[0]!r}; its options are {', '.join(known)}")
    return EngineOptions(**options)
