"""The `swarm` command line. Each command lives in its own module; this file only wires them."""
from __future__ import annotations

import sys
import warnings

import click
import typer

from engine.errors import SwarmError

app = typer.Typer(
    help="Run a local swarm of coding agents that share one KV cache of their common prompt trunk.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from swarm import generate_cmd

    app.command("models")(generate_cmd.models)
    app.command("generate")(generate_cmd.generate)
    from swarm import inspect_cmd
    app.command("inspect-prefix")(inspect_cmd.inspect_prefix_cmd)
    from swarm import bench_cmd
    app.command("bench")(bench_cmd.bench)
    from swarm import bench_decode_cmd
    app.command("bench-decode")(bench_decode_cmd.bench_decode)
    from swarm import run_cmd
    app.command("run")(run_cmd.run)
    from swarm import serve_cmd
    app.command("serve")(serve_cmd.serve)


_register()


def main() -> None:
    """Entry point: user errors print one line and exit non-zero, never a traceback."""
    warnings.showwarning = _one_line_warning
    try:
        code = app(standalone_mode=False)
    except click.exceptions.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except SwarmError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=file or sys.stderr)


if __name__ == "__main__":
    main()
