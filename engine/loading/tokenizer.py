"""Tokenizer and chat template: a `tokenizers` backend plus the model's Jinja chat template.

The template is rendered the way Hugging Face renders it (sandboxed Jinja, trim_blocks,
lstrip_blocks, loop controls, a `tojson` that keeps unicode), so prompts are byte-identical.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

from engine.errors import ModelLoadError


class Tokenizer:
    def __init__(self, backend: Backend, chat_template: str | None = None,
                 bos_token: str | None = None, eos_token: str | None = None,
                 add_bos_token: bool = False, eos_token_ids: list[int] | None = None):
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos_token = add_bos_token
        self.bos_token_id = self.token_to_id(bos_token)
        ids = list(eos_token_ids or [])
        eos_id = self.token_to_id(eos_token)
        if eos_id is not None and eos_id not in ids:
            ids.append(eos_id)
        self.eos_token_ids = ids

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Special tokens written in the text are recognised."""
        ids = self._encoding(text).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of `text` (no BOS) and the character span of each."""
        encoding = self._encoding(text)
        return list(encoding.ids), [tuple(span) for span in encoding.offsets]

    def _encoding(self, text: str):
        # encode_batch lets go of the GIL while it tokenizes (encode holds it throughout), so a long
        # prompt tokenized in a worker thread does not stop the server's event loop for seconds.
        return self.backend.encode_batch([text], add_special_tokens=False)[0]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, **extra) -> str:
        if not self.chat_template:
            raise ModelLoadError("this model has no chat template; pass plain prompts instead of messages")
        template = _compile(self.chat_template)
        return template.render(messages=messages, tools=tools,
                               add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                               **extra)

    @property
    def supports_tools(self) -> bool:
        return bool(self.chat_template) and "tools" in self.chat_template

    @classmethod
    def from_hf_folder(cls, folder: str | Path, eos_token_ids: list[int] | None = None) -> "Tokenizer":
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.exists():
            raise ModelLoadError(f"{folder}: no tokenizer.json; the model folder needs one")
        backend = Backend.from_file(str(path))
        config = _read_json(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.exists():
            template = jinja_file.read_text()
        if isinstance(template, list):
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(backend, template,
                   bos_token=_token_text(config.get("bos_token")),
                   eos_token=_token_text(config.get("eos_token")),
                   add_bos_token=bool(config.get("add_bos_token", False)),
                   eos_token_ids=eos_token_ids)


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None


def _token_text(token) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


_TEMPLATES: dict[str, jinja2.Template] = {}


def _compile(source: str) -> jinja2.Template:
    if source not in _TEMPLATES:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _TEMPLATES[source] = env.from_string(source)
    return _TEMPLATES[source]
