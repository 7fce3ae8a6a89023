from engine.loading.tokenizer import Tokenizer
from swarm.agents.tool_response import ToolResponseFormat
from tests.helpers.runs import EOS_ID, tiny_tokenizer

# Qwen2.5's way with tool messages: consecutive results share one user turn.
TOOL_ROLE_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    "{#- tools are rendered by the caller -#}")


def tool_role_tokenizer() -> Tokenizer:
    base = tiny_tokenizer()
    return Tokenizer(base.backend, TOOL_ROLE_TEMPLATE, bos_token="<s>", eos_token="<|im_end|>")


def test_template_without_tool_role_gets_hermes_tool_response_in_a_user_turn():
    responses = ToolResponseFormat(tiny_tokenizer())
    assert not responses.tool_role
    text = responses.continuation_text(["file contents"], end_token=EOS_ID)
    assert text == ("\n<|im_start|>user\n<tool_response>\nfile contents\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_turn_cut_by_a_stop_string_gets_the_end_of_turn_token_appended():
    text = ToolResponseFormat(tiny_tokenizer()).continuation_text(["x"], end_token=None)
    assert text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nx\n")


def test_template_with_tool_role_renders_results_its_own_way():
    responses = ToolResponseFormat(tool_role_tokenizer())
    assert responses.tool_role
    text = responses.continuation_text(["a", "b"], end_token=EOS_ID)
    assert text == ("\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n"
                    "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_history_plus_continuations_is_the_template_rendering_of_the_whole_conversation():
    tokenizer = tiny_tokenizer()
    responses = ToolResponseFormat(tokenizer)
    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": "task"}]
    history = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    for reply, result in (("<tool_call>{}</tool_call>", "one"), ("again", "two")):
        history += reply + "<|im_end|>"  # what the model wrote, ending with its EOS token
        history += responses.continuation_text([result], end_token=EOS_ID)
        messages += [{"role": "assistant", "content": reply}, *responses.messages([result])]
    assert history == tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def test_continuation_ids_are_the_tokens_of_the_text_with_special_tokens_recognised():
    tokenizer = tiny_tokenizer()
    ids = ToolResponseFormat(tokenizer).continuation_ids(["ok"], end_token=EOS_ID)
    assert tokenizer.decode(ids, skip_special_tokens=False).startswith("\n<|im_start|>user")
    assert ids.count(EOS_ID) == 1  # the result's own end of turn, not the model's again
