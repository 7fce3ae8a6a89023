"""Read a YAML file as nodes, so every error can name the file, the line and the key.

Each check returns a plain Python value or raises `SpecError` with one line:

    swarm.yaml:12: sampling.temprature: unknown key; did you mean 'temperature'?
"""
from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Iterable

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from engine import SpecError

MAX_EXPANDED_VALUES = 100_000
"""Values a spec may hold once its YAML aliases are expanded: far more than any real spec holds,
far fewer than a "billion laughs" bomb, whose ten lines expand to 10^9."""
MAX_NESTING = 64
_NOT_FINITE = {"nan", ".nan", "inf", "+inf", "-inf", ".inf", "-.inf", "infinity", "-infinity"}
_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          list: "a list", dict: "a mapping"}


class SpecReader:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.display = str(path)

    def load(self) -> MappingNode:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            raise SpecError(f"{self.display}: no such file; write one from swarm.yaml.example") from None
        except (OSError, UnicodeDecodeError) as err:
            raise SpecError(f"{self.display}: cannot read the file ({_one_line(err)})") from None
        root = self.compose(text)
        if root is None:
            raise SpecError(f"{self.display}:1: the file is empty; it needs at least model: and agents:")
        if not isinstance(root, MappingNode):
            raise self.fail(root, "(top level)", "expected a mapping of keys like model:, agents:")
        return root

    def compose(self, text: str) -> Node | None:
        """The YAML's nodes (None for an empty file), refusing what would take unbounded time or
        memory to build into values."""
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except RecursionError:
            raise SpecError(f"{self.display}:1: broken YAML: nested too deeply; flatten it") from None
        except yaml.MarkedYAMLError as err:
            raise SpecError(self._syntax_error(err)) from None
        except yaml.YAMLError as err:
            raise SpecError(f"{self.display}:1: broken YAML: {_one_line(err)}") from None
        if root is not None:
            self._refuse_alias_bombs(root)
        return root

    def fail(self, node: Node, key: str, message: str) -> SpecError:
        return SpecError(f"{self.display}:{line_of(node)}: {key}: {_one_line(message)}")

    def mapping(self, node: Node, key: str, allowed: Iterable[str],
                required: Iterable[str] = ()) -> dict[str, Node]:
        """The value nodes of a mapping, after rejecting unknown, duplicate and missing keys."""
        if not isinstance(node, MappingNode):
            raise self.fail(node, key, f"expected a mapping, got {describe(node)}")
        allowed = list(allowed)
        found: dict[str, Node] = {}
        for key_node, value_node in node.value:
            name = str(key_node.value)
            path = join(key, name)
            if name not in allowed:
                raise self.fail(key_node, path, "unknown key" + did_you_mean(name, allowed))
            if name in found:
                raise self.fail(key_node, path, "duplicate key; keep only one")
            found[name] = value_node
        for name in required:
            if name not in found:
                raise self.fail(node, join(key, name), "missing required key")
        return found

    def value(self, node: Node, key: str):
        try:
            return SafeConstructor().construct_object(node, deep=True)
        except ConstructorError as err:
            raise self.fail(node, key, f"cannot read the value ({err.problem})") from None

    def typed(self, node: Node, key: str, kind: type | tuple[type, ...]):
        """A value of `kind`; an int is accepted as a float, a bool never as a number."""
        value = self.value(node, key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if (int in kinds or float in kinds) and _not_finite(value):
            raise self.fail(node, key, f"expected a finite number, got {node.value!r}")
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, bool) and bool not in kinds:
            raise self.fail(node, key, f"expected {_expected(kinds)}, got {describe(node)}")
        if not isinstance(value, kinds):
            raise self.fail(node, key, f"expected {_expected(kinds)}, got {describe(node)}")
        return value

    def number(self, node: Node, key: str, kind: type, minimum=None, maximum=None):
        value = self.typed(node, key, kind)
        if minimum is not None and value < minimum:
            raise self.fail(node, key, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(node, key, f"must be at most {maximum}, got {value}")
        return value

    def choice(self, node: Node, key: str, choices: Iterable[str]) -> str:
        value = self.typed(node, key, str)
        choices = list(choices)
        if value not in choices:
            raise self.fail(node, key, f"{value!r} is not one of {', '.join(choices)}"
                            + did_you_mean(value, choices))
        return value

    def sequence(self, node: Node, key: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self.fail(node, key, f"expected a list, got {describe(node)}")
        return list(node.value)

    def _refuse_alias_bombs(self, root: Node) -> None:
        """Aliases (*name) share nodes, so a few lines can stand for 10^9 values that a later
        walk over the value would take hours and gigabytes to expand; refuse them here."""
        sizes = _ExpandedSizes(self)
        if sizes.of(root, "(top level)") <= MAX_EXPANDED_VALUES:
            return
        node, key = root, "(top level)"
        while bigger := [(c, k) for c, k in _children(node, key) if sizes.of(c, k) > MAX_EXPANDED_VALUES]:
            node, key = bigger[0]
        raise self.fail(node, key, f"expands to more than {MAX_EXPANDED_VALUES:,} values through YAML aliases "
                                   "(*name); write the values out instead")

    def _syntax_error(self, err: yaml.MarkedYAMLError) -> str:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark else 1
        column = f" (column {mark.column + 1})" if mark else ""
        problem = err.problem or err.context or "cannot parse"
        return f"{self.display}:{line}: broken YAML: {_one_line(problem)}{column}"


class _ExpandedSizes:
    """How many values each node holds with every alias expanded, counted once per node. Nesting
    is bounded too: building a value nested hundreds of levels deep overflows Python's stack."""

    def __init__(self, reader: SpecReader):
        self.reader = reader
        self.sizes: dict[int, int] = {}
        self.open: set[int] = set()

    def of(self, node: Node, key: str, depth: int = 0) -> int:
        if id(node) in self.sizes:
            return self.sizes[id(node)]
        if id(node) in self.open:
            raise self.reader.fail(node, key, "holds itself through a YAML alias (*name); write the value out")
        if depth > MAX_NESTING:
            shown = key if len(key) <= 60 else f"{key[:57]}..."
            raise self.reader.fail(node, shown, f"nested more than {MAX_NESTING} levels deep; flatten it")
        self.open.add(id(node))
        size = 1 + sum(self.of(child, child_key, depth + 1) for child, child_key in _children(node, key))
        self.open.discard(id(node))
        self.sizes[id(node)] = size
        return size


def _children(node: Node, key: str) -> list[tuple[Node, str]]:
    if isinstance(node, SequenceNode):
        return [(item, f"{key}[{i}]") for i, item in enumerate(node.value)]
    if isinstance(node, MappingNode):
        return [(part, join(key, str(name.value))) for name, value in node.value for part in (name, value)]
    return []


def _not_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, str) and value.strip().lower() in _NOT_FINITE


def line_of(node: Node) -> int:
    return node.start_mark.line + 1


def end_line_of(node: Node) -> int:
    """The last line that holds part of `node` (YAML end marks point past the value)."""
    end = node.end_mark
    return end.line + 1 if end.column > 0 or end.line == node.start_mark.line else end.line


def join(parent: str, child: str) -> str:
    return child if parent in ("", "(top level)") else f"{parent}.{child}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(choices)}"


def describe(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, ScalarNode):
        kind = node.tag.rsplit(":", 1)[-1]
        names = {"int": "an integer", "float": "a number", "bool": "a boolean", "null": "nothing",
                 "str": "a string"}
        shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
        return f"{names.get(kind, kind)} {shown!r}" if kind != "null" else "nothing"
    return "something else"


def _expected(kinds: tuple[type, ...]) -> str:
    return " or ".join(_NAMES.get(k, k.__name__) for k in kinds if k is not type(None))


def _one_line(message) -> str:
    return " ".join(str(message).split())
