"""The machine's floor for one bench configuration: the seconds no system can beat on this machine, from the
workload's FLOPs and bytes and the rates engine/machine_probe.py measured.

With L layers, hidden size d, H heads and H_kv KV heads of size h, intermediate size f, vocabulary V:

    P = L · (d·H·h + 2·d·H_kv·h + H·h·d + 3·d·f)     the layers' weights (q, k, v, o; gate, up, down)
    E = d · V                                         the logits' weights (lm_head)
    attention = 4 · L · H · h FLOPs per (query, key) pair: q·kᵀ and the weighted sum of v

Prompt: the trunk's T tokens once, then each of the N agents' S suffix tokens; the logits only at each prompt's
last position. A query at position i attends i + 1 keys:

    pairs   = T(T+1)/2 + N · (S·T + S(S+1)/2)
    FLOPs   = 2·P·(T + N·S) + 2·E·N + 4·L·H·h · pairs
    prefill = FLOPs / R,  R the fastest matmul rate measured, whatever its dtype

Decode: the first new token comes with the prompt; G − 1 steps follow. At step k (1 … G−1) each row attends
c = T + S + k keys, the trunk's KV read once for all rows (as cascade attention does) and each row's own S + k:

    bytes_k = W + KV · (T + N·(S + k))                 W: the model's weight bytes (not the kernels' copies)
    FLOPs_k = N · (2·P + 2·E + 4·L·H·h · c)
    step_k  = max(bytes_k / B, FLOPs_k / R)            B: the measured read bandwidth

    floor = prefill + Σ step_k

W counts every weight a step reads: with an untied embedding table only one row of it is read per token, so its
share of the bytes, E / (P + 2E) at the weights' mean bytes per parameter, is left out. Norms and biases are
too small to count.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine import MachineProbe


@dataclass(frozen=True, slots=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    weight_bytes: int            # the model's own, as the engine keeps them: a Q4_K_M GGUF's blocks, float32
                                 # tensors, ...; not the copies laid out for its kernels (WeightMemory.model_bytes)
    kv_bytes_per_token: int

    @classmethod
    def of(cls, config, weight_bytes: int, kv_bytes_per_token: int) -> ModelShape:
        """From the engine's ModelConfig."""
        return cls(config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                   config.intermediate_size, config.vocab_size, config.tie_word_embeddings, weight_bytes,
                   kv_bytes_per_token)

    @property
    def layer_params(self) -> int:
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    @property
    def logit_params(self) -> int:
        return self.hidden * self.vocab

    @property
    def attention_flops_per_pair(self) -> int:
        return 4 * self.layers * self.heads * self.head_dim

    @property
    def decode_weight_bytes(self) -> float:
        """The weights' bytes one decode step reads: all but an untied embedding table."""
        if self.tied_embeddings:
            return self.weight_bytes
        p, e = self.layer_params, self.logit_params
        return self.weight_bytes * (p + e) / (p + 2 * e)


@dataclass(frozen=True, slots=True)
class Floor:
    matmul_dtype: str            # the dtype of the rate R
    prefill_flops: float
    prefill_s: float
    decode_steps: int            # G − 1
    decode_step_bytes: float     # mean over the steps
    decode_step_flops: float
    decode_step_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    def over(self, wall_s: float | None) -> float | None:
        """A wall time as a multiple of the floor: 2.0 is twice the floor."""
        return wall_s / self.total_s if wall_s is not None and self.total_s > 0 else None

    def to_json(self) -> dict:
        return {"matmul_dtype": self.matmul_dtype, "prefill_flops": self.prefill_flops, "prefill_s": self.prefill_s,
                "decode_steps": self.decode_steps, "decode_step_bytes": self.decode_step_bytes,
                "decode_step_flops": self.decode_step_flops, "decode_step_s": self.decode_step_s,
                "decode_s": self.decode_s, "total_s": self.total_s}


def machine_floor(model: ModelShape, probe: MachineProbe, agents: int, trunk: int, suffix: int,
                  new_tokens: int) -> Floor:
    dtype = probe.fastest_dtype()
    rate, bandwidth = probe.matmul_flop_s[dtype].flop_s, probe.read_bytes_per_s
    flops = prefill_flops(model, agents, trunk, suffix)
    steps = [decode_step(model, agents, trunk, suffix, k) for k in range(1, new_tokens)]
    times = [max(nbytes / bandwidth, step_flops / rate) for nbytes, step_flops in steps]
    count = len(steps) or 1   # G = 1: no decode step, and the means are 0
    return Floor(dtype, flops, flops / rate, len(steps), sum(b for b, _ in steps) / count,
                 sum(f for _, f in steps) / count, sum(times) / count, sum(times))


def prefill_flops(model: ModelShape, agents: int, trunk: int, suffix: int) -> float:
    pairs = trunk * (trunk + 1) / 2 + agents * (suffix * trunk + suffix * (suffix + 1) / 2)
    return (2 * model.layer_params * (trunk + agents * suffix) + 2 * model.logit_params * agents
            + model.attention_flops_per_pair * pairs)


def decode_step(model: ModelShape, agents: int, trunk: int, suffix: int, k: int) -> tuple[float, float]:
    """(bytes read, FLOPs) of decode step k, 1-based: every row's token k + 1."""
    context = trunk + suffix + k
    nbytes = model.decode_weight_bytes + model.kv_bytes_per_token * (trunk + agents * (suffix + k))
    flops = agents * (2 * model.layer_params + 2 * model.logit_params + model.attention_flops_per_pair * context)
    return nbytes, flops
