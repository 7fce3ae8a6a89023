"""The `swarm` command line. Each command lives in its own module; this file only wires them.

Every error is one line on stderr, `error: <what to fix>`, never a traceback. Exit codes:
0 done (`swarm` alone prints the help and exits 0, as `swarm --help` does), 1 a failure while
running (a port in use, a server that does not answer, a model that does not fit), 2 a usage
error (an unknown command or option, a bad option value) or a spec error, 130 interrupted by
Ctrl-C (143 by SIGTERM).
"""
from __future__ import annotations

import sys
import warnings
from importlib import metadata

import typer

from engine import SwarmError

PACKAGE = "swarm-llm"
EXIT_INTERRUPTED = 130
EXIT_CODES_HELP = ("Exit codes: 0 done, 1 a failure while running (port in use, server not answering), "
                   "2 a usage or spec error, 130 interrupted (143 by SIGTERM).")

app = typer.Typer(
    help="Run a local swarm of coding agents that share one KV cache of their common prompt trunk.",
    epilog=EXIT_CODES_HELP,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def package_version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown (not installed; run pip install -e .)"


def _print_version(requested: bool) -> None:
    if requested:
        print(f"swarm {package_version()}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context,
          version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print swarm's version and exit.")) -> None:
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())


def _register() -> None:
    from swarm.cli import generate as generate_cmd

    app.command("models")(generate_cmd.models)
    app.command("generate")(generate_cmd.generate)
    from swarm.cli import inspect_prefix as inspect_cmd
    app.command("inspect-prefix")(inspect_cmd.inspect_prefix_cmd)
    from swarm.cli import bench as bench_cmd
    app.command("bench")(bench_cmd.bench)
    from swarm.cli import bench_decode as bench_decode_cmd
    app.command("bench-decode")(bench_decode_cmd.bench_decode)
    from swarm.cli import bench_arrival as bench_arrival_cmd
    app.command("bench-arrival")(bench_arrival_cmd.bench_arrival)
    from swarm.cli import run as run_cmd
    app.command("run")(run_cmd.run)
    from swarm.cli import serve as serve_cmd
    app.command("serve")(serve_cmd.serve)


_register()


def click_exception_types() -> tuple[type[Exception], ...]:
    """The ClickException base of the usage errors typer raises. typer 0.2x vendors its own click
    (typer._click), older ones raise click's; typer.BadParameter derives from whichever it uses."""
    found = {cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException"}
    try:
        import click
        found.add(click.ClickException)
    except ImportError:
        pass
    assert found, "typer.BadParameter no longer derives from a ClickException"
    return tuple(found)


def main() -> None:
    """Entry point: user errors print one line and exit non-zero, never a traceback."""
    warnings.showwarning = _one_line_warning
    try:
        code = app(standalone_mode=False)
    except click_exception_types() as err:
        _fail(_usage_message(err), err.exit_code)
    except typer.Abort:
        sys.exit(EXIT_INTERRUPTED)
    except SwarmError as err:
        _fail(str(err), err.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_message(err) -> str:
    ctx = getattr(err, "ctx", None)
    hint = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
    return f"{err.format_message().rstrip('.')}{hint}"


def _fail(message: str, exit_code: int) -> None:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(exit_code)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=file or sys.stderr)


if __name__ == "__main__":
    main()
