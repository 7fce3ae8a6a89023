"""`swarm serve`: an OpenAI-compatible HTTP server on swarm's engine, one model, one batch.

    bind the port (fail fast) -> load the model -> [spec: prefill and pin its trunk]
    -> engine thread (engine/async_engine.py) -> FastAPI routes (swarm/server/app.py) on uvicorn
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

import typer

from engine import DEFAULT_MODEL, WEIGHT_SCHEMES, EngineOptions, OptionError, SwarmError
from swarm.server.loopback import bind
from swarm.spec.kv_budget import run_sequences

TRUNK_REQUEST_ID = "trunk"


@dataclass(slots=True)
class ServeSettings:
    model: str
    device: str
    dtype: str
    weights: str
    kv_budget_tokens: int | None
    kv_budget_bytes: int | None
    graphs: bool = True
    canonicalize: bool = False
    max_model_len: int | None = None
    max_num_seqs: int = EngineOptions().max_num_seqs


def serve(
    spec: Path = typer.Argument(None, show_default=False,
                                help="A swarm.yaml: serve its model (device, dtype, kv_budget too) and prefill and "
                                     "pin its trunk at start, so agents with that harness hit the cache at once."),
    model: str = typer.Option(None, "--model", "-m", show_default=False,
                              help=f"A named model (see `swarm models`), a Hugging Face folder or a .gguf file. "
                                   f"Default: the spec's, else {DEFAULT_MODEL}."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free one)."),
    device: str = typer.Option(None, "--device", show_default=False,
                               help="auto, cpu, cuda or cuda:N. Default: the spec's, else auto."),
    dtype: str = typer.Option(None, "--dtype", show_default=False,
                              help="auto, float32, bfloat16 or float16. Default: the spec's, else auto."),
    weights: str = typer.Option(None, "--weights", show_default=False,
                                help=f"How the weights are kept: {', '.join(WEIGHT_SCHEMES)}. auto: a GGUF file's "
                                     "own formats, a checkpoint's dtype; q8_0 & co quantize a checkpoint at load. "
                                     "Default: the spec's, else auto."),
    kv_budget: str = typer.Option(None, "--kv-budget", metavar="SIZE|TOKENS", show_default=False,
                                  help="KV cache budget, like 2GB or 20000 (tokens). Default: the spec's, "
                                       "else sized from free memory."),
    max_model_len: int = typer.Option(None, "--max-model-len", min=2, metavar="TOKENS", show_default=False,
                                      help="The context served: prompt and reply together. Shorter than the model's "
                                           "trained context always; longer with a warning, as replies past the trained "
                                           "length may degrade. Default: the model's trained context."),
    max_num_seqs: int = typer.Option(None, "--max-num-seqs", min=1, metavar="N", show_default=False,
                                     help="Requests computed at once; more wait their turn. On a GPU the engine "
                                          "sizes its largest step by it, and on a hybrid model (Qwen3.5) holds back "
                                          "two state slots a request (one live, one snapshot: 98 MiB on Qwen3.5-9B). "
                                          "Default: the spec's agents + 1 (the trunk), else 64."),
    served_model_name: str = typer.Option(None, "--served-model-name", show_default=False,
                                          help="The model id clients send and /v1/models lists. "
                                               "Default: the model as given."),
    api_key: str = typer.Option(None, "--api-key", envvar="SWARM_API_KEY", show_default=False,
                                help="Ask /v1/* requests for `Authorization: Bearer KEY` (401 otherwise); /health "
                                     "and /metrics stay open. Prefer the SWARM_API_KEY variable: a command "
                                     "line is visible to other users."),
    no_graphs: bool = typer.Option(False, "--no-graphs",
                                   help="Decode eagerly on a GPU, without CUDA/HIP graphs. Default: the spec's `graphs`, "
                                        "else graphs on."),
    capture: Path = typer.Option(None, "--capture", metavar="DIR", show_default=False,
                                 help="Write every POST /v1/* body the server receives into DIR, one file per request "
                                      "(000001-messages.json, with a .meta.json: path, query, headers without keys, "
                                      "time), to see what a harness sends; read them with `swarm inspect-prefix "
                                      "--requests DIR`. A failed write is a log line, never a failed request."),
    canonicalize: bool = typer.Option(False, "--canonicalize",
                                      help="Move what is known to change between agents (Claude Code's and OpenCode's "
                                           "environment blocks, git status, cwd and date lines, what prefix lint finds) "
                                           "out of each request's system text into its first user message, so every "
                                           "agent of a harness shares one trunk. Default: the spec's `canonicalize`, "
                                           "else off."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn's log level: debug, info, warning, error."),
    as_json: bool = typer.Option(False, "--json", help="Print the ready line as one JSON object."),
) -> None:
    """Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models) plus /health and /metrics.

    Every client's requests go into one engine: prompts that start alike (the same system prompt and tools, in any order) share their KV blocks, and all requests decode in one batch. usage.prompt_tokens_details.cached_tokens says how much of each prompt came from the cache.

    Example: swarm serve --model smollm2-135m-instruct --port 8000, then point any OpenAI client at http://127.0.0.1:8000/v1 (any api_key, unless --api-key or SWARM_API_KEY sets one).
    """
    _check_log_level(log_level)
    swarm_spec = _load_spec(spec, model) if spec is not None else None
    settings = _settings(swarm_spec, model, device, dtype, weights, kv_budget, no_graphs, canonicalize, max_num_seqs)
    settings.max_model_len = max_model_len
    listener = bind(host, port)
    try:
        _serve(listener, settings, swarm_spec, served_model_name or settings.model, log_level, as_json, api_key,
               capture_dir=capture)
    finally:
        listener.close()


def _serve(listener: socket.socket, settings: ServeSettings, spec, name: str, log_level: str,
           as_json: bool, api_key: str | None = None, capture_dir: Path | None = None) -> None:
    import uvicorn

    from engine import AsyncEngine, EngineOptions, LLMEngine
    from swarm.server.app import build_app
    from swarm.server.served_model import ServedModel

    engine = LLMEngine(settings.model, EngineOptions(device=settings.device, dtype=settings.dtype,
                                                     weights=settings.weights,
                                                     kv_budget_tokens=settings.kv_budget_tokens,
                                                     kv_budget_bytes=settings.kv_budget_bytes,
                                                     cuda_graphs=settings.graphs,
                                                     max_model_len=settings.max_model_len,
                                                     max_num_seqs=settings.max_num_seqs))
    served = ServedModel(name, aliases={settings.model, engine.source.display_name, str(engine.source.path)})
    if spec is not None:
        served.trunk_tokens, served.trunk_blocks = pin_trunk(engine, spec_trunk_ids(spec, engine))
    async_engine = AsyncEngine(engine).start()
    try:
        app = build_app(async_engine, served, api_key, capture_dir=capture_dir, canonicalize=settings.canonicalize)
        _announce(listener, engine, served, as_json)
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=3)
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        async_engine.shutdown()


def spec_trunk_ids(spec, engine) -> list[int]:
    """The trunk `swarm run` gives this spec's agents. Every agent stands in the workspace itself,
    so a rule naming `{{ cwd }}` counts as shared here; clients still share up to where they differ."""
    from swarm.spec.harness import load_harness
    from swarm.trunk.canonical import build_prompts, trunk_source
    from swarm.trunk.suffix import Environment

    if spec.external is not None:   # a CLI's prompt is known when it sends it: its first request computes it
        return []
    source = trunk_source(load_harness(spec.harness), spec)
    environment = Environment.detect(spec.workspace.path if spec.workspace else Path.cwd())
    environments = {agent.name: environment for agent in spec.agents}
    return build_prompts(engine.tokenizer, source, spec.agents, environments).trunk.token_ids


def pin_trunk(engine, trunk_ids: list[int]) -> tuple[int, int]:
    """Prefill the trunk and pin its blocks for the server's lifetime: (tokens, blocks)."""
    from engine import SamplingParams

    context = engine.config.max_position_embeddings
    if not trunk_ids:
        return 0, 0
    if len(trunk_ids) >= context:
        raise SwarmError(f"the trunk has {len(trunk_ids)} tokens, the model's context is {context}; "
                         "use fewer rules or tools, or a model with a longer context")
    seq = engine.add_request(trunk_ids, SamplingParams(max_tokens=1), request_id=TRUNK_REQUEST_ID,
                             prefill_only=True)
    while seq.finish_reason is None:
        engine.step()
    if seq.finish_reason == "error":
        raise SwarmError(f"the trunk does not fit in the KV pool: {seq.error}")
    blocks = engine.pin(seq)
    engine.release(seq)
    return len(trunk_ids), len(blocks)


