"""An agent's workspace: the one directory its tools may touch.

`prepare_workspace` gives each agent its workspace, either its own copy of the source tree
("copy") or the source tree itself, read-only ("shared-readonly"). `Workspace.resolve` is the
gate every path from the model goes through: after symlinks are followed, the path must still
lie under the root.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from engine.errors import SpecError

WORKSPACE_MODES = ("copy", "shared-readonly")


class ToolError(Exception):
    """A tool call that failed; the message is shown to the model and says what to change."""


class Workspace:
    """The directory an agent may touch. Paths the model gives are relative to `root`."""

    def __init__(self, root: str | os.PathLike, read_only: bool = False):
        self.root = Path(os.path.realpath(root))
        self.read_only = read_only
        if not self.root.is_dir():
            raise NotADirectoryError(f"workspace root {root} is not a directory")

    def resolve(self, relative_path: str) -> Path:
        """The real path `relative_path` names once symlinks are followed; never outside root."""
        shown = repr(relative_path)
        if "\x00" in relative_path:
            raise ToolError(f"path {shown} contains a NUL character; use a plain relative path")
        if os.path.isabs(relative_path) or relative_path.startswith("~"):
            raise ToolError(f"path {shown} is absolute; use a path relative to the workspace root")
        resolved = Path(os.path.realpath(self.root / relative_path))
        if os.path.realpath(resolved) != str(resolved):  # realpath gives up at a link loop, joining the rest unresolved
            raise ToolError(f"path {shown} goes through a symbolic link loop; use a path without it")
        if self.contains(resolved):
            return resolved
        if ".." in PurePosixPath(relative_path).parts:
            raise ToolError(f"path {shown} leaves the workspace; use a path relative to the workspace root")
        raise ToolError(f"path {shown} goes through a symbolic link that points outside the workspace; "
                        "only files inside the workspace can be used")

    def contains(self, real_path: Path) -> bool:
        return real_path.is_relative_to(self.root)

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def require_writable(self) -> None:
        if self.read_only:
            raise ToolError("this workspace is read-only; you can list, read and search files but not change them")


def prepare_workspace(source_dir: str | os.PathLike, dest_dir: str | os.PathLike | None,
                      mode: str) -> Workspace:
    """One agent's workspace. In "copy" mode `dest_dir` receives its private copy of the source;
    in "shared-readonly" mode `dest_dir` is unused and the source is used in place."""
    source = Path(source_dir)
    if not source.is_dir():
        raise SpecError(f"workspace source {source} is not a directory; point it at the project to work on")
    if mode == "shared-readonly":
        return Workspace(source, read_only=True)
    if mode != "copy":
        raise SpecError(f"unknown workspace mode {mode!r}; use one of: {', '.join(WORKSPACE_MODES)}")
    if dest_dir is None:
        raise SpecError('workspace mode "copy" needs a destination directory for the agent\'s copy')
    return Workspace(_copy_tree(source, Path(dest_dir)))


def _copy_tree(source: Path, dest: Path) -> Path:
    if dest.resolve().is_relative_to(source.resolve()):
        raise SpecError(f"workspace copy {dest} lies inside its source {source}; put agent copies elsewhere")
    if dest.exists() and any(dest.iterdir()):
        raise SpecError(f"workspace copy {dest} already exists and is not empty; remove it or choose another")
    # symlinks=True keeps links as links: a link leading outside stays refused by resolve()
    # instead of its target's contents being copied into the workspace.
    shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    return dest
