"""Run the real coding-agent CLIs against `swarm serve` and print issue 20's table.

    python scripts/try_harnesses.py --model /work/harness-model [--only claude-code,codex] [--work DIR]

Needs the CLIs (tests/data/harness_requests/README.md says which and how): the npm ones under --clis
(node_modules/.bin), aider and mini-swe-agent in the --venv. Each harness runs twice, as two agents given
the same task in two fresh project folders that differ only in their path, against one `swarm serve`:
once plain, once with --canonicalize (where serve has the flag). The server is the real CLI; only its
sampler is scripted, the model being random: a request that offers tools gets the harness's read call,
one that carries a tool result gets a final answer, so each CLI parses a real tool call. Every request
and its reply are recorded under --work; the table says what each CLI called and how it went.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from try_harnesses_clis import HARNESSES, Harness  # noqa: E402
from try_harnesses_server import serve_scripted  # noqa: E402

TASK = "Add a subtract function to calc.py"
FOLDERS = ("alpha", "beta")
TOOL_RESULT_MARKERS = ('"tool_result"', '"function_call_output"', '"role": "tool"')


def main() -> None:
    args = _arguments()
    if args.serve:
        return serve_scripted(Path(args.serve), args.serve_args)
    work = Path(args.work)
    runs = work / "runs.json"
    rows = json.loads(runs.read_text()) if args.table_only else run_all(args, work)
    runs.write_text(json.dumps(rows, indent=1))
    divergences = {name: inspect_first_requests(name, modes["plain"], args.model, work) for name, modes in rows.items()}
    table = render_table(rows, divergences, args.model)
    (work / "table.md").write_text(table)
    print(table)


def run_all(args, work: Path) -> dict:
    """{harness: {"plain" | "canonicalize": {agent folder: what its run sent and got}}}"""
    chosen = [HARNESSES[name] for name in args.only.split(",")] if args.only else list(HARNESSES.values())
    modes = ["plain", "canonicalize"] if serve_has("--canonicalize") else ["plain"]
    rows = {}
    for mode in modes:
        records = work / f"records-{mode}"
        with scripted_server(args.model, records, mode == "canonicalize") as port:
            for harness in chosen:
                rows.setdefault(harness.name, {})[mode] = run_pair(harness, port, records, work, args)
    return rows


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/work/harness-model", help="a model whose context holds 20k tokens")
    parser.add_argument("--clis", default="/work/harness-clis", help="npm --prefix folder of the npm CLIs")
    parser.add_argument("--venv", default="/work/harness-venv", help="venv with aider-chat and mini-swe-agent")
    parser.add_argument("--work", default="/tmp/try-harnesses", help="projects, homes, records and table.md")
    parser.add_argument("--only", default="", help="comma-separated harness names: " + ",".join(HARNESSES))
    parser.add_argument("--timeout", type=float, default=300, help="seconds per CLI run")
    parser.add_argument("--table-only", action="store_true", help="render the table again from --work/runs.json")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("serve_args", nargs="*", help=argparse.SUPPRESS)
    return parser.parse_args()


def serve_has(flag: str) -> bool:
    shown = subprocess.run([sys.executable, "-m", "swarm", "serve", "--help"], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "200"})
    return flag in shown.stdout


@contextmanager
def scripted_server(model: str, records: Path, canonicalize: bool):
    shutil.rmtree(records, ignore_errors=True)
    records.mkdir(parents=True)
    serve_args = ["--model", model, "--served-model-name", "tiny", "--port", "0", "--json", "--kv-budget", "400000",
                  "--log-level", "warning"] + (["--canonicalize"] if canonicalize else [])
    command = [sys.executable, __file__, "--serve", str(records), "--", *serve_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(records / "serve.log", "w"), text=True)
    try:
        ready = json.loads(process.stdout.readline() or "{}")
        assert "port" in ready, f"swarm serve did not start: see {records / 'serve.log'}"
        yield ready["port"]
    finally:
        process.terminate()
        process.wait(20)


def run_pair(harness: Harness, port: int, records: Path, work: Path, args) -> dict:
    """Both agents of one harness, one after the other; what the server saw of each."""
    home = fresh(work / "homes" / harness.name)
    runs = {}
    for folder in FOLDERS:
        project = make_project(work / "projects" / folder)
        (records / "script.json").write_text(json.dumps(harness.script(project)))
        before = set(records.glob("[0-9]*.json"))
        started = time.monotonic()
        rc, output = run_cli(harness.command(project, port, home, TASK, args), project,
                             {**os.environ, **harness.env(port, home, args), "PWD": str(project)}, args.timeout)
        seen = [json.loads(p.read_text()) for p in sorted(set(records.glob("[0-9]*.json")) - before)]
        runs[folder] = {"rc": rc, "seconds": round(time.monotonic() - started, 1), "requests": seen,
                        "output_tail": output[-2000:]}
        (work / f"{harness.name}-{folder}-{records.name}.log").write_text(output)
    return runs


def run_cli(command: list[str], project: Path, env: dict, timeout: float) -> tuple[int, str]:
    """The CLI's exit code (124 when it ran past `timeout`) and its output."""
    try:
        done = subprocess.run(command, cwd=project, env=env, text=True, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired as late:
        return 124, _text(late.stdout) + _text(late.stderr)
    return done.returncode, done.stdout + done.stderr


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def make_project(folder: Path) -> Path:
    """The same files and the same commit (fixed dates) in every folder: only the path differs."""
    fresh(folder)
    (folder / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (folder / "README.md").write_text("# calc\nA tiny project.\n")
    dates = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    git = ["git", "-c", "user.email=agent@example.com", "-c", "user.name=agent"]
    env = {**os.environ, **dates}
    for step in (["init", "-q"], ["add", "."], ["commit", "-qm", "init"]):
        subprocess.run(git + step, cwd=folder, env=env, check=True)
    return folder


def first_agent_request(run: dict) -> dict | None:
    posts = [r for r in run["requests"] if r["method"] == "POST" and isinstance(r["body"], dict)]
    with_tools = [r for r in posts if r["body"].get("tools")]
    return (with_tools or posts or [None])[0]


def usage_counts(record: dict | None) -> tuple[int | None, int | None]:
    """(cached, prompt) tokens the server reported in its reply, in any API's spelling. Anthropic's
    input_tokens leave out what came from the cache; the others' prompt counts include it."""
    if record is None:
        return None, None
    counts = {name: max(map(int, found)) for name in ("cached_tokens", "cache_read_input_tokens", "prompt_tokens",
                                                       "input_tokens")
              if (found := re.findall(rf'"{name}":\s*(\d+)', record["reply"]))}
    if "cache_read_input_tokens" in counts:
        cached = counts["cache_read_input_tokens"]
        return cached, cached + counts.get("input_tokens", 0)
    return counts.get("cached_tokens"), counts.get("prompt_tokens", counts.get("input_tokens"))


def summarize(runs: dict) -> dict:
    requests = [r for run in runs.values() for r in run["requests"]]
    asked = [r for r in requests if isinstance(r["body"], dict) and r["body"].get("stream")]
    streamed = [r for r in asked if r["status"] == 200 and "text/event-stream" in r["content_type"]]
    return {"connected": any(r["status"] < 400 for r in requests),
            "endpoints": sorted({f"{r['method']} {r['path']} {r['status']}" for r in requests}),
            "streamed": f"{len(streamed)} of {len(asked)} asked" if asked else "never asked",
            "tool_calls": tool_call_cell(runs, requests), "exit_codes": [run["rc"] for run in runs.values()],
            "beta_usage": usage_counts(first_agent_request(runs["beta"]))}


def tool_call_cell(runs: dict, requests: list[dict]) -> str:
    if not any(isinstance(r["body"], dict) and r["body"].get("tools") for r in requests):
        applied = any("Applied edit" in run["output_tail"] for run in runs.values())
        return "no tools offered" + ("; the scripted edit block was applied" if applied else "")
    returned = any(marker in json.dumps(r["body"]) for r in requests for marker in TOOL_RESULT_MARKERS)
    return "yes: call parsed, run, result sent back" if returned else "no tool result came back"


def inspect_first_requests(name: str, runs: dict, model: str, work: Path) -> dict | None:
    """`swarm inspect-prefix --requests` on the two agents' first requests: where they part, and what
    --canonicalize would gain."""
    folder = fresh(work / "first-requests" / name)
    for agent, run in runs.items():
        record = first_agent_request(run)
        if record is None:
            return None
        (folder / f"{agent}.json").write_text(json.dumps(record["body"], indent=1, ensure_ascii=False))
    shown = subprocess.run([sys.executable, "-m", "swarm", "inspect-prefix", "--requests", str(folder),
                            "--model", model, "--json"], capture_output=True, text=True)
    if shown.returncode != 0:
        return {"error": "inspect-prefix failed: " + (shown.stderr or shown.stdout).strip().splitlines()[-1][-200:]}
    return json.loads(shown.stdout)


def divergence_cell(report: dict | None) -> str:
    if not report or "error" in report:
        return (report or {}).get("error", "no request")
    first = report["requests"][0]
    return (f"{first['diverges_at']:,} of {first['prompt_tokens']:,}: "
            f"`{_cell(first['before'][-20:])}` / `{_cell(first['after'][:10])}`")


def _cell(text: str) -> str:
    return text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'")


def usage_cell(usage: tuple) -> str:
    cached, prompt = usage
    return "no usage in the reply" if cached is None else f"{cached:,} of {prompt:,}"


def render_table(rows: dict, divergences: dict, model: str) -> str:
    lines = [f"Model: {model}. Divergence: where agent beta's first prompt leaves agent alpha's, rendered by "
             "`swarm inspect-prefix --requests`; cached: what serve reported cached for beta's first request after "
             "alpha ran (the same token when the reply says), plain and with `--canonicalize`.", "",
             "| harness | API | connected | endpoints (status) | streamed | tool call round trip | CLI exit codes | "
             "divergence token | cached, plain | cached, --canonicalize |", "|---|---|---|---|---|---|---|---|---|---|"]
    for harness in HARNESSES.values():
        if harness.name not in rows:
            continue
        modes = rows[harness.name]
        plain = summarize(modes["plain"])
        canonical = usage_cell(summarize(modes["canonicalize"])["beta_usage"]) if "canonicalize" in modes else "n/a"
        divergence = divergence_cell(divergences[harness.name])
        lines.append(f"| {harness.name} | {harness.api} | {_yes(plain['connected'])} | "
                     f"{'<br>'.join(plain['endpoints'])} | {plain['streamed']} | {plain['tool_calls']} | "
                     f"{plain['exit_codes']} | {divergence} | {usage_cell(plain['beta_usage'])} | {canonical} |")
    return "\n".join(lines) + "\n"


def _yes(value: bool) -> str:
    return "yes" if value else "no"


if __name__ == "__main__":
    main()
