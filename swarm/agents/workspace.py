"""An agent's workspace: the one directory its tools may touch.

`prepare_workspace` gives each agent its workspace, either its own copy of the source tree
("copy") or the source tree itself, read-only ("shared-readonly"). `Workspace.resolve` is the
gate every path from the model goes through: after symlinks are followed, the path must still
lie under the root.

A checked path is then opened from a descriptor of the root, one component at a time with
O_NOFOLLOW (openat-style): `resolve` already followed every link, so a link met on the way was
swapped in after the check and is refused instead of being followed out of the workspace.
Only regular files and folders are opened; a FIFO, socket or device is refused before opening,
and files open with O_NONBLOCK so that a swap to a FIFO cannot hang the open either.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from engine import SpecError
from swarm.spec.schema import WORKSPACE_MODES

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KINDS = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFLNK: "a symbolic link"}


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
        _refuse_link_loops(resolved, shown)
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

    def open_directory(self, real_path: Path) -> int:
        """A descriptor of the folder at `real_path` (a path from `resolve`), reached from the
        root without following a link. The caller closes it."""
        return self._walk(real_path, self._parts(real_path), create=False)

    def open_file(self, real_path: Path, write: bool = False) -> BinaryIO:
        """The regular file at `real_path` (a path from `resolve`), opened beneath the root
        without following a link. Writing creates it and missing folders, and empties it."""
        *folders, name = self._parts(real_path) or [""]
        if not name:
            raise ToolError(f"{self.relative(real_path)!r} is a directory, not a file")
        parent = self._walk(real_path, folders, create=write)
        try:
            descriptor = _open_regular(parent, name, self.relative(real_path), write)
        finally:
            os.close(parent)
        return os.fdopen(descriptor, "wb" if write else "rb")

    def _parts(self, real_path: Path) -> list[str]:
        assert self.contains(real_path), f"{real_path} was not checked by resolve()"
        return list(real_path.relative_to(self.root).parts)

    def _walk(self, real_path: Path, folders: list[str], create: bool) -> int:
        descriptor = os.open(self.root, _DIRECTORY_FLAGS)
        try:
            for name in folders:
                if create:
                    _make_folder(descriptor, name)
                step = _open_folder(descriptor, name, self.relative(real_path))
                os.close(descriptor)
                descriptor = step
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor


def _refuse_link_loops(resolved: Path, shown: str) -> None:
    # realpath gives up at a loop and returns the rest unresolved, which the second call then shows
    loops = _stat_errno(resolved) == errno.ELOOP
    if loops or os.path.realpath(resolved) != str(resolved):
        what = "is" if loops and os.path.islink(resolved) else "goes through"
        raise ToolError(f"path {shown} {what} a symlink loop (a symbolic link that leads back to itself); "
                        "use a path without it")


def _stat_errno(path: Path) -> int:
    try:
        os.stat(path)
    except OSError as err:
        return err.errno
    return 0


def _make_folder(folder: int, name: str) -> None:
    try:
        os.mkdir(name, dir_fd=folder)
    except FileExistsError:
        pass


def _open_folder(folder: int, name: str, shown: str) -> int:
    try:
        return os.open(name, _DIRECTORY_FLAGS, dir_fd=folder)
    except NotADirectoryError:
        if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            raise _swapped_link(shown) from None
        raise


def _open_regular(folder: int, name: str, shown: str, write: bool) -> int:
    try:
        _require_regular(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode, shown)
    except FileNotFoundError:
        if not write:
            raise ToolError(f"{shown!r} does not exist; use list_dir to see what is there") from None
    flags = _FILE_FLAGS | (os.O_WRONLY | os.O_CREAT if write else os.O_RDONLY)
    try:
        descriptor = os.open(name, flags, 0o666, dir_fd=folder)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _swapped_link(shown) from None
        raise
    try:
        _require_regular(os.fstat(descriptor).st_mode, shown)
        if write:
            os.ftruncate(descriptor, 0)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _require_regular(mode: int, shown: str) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise ToolError(f"{shown!r} is a directory, not a file")
    if stat.S_ISLNK(mode):
        raise _swapped_link(shown)
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    raise ToolError(f"{shown!r} is {kind}; only regular files and folders can be used")


def _swapped_link(shown: str) -> ToolError:
    return ToolError(f"path {shown!r} changed while it was being opened: it goes through a symbolic link now; "
                     "only files inside the workspace can be used")


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
