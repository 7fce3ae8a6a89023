"""`swarm run SPEC`: run the agents a swarm.yaml describes, with a live view of their memory."""
from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from engine import SpecError, SwarmError
from swarm.run.stop_flag import StopFlag
from swarm.spec.external_harness import check_installed
from swarm.spec.schema import SwarmSpec, load_spec

if TYPE_CHECKING:
    from swarm.run.view import RunView


def run(
    spec: Path = typer.Argument(..., help="The swarm spec (swarm.yaml); start from swarm.yaml.example.",
                                show_default=False),
    no_tui: bool = typer.Option(False, "--no-tui",
                                help="Print one plain line per event instead of the live dashboard "
                                     "(the default when the output is not a terminal)."),
    as_json: bool = typer.Option(False, "--json",
                                 help="Print summary.json to stdout at the end; progress goes to stderr."),
    out: Path = typer.Option(None, "--out", help="Folder for the run's output, instead of the spec's `out` "
                                                 "(default: runs/ next to the spec).", show_default=False),
    no_graphs: bool = typer.Option(False, "--no-graphs",
                                   help="Decode eagerly on a GPU, without CUDA/HIP graphs (the spec's `graphs: false`)."),
) -> None:
    """Run a swarm: load the model once, prefill the shared prompt trunk once, and run every agent in one batched decode loop until each gives a final answer or hits a limit.

    With `harness: claude-code` (or codex, opencode, aider, mini-swe-agent: harness_templates/), each agent is that CLI, run in its own copy of the workspace against swarm's engine served on a loopback port; their common first prompt is computed once and pinned, and the dashboard shows each agent's state, requests, cached tokens and KV.

    With `backend: {type: openai, base_url: ..., model: ...}` in the spec, the agents run on that OpenAI-compatible server instead (vLLM, SGLang, or `swarm serve`), every one sending the same system message and tools so the server's prefix cache hits; the dashboard shows the cached tokens and the server's /metrics.

    Each run writes OUT/<spec>-<time>/: agent-<name>.jsonl (every message, tool call, tool result and token count, as it happens), workspaces/<name>/ (each agent's copy of the project) and summary.json (status, end reasons, turns, tokens, timings and KV memory figures).

    Ctrl-C, or SIGTERM (docker stop, systemd, a CI timeout), stops cleanly at the next step: transcripts are complete, summary.json says "interrupted", and the exit code is 130 (Ctrl-C) or 143 (SIGTERM). A second signal stops at once. When limits.wall_time cuts agents short, summary.json says "wall_time".
    """
    swarm_spec = load_spec(spec)
    if swarm_spec.external is not None:
        check_installed(swarm_spec.external)   # before the model loads: a missing CLI is one line, at once
        return _run_external(swarm_spec, spec, out, as_json, tui=not no_tui)
    if no_graphs:
        swarm_spec.graphs = False
    base = out_folder(swarm_spec, out)
    # Past the spec's own checks: now the modules that import torch and openai (seconds of CPU).
    from swarm.trunk.fit import check_trunk_fits

    check_trunk_fits(swarm_spec, base)
    from swarm.run.phases import SwarmRun, backend_for

    run_dir = new_run_dir(base, spec)
    stream = sys.stderr if as_json else sys.stdout
    view = make_view(stream, tui=not no_tui and stream.isatty())
    stop = StopFlag()
    with stop.installed():
        summary = SwarmRun(swarm_spec, run_dir, view, stop, backend_for(swarm_spec)).run()
    if as_json:
        print(json.dumps(summary, indent=2, ensure_ascii=False), flush=True)
    if summary["status"] == "interrupted":
        raise typer.Exit(stop.exit_code)


def _run_external(swarm_spec: SwarmSpec, spec: Path, out: Path | None, as_json: bool, tui: bool) -> None:
    """N copies of a harness CLI on one engine served in this process (swarm/run/external_run.py)."""
    if swarm_spec.backend.is_remote:
        raise SpecError(f"{spec}: backend: an external harness runs on swarm's own engine; drop backend:")
    from swarm.cli.harness_dashboard import HarnessDashboard, HarnessLines
    from swarm.run.external_run import ExternalRun

    run_dir = new_run_dir(out_folder(swarm_spec, out), spec)
    stream = sys.stderr if as_json else sys.stdout
    view = HarnessDashboard(Console(file=stream)) if tui and stream.isatty() else HarnessLines(stream)
    stop = StopFlag()
    with stop.installed():
        summary = ExternalRun(swarm_spec, run_dir, view, stop).run()
    if as_json:
        print(json.dumps(summary, indent=2, ensure_ascii=False), flush=True)
    if summary["status"] == "interrupted":
        raise typer.Exit(stop.exit_code)


def make_view(stream, tui: bool) -> RunView:
    """The live dashboard in a terminal, else plain lines; each shows what the run's backend can know."""
    from swarm.cli.dashboard import Dashboard
    from swarm.cli.plain_view import PlainView

    return Dashboard(Console(file=stream)) if tui else PlainView(stream)


def out_folder(spec: SwarmSpec, option: Path | None) -> Path:
    """The folder runs go under: --out, else the spec's `out` (load_spec checked it is no file)."""
    if option is None:
        problem = _inside_copied_workspace(spec, spec.out)
        if problem:
            line = spec.lines.get("out", spec.lines.get("workspace", (1, 1)))[0]
            raise SpecError(f"{spec.path}:{line}: out: {problem}")
        return spec.out
    base = option.resolve()
    if any(path.exists() and not path.is_dir() for path in (base, *base.parents)):
        raise typer.BadParameter(f"{option} is a file or lies under one; name a folder", param_hint="'--out'")
    problem = _inside_copied_workspace(spec, base)
    if problem:
        raise typer.BadParameter(problem, param_hint="'--out'")
    return base


def _inside_copied_workspace(spec: SwarmSpec, base: Path) -> str | None:
    workspace = spec.workspace
    if workspace.mode != "copy" or not base.resolve().is_relative_to(workspace.path.resolve()):
        return None
    return (f"{base} lies inside the workspace {workspace.path}, which every agent gets a copy of; "
            "put the runs outside it, or use workspace.mode: shared-readonly")


def new_run_dir(base: Path, spec_path: Path) -> Path:
    """A fresh folder `<base>/<spec stem>-<YYYYmmdd-HHMMSS>`, with -2, -3... when taken."""
    stem = f"{Path(spec_path).stem.removesuffix('.yaml')}-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        return _first_free_folder(base, stem)
    except OSError as err:
        raise SwarmError(f"cannot make a run folder under {base}: {err.strerror}; give another out: or --out") from None


def _first_free_folder(base: Path, stem: str) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        path = base / (stem if attempt == 1 else f"{stem}-{attempt}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise AssertionError(f"no free run folder name under {base}")
