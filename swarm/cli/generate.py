"""`swarm models` and `swarm generate`: the engine on its own, for a quick look at a model."""
from __future__ import annotations

import json
import sys
import time

import typer
from rich.console import Console
from rich.table import Table

from engine import DEFAULT_MODEL, NAMED_MODELS


def models(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List the named models swarm knows and whether each is installed."""
    rows = [{"name": m.name, "installed": m.path() is not None, "install": m.install,
             "description": m.description, "path": str(m.path() or "")} for m in NAMED_MODELS.values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("name", "installed", "description", "install with")
    for row in rows:
        table.add_row(row["name"], "yes" if row["installed"] else "no", row["description"], row["install"])
    Console().print(table)


def generate(
    prompt: str = typer.Argument(..., help="The prompt text."),
    model: str = typer.Option(DEFAULT_MODEL, "--model", "-m",
                              help="A named model (see `swarm models`), a Hugging Face folder or a .gguf file."),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt as a user message in the model's chat template."),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", help="Most new tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 is greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass."),
    top_k: int = typer.Option(0, help="Keep only the k most likely tokens (0: all)."),
    seed: int = typer.Option(None, help="Seed for reproducible sampling."),
    device: str = typer.Option("auto", help="auto, cpu or cuda (cuda also covers ROCm)."),
    dtype: str = typer.Option("auto", help="auto, float32, bfloat16 or float16."),
    weights: str = typer.Option("auto", help="auto (a GGUF's own formats, a checkpoint's dtype), float, "
                                             "or q8_0, q5_1, q5_0, q4_1, q4_0 (a checkpoint quantized at load)."),
    no_graphs: bool = typer.Option(False, "--no-graphs", help="Decode eagerly on a GPU, without CUDA/HIP graphs."),
) -> None:
    """Generate text for one prompt, streaming it as it is decoded."""
    from engine import EngineOptions, LLMEngine
    from swarm.server.chat_output import OutputText

    params = _params(max_tokens, temperature, top_p, top_k, seed)
    engine = LLMEngine(model, EngineOptions(device=device, dtype=dtype, weights=weights, cuda_graphs=not no_graphs))
    tokenizer = engine.tokenizer
    text = prompt
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=True)
    seq = engine.add_request(ids, params)
    started, output = time.perf_counter(), OutputText(tokenizer, stop=[], tool_calls=False)
    while not seq.is_finished:
        engine.step()
        sys.stdout.write(output.add(seq.output_token_ids[len(output.token_ids):]))
        sys.stdout.flush()
    elapsed = time.perf_counter() - started
    print(file=sys.stdout, flush=True)
    print(f"[{seq.num_output_tokens} tokens, {seq.num_output_tokens / elapsed:.1f} tok/s, "
          f"finish: {seq.finish_reason}]", file=sys.stderr)


def _params(max_tokens, temperature, top_p, top_k, seed):
    from engine import OptionError, SamplingParams

    try:
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    except ValueError as err:
        raise OptionError(str(err)) from None
