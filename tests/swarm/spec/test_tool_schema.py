import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarm.spec.tool_schema import canonical_json, canonical_tools, normalize_tool

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read.",
                                      "parameters": {"type": "object", "required": ["path", "end"],
                                                     "properties": {"path": {"type": "string"},
                                                                    "end": {"type": "integer"}}}}},
    {"name": "search", "description": "Search.", "parameters": {"type": "object", "properties": {}}},
    {"function": {"parameters": {"properties": {}, "type": "object"}, "name": "list_dir"}, "type": "function"},
]


def _reorder(value, reverse: bool):
    if isinstance(value, dict):
        keys = sorted(value, reverse=reverse)
        return {k: _reorder(value[k], reverse) for k in keys}
    return value


@given(st.permutations(TOOLS), st.booleans())
def test_order_and_key_order_never_change_the_bytes(tools, reverse):
    shuffled = [json.loads(json.dumps(_reorder(t, reverse))) for t in tools]
    assert [canonical_json(t) for t in canonical_tools(shuffled)] == [canonical_json(t) for t in canonical_tools(TOOLS)]


def test_canonical_form_is_the_openai_function_format_with_sorted_keys():
    tool = normalize_tool(TOOLS[0])
    assert list(tool) == ["function", "type"]
    assert tool["function"]["parameters"]["required"] == ["end", "path"]
    assert canonical_json(tool).startswith('{"function": {"description": "Read.", "name": "read_file"')
    assert [t["function"]["name"] for t in canonical_tools(TOOLS)] == ["list_dir", "read_file", "search"]


@pytest.mark.parametrize("tool, words", [
    ("read_file", "must be a mapping"),
    ({"type": "retrieval", "function": {"name": "x"}}, "type must be 'function'"),
    ({"name": "has space"}, "must be 1-64 letters"),
    ({"name": "x", "params": {}}, "unknown keys ['params']"),
    ({"name": "x", "parameters": {"type": "array"}}, "type 'object'"),
    ({"name": "x", "description": 3}, "description must be a string"),
])
def test_malformed_tools_say_what_is_wrong(tool, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        normalize_tool(tool)


def test_a_tool_defined_twice_is_refused():
    with pytest.raises(ValueError, match="'search' is defined twice"):
        canonical_tools([TOOLS[1], TOOLS[1]])
