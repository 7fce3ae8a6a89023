"""The search tool's work: the lines of a workspace's files that match a pattern.

Bounded in time, memory and reach:
- patterns run on the `regex` engine, not `re`: it takes a timeout and lets go of the GIL while
  it matches a str, so a catastrophic pattern ((a+)+$ and kin) ends with an error after
  SEARCH_TIME_LIMIT seconds instead of freezing the engine loop, the wall-time clock and Ctrl-C;
- files are streamed line by line (swarm/agents/bounded_read.py), and at most MAX_SEARCH_HITS hits kept;
- folders are walked by descriptor (os.fwalk from the workspace's descriptor of the base), so a
  link swapped in during the walk is never followed; symlinks, FIFOs and devices are skipped.
"""
from __future__ import annotations

import os
import stat
import time
from contextlib import closing
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator

import regex

from swarm.agents.bounded_read import Line, is_binary, text_lines
from swarm.agents.workspace import ToolError, Workspace

SKIPPED_DIRS = {".git", "__pycache__", ".hypothesis", ".pytest_cache"}
MAX_SEARCH_LINE_CHARS = 300
MAX_SEARCH_HITS = 1000
SEARCH_TIME_LIMIT = 10.0  # seconds of matching one search may spend, all files together


def compile_pattern(pattern: str) -> regex.Pattern:
    try:
        return regex.compile(pattern)
    except regex.error as err:
        raise ToolError(f"pattern {pattern!r} is not a valid Python regular expression: {err}") from None


def matching_lines(workspace: Workspace, pattern: regex.Pattern, base: Path, glob: str | None) -> list[str]:
    """`path:line: text` for each matching line at or under `base` (a path from resolve)."""
    deadline = time.monotonic() + SEARCH_TIME_LIMIT
    hits: list[str] = []
    with closing(_files_under(workspace, base, glob)) as files:  # closes the walk's descriptors at once
        for shown, file in files:
            with file:
                hits += (f"{shown}:{line.number}: {_clip(line.text)}"
                         for line in _matching(file, pattern, deadline, MAX_SEARCH_HITS - len(hits)))
            if len(hits) >= MAX_SEARCH_HITS:
                hits.append(f"[stopped after {MAX_SEARCH_HITS} matches; narrow the search with a more specific "
                            "pattern, a path or a glob]")
                break
    return hits


def _files_under(workspace: Workspace, base: Path, glob: str | None) -> Iterator[tuple[str, BinaryIO]]:
    if not base.is_dir():
        if _glob_matches(workspace.relative(base), glob):
            yield workspace.relative(base), workspace.open_file(base)
        return
    folder = workspace.open_directory(base)
    try:
        for directory, subdirectories, names, directory_fd in os.fwalk(".", dir_fd=folder):
            subdirectories[:] = sorted(name for name in subdirectories if name not in SKIPPED_DIRS)
            for name in sorted(names):
                shown = PurePosixPath(workspace.relative(base), directory, name).as_posix()
                if _glob_matches(shown, glob) and (file := _open_regular_file(directory_fd, name)):
                    yield shown, file
    finally:
        os.close(folder)


def _open_regular_file(directory_fd: int, name: str) -> BinaryIO | None:
    """The file, if it is a regular one: anything else (a FIFO, a device) is not even opened."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode):
            return None
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=directory_fd)
    except OSError:  # swapped for a symlink since (O_NOFOLLOW), or gone, or unreadable
        return None
    file = os.fdopen(descriptor, "rb")
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        file.close()
        return None
    return file


def _glob_matches(relative_path: str, glob: str | None) -> bool:
    if not glob:
        return True
    name = PurePosixPath(relative_path).name
    return any(fnmatch(candidate, pattern) for candidate in (relative_path, name)
               for pattern in (glob, glob.removeprefix("**/")))


def _matching(file: BinaryIO, pattern: regex.Pattern, deadline: float, limit: int) -> Iterator[Line]:
    if is_binary(file):
        return
    for line in text_lines(file):
        if limit <= 0:
            return
        if _matches(pattern, line.text, deadline):
            limit -= 1
            yield line


def _matches(pattern: regex.Pattern, text: str, deadline: float) -> bool:
    try:
        return pattern.search(text, timeout=max(0.0, deadline - time.monotonic())) is not None
    except TimeoutError:
        raise ToolError(f"search stopped after {SEARCH_TIME_LIMIT:g} s: the pattern {pattern.pattern!r} took "
                        "too long; simplify it (nested repeats such as (a+)+ can take for ever) or narrow the "
                        "search with a path or a glob") from None


def _clip(line: str) -> str:
    line = line.strip()
    return line if len(line) <= MAX_SEARCH_LINE_CHARS else line[:MAX_SEARCH_LINE_CHARS] + " ..."
