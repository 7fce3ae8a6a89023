"""Builds the model from weights, owns the KV tensors, and runs one scheduled step."""
from __future__ import annotations

import torch
from torch import nn

from engine.attention.plan import MIN_PREFIX_TOKENS, plan_decode, plan_prefill
from engine.errors import ModelLoadError
from engine.kv.cache import KVCache
from engine.loading.config import ModelConfig
from engine.model import AttentionBatch, CausalLM, Linear, RotaryEmbedding
from engine.scheduler import ScheduledBatch
from kernels.backend import attention_ops
from kernels.cpu import onednn_linear, quant_matmul
from kernels.cpu.quant_matmul import QuantizedWeight


def build_model(config: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device,
                dtype: torch.dtype) -> CausalLM:
    with torch.device("meta"):
        model = CausalLM(config)
    expected = dict(model.state_dict())
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = [name for name in expected if name not in weights]
    if missing:
        raise ModelLoadError(f"the checkpoint lacks tensor {missing[0]!r} ({len(missing)} missing)")
    state = {}
    for name, tensor in weights.items():
        if name not in expected:
            continue
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, "
                                 f"the config implies {tuple(expected[name].shape)}")
        state[name] = tensor.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = RotaryEmbedding(config).to(device)
    return model.eval()


def attach_quantized(model: CausalLM, quantized: dict[str, QuantizedWeight]) -> int:
    """Gives each Linear whose weight the file stores in blocks the decode kernel reads its quantized
    copy, for steps of a few rows; the float32 weight stays for prefill. Bytes the copies hold."""
    if not quantized or not quant_matmul.available():
        return 0
    if model.config.tie_word_embeddings and "model.embed_tokens.weight" in quantized:
        quantized = {**quantized, "lm_head.weight": quantized["model.embed_tokens.weight"]}
    held = {}
    for name, module in model.named_modules():
        weight = quantized.get(f"{name}.weight")
        if isinstance(module, Linear) and weight is not None and weight.shape == tuple(module.weight.shape):
            module.quantized = weight
            held[id(weight.codes)] = weight.nbytes
    return sum(held.values())


def pack_weights(model: CausalLM, rows: int) -> int:
    """Puts each Linear's float32 CPU weight in oneDNN's layout (kernels.cpu.onednn_linear), in place of
    the plain one, for steps of about `rows` rows; an lm_head tied to the embedding keeps the plain
    layout the embedding reads. The number of weights packed (0 where oneDNN is not there)."""
    if not onednn_linear.available():
        return 0
    embedding = model.model.embed_tokens.weight
    linears = [m for m in model.modules() if isinstance(m, Linear) and m.weight is not embedding]
    for module in linears:
        module.weight = nn.Parameter(onednn_linear.pack(module.weight, rows), requires_grad=False)
        module.packed = True
    return len(linears)


class ModelRunner:
    def __init__(self, model: CausalLM, kv: KVCache, device: torch.device, cascade: bool = True):
        self.model = model
        self.kv = kv
        self.device = device
        self.use_cascade(cascade)
        self.tokens_computed = 0
        self.prompt_tokens_computed = 0

    def use_cascade(self, on: bool) -> None:
        """Cascade decode attention on or off from the next step (`swarm bench-decode` alternates)."""
        self.min_prefix_tokens = MIN_PREFIX_TOKENS if on else float("inf")

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits at the last new token of each scheduled sequence: [seqs, vocab]."""
        self.kv.copy_blocks([(c.src, c.dst) for c in batch.copies])
        input_ids, positions, attention = self._prepare(batch)
        self.tokens_computed += input_ids.numel()
        if not batch.is_prefill:
            return self.model.compute_logits(self.model(input_ids, positions, attention, self.kv))
        self.prompt_tokens_computed += input_ids.numel()
        last = torch.tensor(batch.num_new, device=self.device).cumsum(0) - 1
        return self.model.compute_logits(self.model(input_ids, positions, attention, self.kv, rows=last))

    def _prepare(self, batch: ScheduledBatch):
        block_size = self.kv.block_size
        tokens, positions, slots, context_lens = [], [], [], []
        for seq, n in zip(batch.seqs, batch.num_new):
            start = seq.num_computed_tokens
            span = range(start, start + n)
            tokens += seq.token_ids[start:start + n]
            positions += span
            slots += [seq.block_table[p // block_size] * block_size + p % block_size for p in span]
            context_lens.append(start + n)
        def as_tensor(values):
            return torch.tensor(values, dtype=torch.long, device=self.device)
        attention = AttentionBatch(batch.is_prefill, as_tensor(slots), context_lens, list(batch.num_new))
        tables = [seq.block_table for seq in batch.seqs]
        # a prefill's last tokens attend like decode rows in the last layer (CausalLM.forward's rows)
        attention.decode_plan = plan_decode(tables, context_lens, block_size, self.device, self.min_prefix_tokens)
        if batch.is_prefill:
            attention.block_tables = [as_tensor(table) for table in tables]
            if attention_ops(self.device).cascade_prefill and len(batch.seqs) > 1:
                starts = [seq.num_computed_tokens for seq in batch.seqs]
                attention.prefill_groups = plan_prefill(tables, starts, list(batch.num_new), block_size,
                                                        self.device, self.min_prefix_tokens)
        return as_tensor(tokens), as_tensor(positions), attention
