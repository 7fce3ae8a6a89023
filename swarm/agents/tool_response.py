"""The tokens that carry a turn's tool results back to the model, in its own chat format.

An agent's history only grows: after a turn the KV already holds everything the model wrote,
so the next tokens are exactly what the chat template would put after that assistant message:

    ...<|im_start|>assistant\\n<tool_call>{...}</tool_call><|im_end|>     <- in the KV already
    \\n<|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n                                                <- the continuation

The continuation is found by rendering a conversation whose assistant message is a sentinel
and taking everything after the sentinel; the end-of-turn token the model generated itself is
not repeated. Templates that know the `tool` role (they mention `tools`) render the results
their own way; others get them as a user message of `<tool_response>` blocks, the Hermes form.
"""
from __future__ import annotations

from engine import Tokenizer

SENTINEL = "SWARM-ASSISTANT-CONTENT-7f3a9c"


class ToolResponseFormat:
    def __init__(self, tokenizer: Tokenizer, tool_role: bool | None = None):
        self.tokenizer = tokenizer
        self.tool_role = tokenizer.supports_tools if tool_role is None else tool_role

    def continuation_text(self, results: list[str], end_token: int | None) -> str:
        """What follows the turn in the KV: the end of the assistant message (less the end token
        the model generated, `end_token`), the results, and the next assistant header."""
        messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                    {"role": "assistant", "content": SENTINEL}, *self.messages(results)]
        rendered = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        assert rendered.count(SENTINEL) == 1, "the chat template must render assistant content verbatim"
        text = rendered[rendered.index(SENTINEL) + len(SENTINEL):]
        generated_end = self._token_text(end_token)
        if generated_end and text.startswith(generated_end):
            text = text[len(generated_end):]
        return text

    def continuation_ids(self, results: list[str], end_token: int | None) -> list[int]:
        return self.tokenizer.encode(self.continuation_text(results, end_token))

    def messages(self, results: list[str]) -> list[dict]:
        if self.tool_role:
            return [{"role": "tool", "content": result} for result in results]
        blocks = "\n".join(f"<tool_response>\n{result}\n</tool_response>" for result in results)
        return [{"role": "user", "content": blocks}]

    def _token_text(self, token: int | None) -> str:
        if token is None:
            return ""
        return self.tokenizer.decode([token], skip_special_tokens=False)
