import json

from hypothesis import given
from hypothesis import strategies as st

from swarm.agents.tool_calls import ToolCall, parse_tool_calls


def test_hermes_call_is_parsed_and_prose_kept_as_content():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    result = parse_tool_calls(text)
    assert result.calls == [ToolCall("read_file", {"path": "a.py"}, result.calls[0].raw)]
    assert result.calls[0].raw.startswith("<tool_call>") and result.calls[0].raw.endswith("</tool_call>")
    assert result.errors == []
    assert result.content == "Let me look."


def test_several_hermes_calls_keep_their_order():
    text = ('<tool_call>{"name": "list_dir", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": {"pattern": "x"}}</tool_call>')
    result = parse_tool_calls(text)
    assert [call.name for call in result.calls] == ["list_dir", "search"]
    assert result.calls[1].arguments == {"pattern": "x"}
    assert result.content == ""


def test_arguments_given_as_a_json_string_are_decoded():
    text = '<tool_call>{"name": "read_file", "arguments": "{\\"path\\": \\"b.py\\"}"}</tool_call>'
    assert parse_tool_calls(text).calls[0].arguments == {"path": "b.py"}


def test_missing_closing_tag_at_end_of_text_is_tolerated():
    result = parse_tool_calls('ok <tool_call>{"name": "list_dir", "arguments": {"path": "src"}}')
    assert result.calls[0].arguments == {"path": "src"}
    assert result.content == "ok"


def test_missing_closing_tag_before_the_next_call_is_tolerated():
    text = ('<tool_call>{"name": "list_dir", "arguments": {}}\n'
            '<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>')
    assert [call.name for call in parse_tool_calls(text).calls] == ["list_dir", "read_file"]


def test_one_extra_closing_brace_is_tolerated():
    result = parse_tool_calls('<tool_call>{"name": "list_dir", "arguments": {}}}</tool_call>')
    assert result.calls[0].name == "list_dir" and result.errors == []


def test_bad_json_in_a_tagged_call_is_an_error_not_an_exception():
    text = ('<tool_call>{"name": "read_file", "arguments": {"path": "a.py"</tool_call>'
            '<tool_call>{"name": "list_dir", "arguments": {}}</tool_call>')
    result = parse_tool_calls(text)
    assert [call.name for call in result.calls] == ["list_dir"]
    assert len(result.errors) == 1
    assert "tool call 1" in result.errors[0] and "invalid" in result.errors[0]
    assert '<tool_call>{"name"' in result.errors[0]  # shows the model the right form


def test_tagged_call_without_a_name_is_an_error():
    result = parse_tool_calls('<tool_call>{"arguments": {"path": "a"}}</tool_call>')
    assert result.calls == [] and '"name"' in result.errors[0]


def test_arguments_that_are_not_an_object_are_an_error():
    result = parse_tool_calls('<tool_call>{"name": "read_file", "arguments": ["a.py"]}</tool_call>')
    assert result.calls == [] and "must be a JSON object, not a list" in result.errors[0]


def test_empty_tagged_call_is_an_error():
    result = parse_tool_calls("<tool_call></tool_call>")
    assert result.calls == [] and "empty" in result.errors[0]


def test_tagged_call_without_arguments_gets_empty_arguments():
    assert parse_tool_calls('<tool_call>{"name": "list_dir"}</tool_call>').calls[0].arguments == {}


def test_bare_json_reply_is_a_call():
    result = parse_tool_calls('  {"name": "search", "arguments": {"pattern": "def "}}\n')
    assert result.calls[0].name == "search" and result.calls[0].arguments == {"pattern": "def "}
    assert result.content == "" and result.errors == []


def test_bare_json_in_a_fence_with_parameters_key_is_a_call():
    result = parse_tool_calls('```json\n{"name": "read_file", "parameters": {"path": "x.py"}}\n```')
    assert result.calls[0].arguments == {"path": "x.py"}


def test_openai_function_shape_is_a_call():
    text = '{"type": "function", "function": {"name": "list_dir", "arguments": "{}"}}'
    assert parse_tool_calls(text).calls[0].name == "list_dir"


def test_prose_reply_is_a_final_answer():
    result = parse_tool_calls("I changed parse() in a.py; all tests pass.")
    assert result.calls == [] and result.errors == []
    assert result.content == "I changed parse() in a.py; all tests pass."


def test_json_reply_that_is_not_a_call_is_content():
    result = parse_tool_calls('{"verdict": "approve", "name": "review"}')
    assert result.calls == [] and result.errors == []
    assert result.content == '{"verdict": "approve", "name": "review"}'


def test_broken_bare_json_that_looks_like_a_call_is_an_error():
    result = parse_tool_calls('{"name": "read_file", "arguments": {"path": "a.py"')
    assert result.calls == [] and len(result.errors) == 1


def test_bare_call_followed_by_prose_is_an_error_explaining_the_extra_text():
    result = parse_tool_calls('{"name": "list_dir", "arguments": {}} and then I will read it')
    assert result.calls == [] and "extra text" in result.errors[0]


@given(st.text())
def test_any_text_parses_without_raising(text):
    result = parse_tool_calls(text)
    assert all(isinstance(call.arguments, dict) for call in result.calls)


@given(st.text(), st.dictionaries(st.text(), st.integers() | st.text()))
def test_tagged_calls_round_trip(name_suffix, arguments):
    name = "tool" + "".join(ch for ch in name_suffix if ch.isalnum())
    payload = json.dumps({"name": name, "arguments": arguments})
    result = parse_tool_calls(f"thinking\n<tool_call>{payload}</tool_call>")
    assert result.calls[0].name == name and result.calls[0].arguments == arguments
