"""The linear layers' state of every live sequence, beside the KV block pool: one slot per sequence, holding the
conv and recurrent state of each Gated DeltaNet layer.

    conv       [linear layers, slots, conv_dim, kernel − 1]            the model's dtype
    recurrent  [linear layers, slots, value_heads, k_dim, v_dim]        float32

A sequence takes a slot (zeros: the state before its first token) when its KV is admitted, and gives it back
when its KV is freed (finished, preempted, evicted while paused): engine.kv.block_manager calls both, so a
slot lives exactly as long as the blocks whose tokens it summarises. The state cannot be rewound, so a sequence
that starts from cached blocks (another's prefix, or its own after preemption) starts from a snapshot of the state
where they end (engine.linear_attention.snapshot_pool), copied into its fresh slot. The pool grows by doubling;
on a GPU it starts with a slot for each sequence the scheduler runs at once (what engine.kv.sizing held back for
it), so it grows only for sequences paused beyond those.
"""
from __future__ import annotations

import torch

from engine.linear_attention.gated_deltanet_layer import LinearState
from engine.loading.config import ModelConfig


def state_bytes_per_sequence(config: ModelConfig, dtype_bytes: int) -> int:
    """What one sequence's slot takes: each linear layer's conv state (in the model's dtype) and recurrent
    state (float32). Qwen3.5-9B, bfloat16: 24 layers x (48 KiB + 2 MiB), about 49 MiB."""
    shape = config.linear_attention
    if shape is None:
        return 0
    conv = shape.conv_dim * (shape.linear_conv_kernel_dim - 1) * dtype_bytes
    recurrent = shape.linear_num_value_heads * shape.linear_key_head_dim * shape.linear_value_head_dim * 4
    return len(config.linear_layers) * (conv + recurrent)


def state_reserve_slots(config: ModelConfig, max_num_seqs: int) -> int:
    """The slots a GPU engine holds back for a hybrid's state: one for each of its max_num_seqs sequences and as
    many snapshots (engine.linear_attention.snapshot_pool keeps the pinned trunk's and max_num_seqs − 1 others).
    0 for a model with KV only."""
    return 2 * max_num_seqs if config.linear_attention is not None else 0


def state_reserve_bytes(config: ModelConfig, max_num_seqs: int, dtype_bytes: int) -> int:
    """What those slots take."""
    return state_reserve_slots(config, max_num_seqs) * state_bytes_per_sequence(config, dtype_bytes)


class StatePool:
    def __init__(self, num_layers: int, conv_shape: tuple[int, int], recurrent_shape: tuple[int, int, int],
                 dtype: torch.dtype, device: torch.device, capacity: int = 4):
        self.conv = torch.zeros((num_layers, capacity, *conv_shape), dtype=dtype, device=device)
        self.recurrent = torch.zeros((num_layers, capacity, *recurrent_shape), dtype=torch.float32, device=device)
        self.slot_of: dict[int, int] = {}   # seq_id -> slot
        self.free_slots = list(range(capacity - 1, -1, -1))

    @classmethod
    def for_config(cls, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                   capacity: int = 4) -> "StatePool":
        shape = config.linear_attention
        assert shape is not None, "a state pool is for a model with linear-attention layers"
        return cls(len(config.linear_layers), (shape.conv_dim, shape.linear_conv_kernel_dim - 1),
                   (shape.linear_num_value_heads, shape.linear_key_head_dim, shape.linear_value_head_dim),
                   dtype, device, capacity)

    @property
    def capacity(self) -> int:
        return self.conv.shape[1]

    @property
    def slots_in_use(self) -> int:
        return len(self.slot_of)

    @property
    def bytes_per_slot(self) -> int:
        """One sequence's state, every linear layer."""
        return sum(t[:, 0].numel() * t.element_size() for t in (self.conv, self.recurrent))

    @property
    def bytes_in_use(self) -> int:
        return self.slots_in_use * self.bytes_per_slot

    @property
    def total_bytes(self) -> int:
        return self.capacity * self.bytes_per_slot

    def allocate(self, seq_id: int) -> int:
        """A zeroed slot for `seq_id`."""
        assert seq_id not in self.slot_of, f"sequence {seq_id} holds a state slot already"
        if not self.free_slots:
            self._grow()
        slot = self.free_slots.pop()
        self.conv[:, slot].zero_()
        self.recurrent[:, slot].zero_()
        self.slot_of[seq_id] = slot
        return slot

    def free(self, seq_id: int) -> None:
        """Gives back `seq_id`'s slot, if it holds one."""
        slot = self.slot_of.pop(seq_id, None)
        if slot is not None:
            self.free_slots.append(slot)

    def copy(self, src_seq_id: int, dst_seq_id: int, source: "StatePool | None" = None) -> None:
        """`dst_seq_id` (holding a slot) continues from the state of `src_seq_id` (in `source`, this pool if None)."""
        source = self if source is None else source
        src, dst = source.slot_of[src_seq_id], self.slot_of[dst_seq_id]
        self.conv[:, dst] = source.conv[:, src]
        self.recurrent[:, dst] = source.recurrent[:, src]

    def empty_like(self) -> "StatePool":
        """A pool of as many slots of the same shapes, none taken: the snapshots'
        (engine.linear_attention.snapshot_pool)."""
        return StatePool(self.conv.shape[0], tuple(self.conv.shape[2:]), tuple(self.recurrent.shape[2:]),
                         self.conv.dtype, self.conv.device, self.capacity)

    def for_step(self, seq_ids: list[int]) -> "StepStates":
        return StepStates(self, [self.slot_of[seq_id] for seq_id in seq_ids])

    def _grow(self) -> None:
        old = self.capacity
        self.conv = torch.cat((self.conv, torch.zeros_like(self.conv)), dim=1)
        self.recurrent = torch.cat((self.recurrent, torch.zeros_like(self.recurrent)), dim=1)
        self.free_slots = list(range(2 * old - 1, old - 1, -1)) + self.free_slots


class StepStates:
    """The slots of one step's sequences, in the step's order: what each linear layer reads and writes back."""

    def __init__(self, pool: StatePool, slots: list[int]):
        self.pool = pool
        self.slots = slots
        self.index = torch.tensor(slots, dtype=torch.long, device=pool.conv.device)

    def part(self, rows: slice) -> "StepStates":
        """The states of the step's sequences `rows` (a mixed step's decode rows, or its prompt rows)."""
        return StepStates(self.pool, self.slots[rows])

    def read(self, layer: int) -> list[LinearState]:
        conv, recurrent = self.pool.conv[layer], self.pool.recurrent[layer]
        return [LinearState(conv[slot], recurrent[slot]) for slot in self.slots]

    def write(self, layer: int, states: list[LinearState]) -> None:
        self.pool.conv[layer].index_copy_(0, self.index, torch.stack([s.conv for s in states]))
        self.pool.recurrent[layer].index_copy_(0, self.index, torch.stack([s.recurrent for s in states]))
