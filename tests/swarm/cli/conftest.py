"""What the CLI tests share: `swarm ARGS...` run in this process through the real entry point."""
import sys

import pytest

from swarm.cli.main import main


@pytest.fixture
def swarm_cli(monkeypatch, capsys):
    """(exit code, stdout, stderr) of `swarm ARGS...`."""
    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["swarm", *map(str, args)])
        with pytest.raises(SystemExit) as exited:
            main()
        out, err = capsys.readouterr()
        return exited.value.code, out, err
    return run
