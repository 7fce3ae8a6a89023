"""The user-facing API, in vLLM's shape: `LLM(model).generate(prompts, SamplingParams(...))`."""
from __future__ import annotations

from dataclasses import dataclass

from engine.kv.stats import KVStats
from engine.llm_engine import EngineOptions, LLMEngine
from engine.loading.named_models import DEFAULT_MODEL
from engine.loading.tokenizer import Tokenizer
from engine.sampling import SamplingParams
from engine.sequence import Sequence


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
    def __init__(self, model: str = DEFAULT_MODEL, device: str = "auto", dtype: str = "auto",
                 block_size: int = 16, kv_budget_tokens: int | None = None,
                 kv_budget_bytes: int | None = None, enable_prefix_caching: bool = True,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, cascade_attention: bool = True,
                 quantized_decode: bool = True, onednn_weights: bool = True):
        options = EngineOptions(device, dtype, block_size, kv_budget_tokens, kv_budget_bytes,
                                enable_prefix_caching, max_num_seqs, max_num_batched_tokens, cascade_attention,
                                quantized_decode, onednn_weights)
        self.engine = LLMEngine(model, options)

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
