"""swarm.yaml's `backend:` key: which engine runs the agents.

    backend: local                      # default: swarm's own engine, in this process
    backend:
      type: openai                      # an OpenAI-compatible server: vLLM, SGLang, `swarm serve`
      base_url: http://gpu-box:8000/v1
      model: Qwen/Qwen3-8B              # the model name the server answers to
      api_key_env: OPENAI_API_KEY       # optional: the variable that holds the server's key

With `openai` the server owns the model and its memory: the top-level `model` is not loaded
(`swarm inspect-prefix` may still read it as a local copy of the tokenizer), and `device`,
`dtype`, `weights` and `kv_budget` are ignored with a note when the run starts.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from yaml.nodes import MappingNode, Node

from swarm.spec.reader import SpecReader

BACKEND_TYPES = ["local", "openai"]
BACKEND_KEYS = ["type", "base_url", "model", "api_key_env"]
ENGINE_ONLY_KEYS = ("device", "dtype", "weights", "kv_budget", "graphs", "canonicalize")
NO_API_KEY = "EMPTY"
"""Sent when the spec names no key variable: servers started without a key accept anything."""

_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(slots=True)
class BackendSpec:
    type: str = "local"
    base_url: str = ""
    model: str = ""
    api_key_env: str | None = None

    @property
    def is_remote(self) -> bool:
        return self.type != "local"

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else NO_API_KEY

    @property
    def metrics_url(self) -> str:
        """The server's Prometheus page: vLLM, SGLang and swarm serve put it beside /v1."""
        return f"{self.base_url.rstrip('/').removesuffix('/v1')}/metrics"


def read_backend(reader: SpecReader, node: Node) -> BackendSpec:
    if not isinstance(node, MappingNode):
        kind = reader.choice(node, "backend", BACKEND_TYPES)
        if kind != "local":
            raise reader.fail(node, "backend", f"{kind} needs a mapping: {{type: {kind}, base_url: "
                                               "http://host:8000/v1, model: NAME}")
        return BackendSpec()
    values = reader.mapping(node, "backend", BACKEND_KEYS, required=["type"])
    kind = reader.choice(values["type"], "backend.type", BACKEND_TYPES)
    if kind == "local":
        extra = sorted(set(values) - {"type"})
        if extra:
            raise reader.fail(values[extra[0]], f"backend.{extra[0]}", "only applies to type: openai")
        return BackendSpec()
    for key in ("base_url", "model"):
        if key not in values:
            raise reader.fail(node, f"backend.{key}", "missing required key for type: openai")
    return BackendSpec(kind, _base_url(reader, values["base_url"]), _served_model(reader, values["model"]),
                       _api_key_env(reader, values.get("api_key_env")))


def _base_url(reader: SpecReader, node: Node) -> str:
    url = reader.typed(node, "backend.base_url", str).strip()
    if not _URL.match(url):
        raise reader.fail(node, "backend.base_url", f"{url!r} is not an http(s) URL; give the server's "
                                                    "OpenAI address, like http://localhost:8000/v1")
    return url.rstrip("/")


def _served_model(reader: SpecReader, node: Node) -> str:
    model = reader.typed(node, "backend.model", str).strip()
    if not model:
        raise reader.fail(node, "backend.model", "is empty; give the model name the server serves "
                                                 "(GET <base_url>/models lists them)")
    return model


def _api_key_env(reader: SpecReader, node: Node | None) -> str | None:
    if node is None:
        return None
    name = reader.typed(node, "backend.api_key_env", str)
    if not _ENV_NAME.match(name):
        raise reader.fail(node, "backend.api_key_env", f"{name!r} is not an environment variable name; "
                                                       "name the variable that holds the key, not the key")
    if not os.environ.get(name):
        raise reader.fail(node, "backend.api_key_env", f"${name} is not set; export it with the server's "
                                                       "API key, or remove api_key_env if the server needs none")
    return name
