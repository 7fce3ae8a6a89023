"""Runs of the engine the tests share: random prompts, and requests stepped together with the logits each
token came from."""
import random

import torch

from engine import SamplingParams


def prompts_of(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 300) for _ in range(length)] for length in lengths]


def run_with_logits(engine, prompts: list[list[int]], params: SamplingParams):
    """Each prompt's greedy tokens and the logits they came from, all run together; and how many steps
    computed prompt tokens beside decode rows."""
    seqs = [engine.add_request(prompt, params) for prompt in prompts]
    logits = {seq.seq_id: [] for seq in seqs}
    mixed_steps = 0
    while not all(seq.is_finished for seq in seqs):
        decoding = [seq for seq in seqs if seq.num_output_tokens and not seq.is_finished]
        result = engine.step()
        mixed_steps += bool(result.prompt_tokens and decoding)
        for (seq, _), row in zip(result.new_tokens, result.logits if result.logits is not None else []):
            logits[seq.seq_id].append(row)
    for seq in seqs:
        engine.release(seq)
    return [(seq.output_token_ids, torch.stack(logits[seq.seq_id])) for seq in seqs], mixed_steps
