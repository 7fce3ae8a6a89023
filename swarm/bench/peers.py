"""The systems `swarm bench` measures swarm against: Hugging Face transformers and llama.cpp.

Each runner takes a Workload and returns a Measurement; neither shares anything it is not
built to share. transformers runs one batched `generate` (left padding, a KV cache per
sequence); llama.cpp runs its own shared-prompt recipe, in swarm/bench/llamacpp.py.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import torch

from engine import ModelSource
from swarm.bench.workload import Measurement, Stopwatch, Workload

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PeerUnavailable(Exception):
    """The peer cannot run here: not installed, or it cannot read this model."""


class HFRunner:
    name = "hf"
    label = "transformers"

    def __init__(self, source: ModelSource, device: torch.device, dtype: str):
        if importlib.util.find_spec("transformers") is None:
            raise PeerUnavailable("not installed (pip install transformers)")
        import transformers

        transformers.logging.disable_progress_bar()
        transformers.logging.set_verbosity_error()
        self.version = transformers.__version__
        self.device = device
        self.dtype = dtype
        self.model = _load_hf_model(transformers, source.path, DTYPES[dtype]).to(device).eval()

    def run(self, workload: Workload) -> Measurement:
        from transformers import GenerationConfig

        clock = _TokenClock()
        inputs = self._inputs(workload.prompts)
        config = GenerationConfig(do_sample=False, max_new_tokens=workload.new_tokens,
                                  min_new_tokens=None, eos_token_id=None, pad_token_id=0)
        with torch.inference_mode():
            out = self.model.generate(**inputs, generation_config=config, streamer=clock,
                                      return_dict_in_generate=True)
            wall = clock.watch.elapsed()
        width = inputs["input_ids"].shape[1]
        cache = getattr(out, "cache", None) or out.past_key_values
        ttft = clock.token_times[0]
        return Measurement(
            kv_bytes_peak=cache_bytes(cache),
            bytes_per_token=cache_bytes(cache) // (workload.agents * cache.get_seq_length()),
            prompt_tokens_computed=inputs["input_ids"].numel(),
            ttft_last_s=ttft,
            decode_tokens=workload.agents * (workload.new_tokens - 1),
            decode_s=wall - ttft,
            wall_s=wall,
            outputs=out.sequences[:, width:].tolist(),
        )

    def _inputs(self, prompts: list[list[int]]) -> dict[str, torch.Tensor]:
        """Left padding, so every row's last prompt token sits in the last column."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}


class _TokenClock:
    """A generate() streamer that only notes when each batch of new tokens arrives."""

    def __init__(self):
        self.watch = Stopwatch()
        self.calls = 0
        self.token_times: list[float] = []

    def put(self, value) -> None:
        self.calls += 1
        if self.calls > 1:  # the first call hands over the prompt
            self.token_times.append(self.watch.elapsed())

    def end(self) -> None:
        pass


def _load_hf_model(transformers, path: Path, dtype: torch.dtype):
    auto = transformers.AutoModelForCausalLM
    if path.is_dir():
        return auto.from_pretrained(str(path), dtype=dtype)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # its GGUF reader draws its own progress bar
            return auto.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    except (ValueError, OSError, ImportError, RuntimeError) as err:
        raise PeerUnavailable(f"transformers cannot load {path.name}: {str(err).splitlines()[0]}") from None


def cache_bytes(cache) -> int:
    """What a transformers KV cache holds: every layer's keys and values."""
    if hasattr(cache, "layers"):
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    return sum(k.nbytes + v.nbytes for k, v in cache)
