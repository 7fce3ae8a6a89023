"""The import layers, read from the source with `ast` (nothing is imported, so this runs in a second):

    swarm (the app) ──▶ engine ──▶ kernels
          └─────────────────────────▲      the app may use kernels' public API too

- kernels imports neither engine nor swarm, and engine never imports swarm;
- swarm reaches engine and kernels only through their public API: the packages themselves
  (`from engine import LLM, SamplingParams`), never one of their modules;
- no import cycle between the modules of one package (imports under TYPE_CHECKING and inside
  functions count: they are still arrows between two modules that know each other);
- inside swarm and kernels, sub-packages come in tiers (TIERS) and import only downwards:
  cli -> bench, server, run -> agents, trunk -> spec; cpu, triton -> reference, errors;
- a test module never imports another test module: what tests share lives in tests/helpers/ or in a
  conftest.py;
- swarm/ itself holds only __init__.py and __main__.py, and every package's __init__.py says in its
  docstring what it owns.

KNOWN lists what breaks a rule today, each with the step of issue 17 that removes it. A new
violation fails, and so does a KNOWN entry that no longer happens: delete it, the debt is paid.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("swarm", "engine", "kernels", "tests")
LAYERS = {"swarm": {"swarm", "engine", "kernels"}, "engine": {"engine", "kernels"}, "kernels": {"kernels"}}
PUBLIC_API = {"engine": {"engine"}, "kernels": {"kernels"}}   # the modules the app may import
SKIP = ("swarm/example_workspace",)   # the example project the agents work on, not swarm's code
TIERS = {   # inside a package: a sub-package imports its own tier or those below it, never one above
    "swarm": [{"__main__", "cli"}, {"bench", "server", "run"}, {"agents", "trunk"}, {"spec"}],
    "kernels": [{"cpu", "triton"}, {"reference", "errors"}],
}

# (importer, imported) pairs, by rule, that break a rule for now: each with a comment saying what
# removes it. Issue 17 paid every debt it listed; a new entry needs a reason and a plan.
KNOWN = {
    "layers": set(),
    "public_api": set(),
    "tiers": set(),
    "cycles": set(),
    "test_imports": set(),
}


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    imported: str
    where: str          # path:line, for the message

    @property
    def pair(self) -> tuple[str, str]:
        return self.importer, self.imported


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "__pycache__" not in relative and not relative.startswith(SKIP):
                files[module_name(path)] = path
    return files


MODULES = source_files()


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def resolve(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The project's modules an import statement names (third-party ones are left out)."""
    if isinstance(node, ast.Import):
        return [_known_prefix(alias.name) for alias in node.names if _known_prefix(alias.name)]
    base = node.module or ""
    if node.level:   # relative: from the importer's package
        package = importer if is_package(importer) else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}".strip(".")
    found = []
    for alias in node.names:
        if f"{base}.{alias.name}" in MODULES:
            found.append(f"{base}.{alias.name}")
        elif _known_prefix(base):
            found.append(_known_prefix(base))
    return found


def _known_prefix(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports() -> list[Import]:
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                where = f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"
                found += [Import(module, target, where) for target in resolve(node, module) if target != module]
    return found


IMPORTS = imports()


def top(module: str) -> str:
    return module.split(".")[0]


def check(rule: str, violations: list[Import]) -> None:
    pairs = {v.pair for v in violations}
    new = sorted({f"{v.where}: {v.importer} imports {v.imported}    {v.pair!r}," for v in violations
                  if v.pair not in KNOWN[rule]})
    stale = sorted(f"{a} -> {b}" for a, b in KNOWN[rule] - pairs)
    message = []
    if new:
        message.append("new violations (the pair at the end of each line is its KNOWN entry, if it must wait):\n  "
                       + "\n  ".join(new))
    if stale:
        message.append("KNOWN entries that no longer happen (delete them from KNOWN):\n  " + "\n  ".join(stale))
    assert not message, f"{rule}: " + "\n".join(message)


def test_kernels_import_neither_engine_nor_swarm_and_engine_never_swarm():
    check("layers", [i for i in IMPORTS if top(i.importer) in LAYERS and top(i.imported) in PACKAGES
                     and top(i.imported) not in LAYERS[top(i.importer)]])


def test_the_app_reaches_engine_and_kernels_only_through_their_public_api():
    check("public_api", [i for i in IMPORTS if top(i.importer) == "swarm" and top(i.imported) in PUBLIC_API
                         and i.imported not in PUBLIC_API[top(i.imported)]])


def tier(module: str) -> int | None:
    package, _, rest = module.partition(".")
    name = rest.split(".")[0]
    return next((i for i, names in enumerate(TIERS.get(package, ())) if name in names), None)


def test_sub_packages_import_only_their_own_tier_or_below():
    check("tiers", [i for i in IMPORTS if top(i.importer) == top(i.imported) in TIERS
                    and None not in (tier(i.importer), tier(i.imported)) and tier(i.imported) < tier(i.importer)])


def test_every_sub_package_has_a_tier():
    untiered = sorted({m for m in MODULES if top(m) in TIERS and m.count(".") and tier(m) is None})
    assert not untiered, f"place these in TIERS: {untiered}"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a path."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_cycle_through(component, edges) for component in components]


def _cycle_through(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest cycle from the component's first module back to it, inside the component."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges.get(node, ())):
                if nxt == start:
                    return paths[node] + [start]
                if nxt in members and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_no_import_cycle_between_the_modules_of_one_package():
    found, where = [], {}
    for package in PACKAGES:
        edges: dict[str, set[str]] = defaultdict(set)
        for i in IMPORTS:
            if top(i.importer) == package and top(i.imported) == package and not is_package(i.imported):
                edges[i.importer].add(i.imported)
                where.setdefault(i.pair, i.where)
        found += cycles(edges)
    known = {frozenset(pair) for pair in KNOWN["cycles"]}
    new = [" -> ".join(c) + "  (" + ", ".join(where[pair] for pair in zip(c, c[1:])) + ")"
           for c in found if frozenset(c[:-1]) not in known]
    stale = sorted(" <-> ".join(sorted(k)) for k in known - {frozenset(c[:-1]) for c in found})
    assert not new, "import cycles:\n  " + "\n  ".join(new)
    assert not stale, "KNOWN cycles that no longer happen (delete them from KNOWN):\n  " + "\n  ".join(stale)


def is_test_module(module: str) -> bool:
    return top(module) == "tests" and module.rpartition(".")[2].startswith("test_")


def test_no_test_module_imports_another_and_helpers_live_in_tests_helpers():
    shared = ("tests.helpers",)
    check("test_imports", [i for i in IMPORTS if top(i.importer) == "tests" and top(i.imported) == "tests"
                           and not is_package(i.imported) and not i.imported.endswith(".conftest")
                           and (is_test_module(i.imported) or not i.imported.startswith(shared))])


def test_swarm_holds_only_its_entry_points_at_its_root():
    assert sorted(p.name for p in (ROOT / "swarm").glob("*.py")) == ["__init__.py", "__main__.py"]


@pytest.mark.parametrize("package", sorted(m for m in MODULES if is_package(m) and top(m) != "tests"))
def test_every_package_says_what_it_owns(package):
    tree = ast.parse(MODULES[package].read_text(encoding="utf-8"))
    assert ast.get_docstring(tree), f"{MODULES[package].relative_to(ROOT)} needs a docstring: what does it own?"
