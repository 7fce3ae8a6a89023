"""The engine loop: schedule a step, run it, sample, and decide who is done."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from engine import decode_graphs, prompt_matmul
from engine.attention.select import pool_dtype
from engine.code_panels import choose_code_panels
from engine.code_panels import pack as pack_code_panels
from engine.errors import OptionError, SwarmError
from engine.host_memory import keep_freed_memory
from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import BlockPool
from engine.kv.cache import KVCache
from engine.kv.device_memory import device_memory
from engine.kv.sizing import size_kv_pool
from engine.kv.stats import KVStats, collect_stats
from engine.linear_attention.delta_rule_kernels import delta_rule_kernels
from engine.linear_attention.state_pool import StatePool
from engine.loading.build import load_model
from engine.loading.context_length import with_context_length
from engine.loading.loader import load_model_config, load_tokenizer, resolve_model
from engine.machine_probe import cpu_has_native
from engine.model_runner import ModelRunner
from engine.options import EngineOptions
from engine.packed_weights import choose_panels, pack
from engine.quantized_layers import use_decode_products
from engine.sampler import Sampler
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.weight_memory import CODES_FORMAT, WeightMemory, with_panels


@dataclass(slots=True)
class StepResult:
    new_tokens: list[tuple[Sequence, int]] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    prefilled: list[Sequence] = field(default_factory=list)
    logits: torch.Tensor | None = None   # rows aligned with new_tokens
    prompt_tokens: int = 0               # prompt tokens computed in the step (a mixed step has decode rows too)

    @property
    def decode_only(self) -> bool:
        """Tokens came, and no prompt was computed beside them: a step whose time is all decoding."""
        return bool(self.new_tokens) and not self.prompt_tokens


class LLMEngine:
    def __init__(self, model: str, options: EngineOptions):
        self.source = resolve_model(model)
        self.config = with_context_length(load_model_config(self.source), options.max_model_len)
        self.tokenizer = load_tokenizer(self.source)
        self.device = pick_device(options.device)
        self.dtype = pick_dtype(options.dtype, self.device)
        precisions = prompt_matmul.choose_all(options.dtype, self.device, self.dtype)
        self.prompt_precision, self.decode_precision = precisions.prompt, precisions.decode
        if self.device.type == "cpu":
            keep_freed_memory()
        loaded = load_model(self.source, self.config, self.device, self.dtype, options)
        self.code_panels = choose_code_panels(options.code_panels, self.device, precisions, loaded.net)
        if not self.code_panels:   # integer products read code panels: none kept here
            if self.prompt_precision == prompt_matmul.INT8_KERNEL:
                self.prompt_precision = prompt_matmul.KERNEL
            if self.decode_precision == "int8":
                self.decode_precision = "bfloat16"
        use_decode_products(loaded.net, self.decode_precision)
        self.packed_weights = choose_panels(options.packed_weights, self.device, precisions, loaded.net,
                                            self.code_panels)
        self.weights = self._laid_out(loaded)
        self.onednn_weights = loaded.packed
        self.kv_dtype = pool_dtype(self.device, self.dtype, precisions.prompt_attention, precisions.decode_attention)
        self.kv_sizing = size_kv_pool(loaded.net, self.config, options, self.dtype, self.device,
                                      device_memory(self.device), self.kv_dtype)
        num_blocks = self.kv_sizing.num_blocks
        # one block past the pool's: the scratch block padded rows of a decode graph write (engine.decode_graphs)
        kv = KVCache.allocate(self.config, num_blocks + 1, options.block_size, self.kv_dtype, self.device)
        # a hybrid's linear layers keep a state per sequence, and snapshots of it where prompts end
        self.states = self._state_pool(options) if self.config.is_hybrid else None
        self.delta_rule = delta_rule_kernels(self.device.type).name if self.config.is_hybrid else None
        self.blocks = BlockManager(BlockPool(num_blocks, options.block_size), options.enable_prefix_caching,
                                   self.states, max_snapshots=max(1, options.max_num_seqs - 1))
        self.scheduler = Scheduler(self.blocks, options.max_num_seqs, options.max_num_batched_tokens,
                                   options.mixed_step_tokens)
        graphs = None if self.states is not None else decode_graphs.engine_settings(
            options, self.device, num_blocks, self.config.max_position_embeddings)
        self.runner = ModelRunner(loaded.net, kv, self.device, options.cascade_attention, graphs, self.states,
                                  self.prompt_precision, precisions.prompt_attention, precisions.decode_attention)
        self.sampler = Sampler()
        self.eos_token_ids = set(self.tokenizer.eos_token_ids) | set(self.config.eos_token_ids)
        self.live: dict[int, Sequence] = {}

    def _state_pool(self, options: EngineOptions) -> StatePool:
        """On a GPU, a slot for each sequence the scheduler runs at once, made at start where kv sizing held the
        memory back; on a CPU, a few slots that grow with use."""
        on_gpu = self.device.type == "cuda"
        return StatePool.for_config(self.config, self.dtype, self.device, options.max_num_seqs if on_gpu else 4)

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str = "",
                    keep_kv: bool = False, prefill_only: bool = False) -> Sequence:
        if not prompt_ids:
            raise ValueError("a prompt needs at least one token")
        seq = Sequence(list(prompt_ids), params, request_id=request_id,
                       keep_kv=keep_kv or prefill_only, prefill_only=prefill_only)
        self.live[seq.seq_id] = seq
        self.scheduler.add(seq)
        return seq

    def extend(self, seq: Sequence, token_ids: list[int], params: SamplingParams | None = None) -> None:
        """Append tokens to a paused sequence (a tool result, the next user turn) and go on
        generating from its kept KV: only the new tokens are computed."""
        assert seq.status == SequenceStatus.PAUSED, "extend() takes a paused sequence"
        seq.token_ids += token_ids
        seq.num_prompt_tokens = len(seq.token_ids)
        seq.finish_reason = None
        if params is not None:
            seq.params = params
        self.scheduler.resume(seq)

    def release(self, seq: Sequence) -> None:
        self.scheduler.release(seq)
        self.sampler.forget(seq.seq_id)
        self.live.pop(seq.seq_id, None)

    def pin(self, seq: Sequence) -> list[int]:
        return self.blocks.pin(seq)

    def unpin(self, block_ids: list[int]) -> None:
        self.blocks.unpin(block_ids)

    def max_request_tokens(self, prompt_ids: list[int]) -> int:
        """The most tokens, prompt and output, one request starting with `prompt_ids` can hold in KV:
        every block no pin holds, plus the pinned blocks (a trunk) it shares whole. Other requests
        do not count: they give way to it, or it waits for them."""
        pool, size = self.blocks.pool, self.blocks.block_size
        matched_blocks, matched = self.blocks.match_prefix(prompt_ids)
        shared_pinned = sum(1 for block_id in matched_blocks[:matched // size] if pool.is_pinned(block_id))
        return (pool.num_blocks - pool.num_pinned + shared_pinned) * size

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> StepResult:
        result = StepResult()
        batch = self.scheduler.schedule()
        result.finished += batch.failed
        if not batch.seqs:
            return result
        logits = self.runner.run(batch)
        result.prompt_tokens = sum(batch.num_new) - batch.num_decode
        sample_rows = []
        for row, (seq, n) in enumerate(zip(batch.seqs, batch.num_new)):
            self.blocks.commit_written(seq, n)
            if seq.num_uncomputed_tokens:   # a prompt chunk with more to come
                continue
            if not batch.is_decode_row(row):
                self.blocks.snapshot_state(seq)
                self.scheduler.prompt_done(seq)
                result.prefilled.append(seq)
                if seq.prefill_only:
                    seq.finish_reason = "prefilled"
                    self.scheduler.finish(seq)
                    continue
            sample_rows.append(row)
        if sample_rows:
            self._sample(batch.seqs, sample_rows, logits, result)
        return result

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix no live request holds: the next prompts compute all their tokens. Returns
        the blocks forgotten."""
        return self.blocks.reset_prefix_cache()

    def kv_stats(self) -> KVStats:
        seqs = [s for s in self.live.values() if s.block_table]
        return collect_stats(self.blocks, seqs, self.runner.kv.block_bytes, self.runner.tokens_computed)

    @property
    def tokens_computed(self) -> int:
        return self.runner.tokens_computed

    @property
    def prompt_tokens_computed(self) -> int:
        """Prompt tokens run through the model so far (prefill rows; decode rows are not counted)."""
        return self.runner.prompt_tokens_computed

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the whole KV pool holds."""
        pool = self.blocks.pool
        return pool.num_blocks * pool.block_size

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token takes, measured on the pool's own tensors."""
        return self.runner.kv.bytes_per_token

    @property
    def weight_bytes(self) -> int:
        return self.weights.total_bytes

    def use_cascade(self, on: bool) -> None:
        """Cascade attention on or off for the next steps (the decode bench compares the two)."""
        self.runner.use_cascade(on)

    def _laid_out(self, loaded) -> WeightMemory:
        """The loaded weights' bytes, with the copies laid out for the kernels made and counted."""
        weights = loaded.weights
        if self.packed_weights:
            weights = with_panels(weights, pack(loaded.net))
        if self.code_panels:
            weights = with_panels(weights, pack_code_panels(loaded.net), CODES_FORMAT)
        return weights

    def use_mixed_step_tokens(self, tokens: int) -> None:
        """The token budget of steps that carry decode rows, from the next step (`swarm bench-arrival` compares)."""
        self.scheduler.mixed_step_tokens = tokens

    def kernels(self) -> dict[str, object]:
        """Which kernels run: the attention set, the weights' bytes by format, the float matmuls' library, the
        precision of prompts' products and of their attention's, whether the quantized weights are also kept as
        bfloat16 panels (engine.packed_weights) and as code panels (engine.code_panels), of decode rows'
        products on the quantized layers and of their attention's, the KV pool's dtype, whether decode steps
        replay as graphs, and on a hybrid the gated delta rule's kernels (torch or fla)."""
        attention = self.runner.attention
        chosen = {"attention": attention.name, "weights": self.weights.to_json(),
                  "matmuls": "onednn" if self.onednn_weights else "torch", "packed_weights": self.packed_weights,
                  "code_panels": self.code_panels,
                  "prompt_products": self.prompt_precision,
                  "prompt_attention": attention.prompt_attention(), "decode_products": self.decode_precision,
                  "decode_attention": attention.decode_attention(),
                  "kv_dtype": str(self.kv_dtype).removeprefix("torch."),
                  "decode_graphs": self.runner.graphs_state()}
        if self.delta_rule is not None:
            chosen["delta_rule"] = self.delta_rule
        return chosen

    def _sample(self, seqs, rows, logits, result: StepResult) -> None:
        chosen = [seqs[r] for r in rows]
        result.logits = logits if len(rows) == len(logits) else logits[rows]   # a list index waits for the device
        tokens = self.sampler.sample(result.logits, [(s.seq_id, s.params) for s in chosen])
        for seq, token in zip(chosen, tokens):
            seq.token_ids.append(token)
            result.new_tokens.append((seq, token))
            reason = self._finish_reason(seq, token)
            if reason:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
                result.finished.append(seq)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if params.stop and self._hits_stop_string(seq):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens:
            return "length"
        return None

    def _hits_stop_string(self, seq: Sequence) -> bool:
        longest = max(len(s) for s in seq.params.stop)
        tail = self.tokenizer.decode(seq.output_token_ids[-(longest + 8):])
        return any(stop in tail for stop in seq.params.stop)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise OptionError(f"device {name!r} is not known to torch; use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SwarmError("device 'cuda' asked for, but torch sees no GPU; use --device cpu or auto")
    return device


def pick_kv_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype of the KV pool an engine of dtype `name` keeps on `device` (engine.attention.select.pool_dtype):
    on a CPU, auto's may be bfloat16 where its compute is float32."""
    dtype = pick_dtype(name, device)
    precisions = prompt_matmul.choose_all(name, device, dtype)
    return pool_dtype(device, dtype, precisions.prompt_attention, precisions.decode_attention)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: 16-bit on a GPU, where memory is what runs out; float32 on a CPU, where greedy
    output stays token-for-token the same with sharing on or off, batched or alone (16-bit
    rounding can flip near-ties when the summation order changes), and where swarm's C kernels
    and oneDNN's float32 matmuls run (bfloat16 was 1.9x slower end to end on an AVX512-BF16 CPU).
    On a CPU, auto may still give prompts bfloat16 products (engine.prompt_matmul)."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise OptionError(f"dtype {name!r} is not supported; use one of auto, {', '.join(dtypes)}")
    if device.type == "cpu" and not cpu_has_native(dtypes[name]):
        warnings.warn(f"this CPU has no native {name} matrix units (AVX512-BF16/AMX), so {name} runs "
                      "emulated and prefill is several times slower than float32; use dtype auto or float32",
                      stacklevel=2)
    return dtypes[name]

