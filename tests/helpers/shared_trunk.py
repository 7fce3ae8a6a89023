"""The check that sharing a trunk changes memory, never output, on a real chat model: eight agents'
prompts (one system-prompt trunk that ends inside a KV block, then a task each) give the same
greedy tokens with prefix sharing on, off, and one request at a time."""
from __future__ import annotations

import random

from engine import LLM, SamplingParams

TASKS = ["Fix the failing test.", "Explain the parser.", "Add type hints.", "Rename the module.",
         "Write a docstring.", "Find the bug in main.", "Speed up the loop.", "Review the README."]


def agent_prompts(llm: LLM) -> tuple[list[int], list[list[int]]]:
    """(the trunk, each agent's whole prompt) in the model's chat format."""
    tokenizer = llm.tokenizer
    trunk = tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are a careful coding agent. " * 12}], add_generation_prompt=False))
    assert len(trunk) % 16 != 0   # the trunk ends inside a block: the partly filled block is shared too
    return trunk, [trunk + tokenizer.encode(f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n")
                   for t in TASKS]


def assert_sharing_changes_no_output(shared: LLM, unshared: LLM, max_tokens: int, alone: int) -> None:
    """`unshared` is the same model with enable_prefix_caching=False; `alone` prompts also run by
    themselves there."""
    trunk, prompts = agent_prompts(shared)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    together = shared.generate(prompts, params)
    by_themselves = [unshared.generate([p], params)[0] for p in prompts[:alone]]
    unshared_together = unshared.generate(prompts, params)
    assert [o.token_ids for o in together] == [o.token_ids for o in unshared_together]
    assert [o.token_ids for o in together[:alone]] == [o.token_ids for o in by_themselves]
    assert all(o.num_cached_tokens >= len(trunk) for o in together[1:])


def swarm_prompts(trunk_len: int, suffix_len: int, agents: int = 8, seed: int = 0):
    """A shared trunk of random token ids, then suffixes that differ from their first token on."""
    rng = random.Random(seed)
    trunk = [rng.randrange(4, 300) for _ in range(trunk_len)]
    return trunk, [trunk + [10 + i] + [rng.randrange(4, 300) for _ in range(suffix_len - 1)]
                   for i in range(agents)]