def _check_log_level(log_level: str) -> None:
    from uvicorn.config import LOG_LEVELS

    if log_level.lower() not in LOG_LEVELS:
        raise OptionError(f"--log-level: {log_level!r} is not one of {', '.join(LOG_LEVELS)}")


def _load_spec(path: Path, model: str | None):
    from swarm.spec.schema import load_spec

    spec = load_spec(path)
    if not spec.model and model is None:
        raise OptionError(f"{path}: the spec names no local model (its backend is remote); pass --model")
    return spec


def _settings(spec, model: str | None, device: str | None, dtype: str | None, weights: str | None,
              kv_budget: str | None, no_graphs: bool = False, canonicalize: bool = False,
              max_num_seqs: int | None = None) -> ServeSettings:
    from swarm.spec.kv_budget import parse_kv_budget

    budget = spec.kv_budget if spec is not None else None
    if kv_budget is not None:
        try:
            budget = parse_kv_budget(int(kv_budget) if kv_budget.strip().isdigit() else kv_budget)
        except ValueError as err:
            raise OptionError(f"--kv-budget: {err}") from None
    if weights is not None and weights.lower() not in WEIGHT_SCHEMES:
        raise OptionError(f"--weights {weights!r} is not known; use one of {', '.join(WEIGHT_SCHEMES)}")
    return ServeSettings(model=model or (spec.model if spec else DEFAULT_MODEL),
                         device=device or (spec.device if spec else "auto"),
                         dtype=dtype or (spec.dtype if spec else "auto"),
                         weights=(weights or (spec.weights if spec else "auto")).lower(),
                         kv_budget_tokens=budget.tokens if budget else None,
                         kv_budget_bytes=budget.bytes if budget else None,
                         graphs=not no_graphs and (spec.graphs if spec else True),
                         canonicalize=canonicalize or bool(spec and spec.canonicalize),
                         max_num_seqs=max_num_seqs or (run_sequences(len(spec.agents)) if spec is not None
                                                       else EngineOptions().max_num_seqs))


def _announce(listener: socket.socket, engine, served, as_json: bool) -> None:
    host, port = listener.getsockname()[:2]
    info = {"url": f"http://{_url_host(host)}:{port}/v1", "model": served.name, "host": host, "port": port,
            "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
            "weights": engine.weights.to_json(), "kv_tokens": engine.kv_capacity_tokens, "trunk_tokens": served.trunk_tokens,
            "trunk_blocks": served.trunk_blocks, "max_num_seqs": engine.scheduler.max_num_seqs}
    if as_json:
        print(json.dumps(info), flush=True)
        return
    trunk = f"; trunk of {served.trunk_tokens} tokens pinned" if served.trunk_tokens else ""
    weights = f"weights {engine.weights.total_bytes / 1e9:.2f} GB · {engine.weights.label}"
    print(f"swarm serve: {served.name} on {info['url']} ({info['device']}, {info['dtype']}, {weights}, "
          f"KV {info['kv_tokens']} tokens{trunk})", flush=True)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
