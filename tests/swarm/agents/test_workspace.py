import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import SpecError
from swarm.agents.workspace import ToolError, Workspace, prepare_workspace


@pytest.fixture
def sandbox(tmp_path):
    """root/ is the workspace; outside/ is a sibling the agent must never reach."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("print('a')\n")
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (root / "link_out").symlink_to(outside / "secret.txt")
    (root / "dir_out").symlink_to(outside)
    (root / "link_in").symlink_to(root / "src" / "a.py")
    return root, outside


def test_relative_paths_resolve_inside_the_root(sandbox):
    root, _ = sandbox
    workspace = Workspace(root)
    assert workspace.resolve("src/a.py") == root / "src" / "a.py"
    assert workspace.resolve(".") == root
    assert workspace.resolve("src/../src/a.py") == root / "src" / "a.py"
    assert workspace.resolve("new/file.txt") == root / "new" / "file.txt"


def test_dotdot_escape_is_refused_with_a_message_for_the_model(sandbox):
    with pytest.raises(ToolError, match="'../outside/secret.txt' leaves the workspace; use a path relative"):
        Workspace(sandbox[0]).resolve("../outside/secret.txt")


@pytest.mark.parametrize("path", ["/etc/passwd", "~/notes.txt", "//etc"])
def test_absolute_paths_are_refused(sandbox, path):
    with pytest.raises(ToolError, match="is absolute"):
        Workspace(sandbox[0]).resolve(path)


def test_symlink_to_a_file_outside_is_refused(sandbox):
    with pytest.raises(ToolError, match="symbolic link that points outside"):
        Workspace(sandbox[0]).resolve("link_out")


def test_symlinked_directory_outside_is_refused(sandbox):
    workspace = Workspace(sandbox[0])
    with pytest.raises(ToolError, match="symbolic link that points outside"):
        workspace.resolve("dir_out/secret.txt")
    with pytest.raises(ToolError):
        workspace.resolve("dir_out/new_file.txt")


def test_symlink_inside_the_workspace_is_allowed(sandbox):
    root, _ = sandbox
    assert Workspace(root).resolve("link_in") == root / "src" / "a.py"


def test_nul_byte_is_refused(sandbox):
    with pytest.raises(ToolError, match="NUL"):
        Workspace(sandbox[0]).resolve("a\x00b")


def test_read_only_workspace_refuses_writes(sandbox):
    with pytest.raises(ToolError, match="read-only"):
        Workspace(sandbox[0], read_only=True).require_writable()
    Workspace(sandbox[0]).require_writable()


@pytest.fixture(scope="module")
def tricky_root(tmp_path_factory):
    """A tree full of links that lead out; module-scoped because hypothesis reruns the test body."""
    base = tmp_path_factory.mktemp("property")
    root = base / "root"
    (root / "sub").mkdir(parents=True)
    (base / "outside").mkdir()
    (root / "out").symlink_to(base / "outside")
    (root / "sub" / "up").symlink_to("../..")
    (root / "abs").symlink_to("/")
    (root / "loop").symlink_to("loop")
    (root / "in").symlink_to("sub")
    return root


_SEGMENTS = st.sampled_from(["..", ".", "", "sub", "out", "up", "abs", "loop", "in", "x", "~", "...",
                             "root", "outside", "\\..", "..\\.."])
_JOINED_PATHS = st.lists(_SEGMENTS, max_size=8).map("/".join)


def test_a_link_loop_cannot_hide_a_link_that_leads_out(tricky_root):
    # os.path.realpath stops at the loop and joins "../out" without resolving "out"
    with pytest.raises(ToolError, match="link loop"):
        Workspace(tricky_root).resolve("loop/../out")


@given(st.one_of(_JOINED_PATHS, st.text(max_size=40)))
def test_no_relative_path_resolves_outside_the_root(tricky_root, path):
    workspace = Workspace(tricky_root)
    try:
        resolved = workspace.resolve(path)
    except ToolError:
        return
    real_root = os.path.realpath(tricky_root)
    assert os.path.commonpath([real_root, os.path.realpath(resolved)]) == real_root


def test_copy_mode_gives_each_agent_its_own_copy(sandbox, tmp_path):
    root, _ = sandbox
    first = prepare_workspace(root, tmp_path / "agents" / "0", "copy")
    second = prepare_workspace(root, tmp_path / "agents" / "1", "copy")
    (first.root / "src" / "a.py").write_text("changed\n")
    assert (second.root / "src" / "a.py").read_text() == "print('a')\n"
    assert (root / "src" / "a.py").read_text() == "print('a')\n"
    assert not first.read_only


def test_copy_keeps_outside_symlinks_as_refused_links(sandbox, tmp_path):
    workspace = prepare_workspace(sandbox[0], tmp_path / "copy", "copy")
    assert (workspace.root / "link_out").is_symlink()
    with pytest.raises(ToolError):
        workspace.resolve("link_out")


def test_shared_readonly_uses_the_source_in_place(sandbox):
    root, _ = sandbox
    workspace = prepare_workspace(root, None, "shared-readonly")
    assert workspace.root == root and workspace.read_only


def test_copy_refuses_a_non_empty_destination(sandbox, tmp_path):
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "file").write_text("x")
    with pytest.raises(SpecError, match="not empty"):
        prepare_workspace(sandbox[0], dest, "copy")


def test_copy_refuses_a_destination_inside_the_source(sandbox):
    with pytest.raises(SpecError, match="inside its source"):
        prepare_workspace(sandbox[0], sandbox[0] / "agents" / "0", "copy")


def test_unknown_mode_and_missing_source_are_spec_errors(sandbox, tmp_path):
    with pytest.raises(SpecError, match="unknown workspace mode 'move'"):
        prepare_workspace(sandbox[0], tmp_path / "d", "move")
    with pytest.raises(SpecError, match="not a directory"):
        prepare_workspace(tmp_path / "missing", tmp_path / "d", "copy")


def test_a_symlink_loop_is_called_a_loop(tricky_root):
    with pytest.raises(ToolError, match="path 'loop' is a symlink loop"):
        Workspace(tricky_root).resolve("loop")
    with pytest.raises(ToolError, match="path 'loop/x' goes through a symlink loop"):
        Workspace(tricky_root).resolve("loop/x")


# A link swapped in between resolve() and the open is the race a concurrent process could win;
# doing the swap between the two calls makes it deterministic.

def test_a_folder_swapped_for_a_link_after_the_check_is_refused_at_open(sandbox):
    root, outside = sandbox
    (root / "sub").mkdir()
    workspace = Workspace(root)
    checked = workspace.resolve("sub/deeper/planted.txt")
    (root / "sub").rmdir()
    (root / "sub").symlink_to(outside)
    with pytest.raises(ToolError, match="goes through a symbolic link now"):
        workspace.open_file(checked, write=True)
    assert sorted(os.listdir(outside)) == ["secret.txt"]


def test_a_file_swapped_for_a_link_after_the_check_is_refused_at_open(sandbox):
    root, outside = sandbox
    workspace = Workspace(root)
    checked = workspace.resolve("src/a.py")
    (root / "src" / "a.py").unlink()
    (root / "src" / "a.py").symlink_to(outside / "secret.txt")
    for write in (False, True):
        with pytest.raises(ToolError, match="goes through a symbolic link now"):
            workspace.open_file(checked, write=write)
    assert (outside / "secret.txt").read_text() == "secret\n"


def test_open_file_writes_and_reads_beneath_the_root(sandbox):
    root, _ = sandbox
    workspace = Workspace(root)
    with workspace.open_file(workspace.resolve("new/dir/f.txt"), write=True) as file:
        file.write(b"x")
    with workspace.open_file(workspace.resolve("link_in")) as file:
        assert file.read() == b"print('a')\n"
    assert (root / "new" / "dir" / "f.txt").read_bytes() == b"x"


@pytest.mark.parametrize("write", [False, True])
def test_a_fifo_is_refused_without_opening_it(sandbox, write):
    root, _ = sandbox
    os.mkfifo(root / "pipe")
    workspace = Workspace(root)
    with pytest.raises(ToolError, match=r"'pipe' is a named pipe \(FIFO\); only regular files and folders"):
        workspace.open_file(workspace.resolve("pipe"), write=write)
