"""What changes between agents or runs, as patterns to look for in text that should be static.

`Volatiles.detect` reads this machine's actual values (working directory, home, hostname,
git branch and commit); `find_volatile` matches them and the generic shapes (dates, times,
UUIDs, hex ids, commits, absolute paths, hostnames, PIDs) and returns non-overlapping spans, the
more specific kind winning where two overlap. A Windows path (C:\\repo\\x.py) counts only on Windows, or
under \\Users\\ as a home: elsewhere it is an example in prose, the same on every machine.

A token counts as a hostname only when something says why (see `_HOSTNAME`):
  - it follows the word host, hostname, machine or server ("host build-7", "server: 10.0.0.5") and
    holds a digit, and it is not a technical word (x86-64, arm64, utf-8, py311, v2, 127.0.0.1);
  - or its own shape is a machine's: lowercase labels joined by "-" ending in a number that is
    zero-padded (build-07, web-001), or comes after two word labels (gpu-box-3), or an AWS-style
    ip-10-0-0-1; a domain may follow (build-07.ci.example.com);
  - or it is a name under a private suffix (.local, .internal, .lan, .localdomain, .corp,
    .home.arpa) with two labels before it or one holding a digit or "-" (ip-10-0-0-1.ec2.internal,
    gpu1.local, Johns-MacBook.local): one plain word before it is more often code (threading.local,
    err.internal) than a machine;
  - or it is a private IPv4 address (10.x.x.x, 172.16-31.x.x, 192.168.x.x); other addresses count
    only after one of the words above.
A model's id is not a host either (claude-sonnet-5, qwen-coder-3: a model family's name first).
So "re-run", "x86-64", "utf-8", "gpt-4", "llama-3" and "py311" are not hosts (one label and an
unpadded number, or no hyphen), and public domains (docs.python.org) are left alone: such an
address is the same for every agent and run. A short commit hash (7 to 40 hex digits, one of
them a digit) counts only after the word commit, revision, rev or sha ("commit 3f2a9c1d").
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from swarm.trunk.suffix import git_branch

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_IPV4 = r"\d{1,3}(?:\.\d{1,3}){3}"
_PRIVATE_IPV4 = r"(?:10(?:\.\d{1,3}){3}|192\.168(?:\.\d{1,3}){2}|172\.(?:1[6-9]|2\d|3[01])(?:\.\d{1,3}){2})"
_TECHNICAL = (r"(?:x86[-_]64|x64|amd64|arm64|aarch64|armv\d\w*|i[3-6]86|utf-?(?:8|16|32)|ucs-?[24]|latin-?\d+"
              r"|iso-?8859(?:-\d+)?|cp\d+|py\d+|python\d[\d.]*|v\d[\d.]*|127(?:\.\d+){3}|0\.0\.0\.0)")
_HOST_START = r"(?<![\w.-])(?:(?<=//)|(?<!/))"   # not inside a word or a path; a URL's host is fine
_HOST_END = r"(?![\w-]|\.\w)"
_HOST_AFTER_KEYWORD = (r"(?i:\b(?:host(?:name)?|machine|server)\b(?:\s*[:=]\s*|\s+)[`'\"]?"
                       rf"(?!{_TECHNICAL}{_HOST_END})(?=[a-z0-9.-]*\d)(?:{_IPV4}|[a-z][a-z0-9-]*(?:\.{_LABEL})*))")
# a model's id has a machine name's shape (claude-sonnet-5, qwen-coder-3) and is the same on every machine
_MODEL_FAMILY = (r"(?:claude|gpt|o\d|llama|meta-llama|codellama|qwen\d*|gemini|gemma\d*|mistral|mixtral|codestral"
                 r"|phi\d*|deepseek|smollm\d*|codex|grok|command|kimi|glm|granite|starcoder\d*)-")
_MACHINE_NAME = (rf"(?!{_MODEL_FAMILY})"
                 r"(?:[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*-0\d+|(?:[a-z][a-z0-9]*-){2,}\d+|ip(?:-\d{1,3}){4})"
                 rf"(?:\.{_LABEL})*")
_PRIVATE_DOMAIN = (rf"(?i:(?:{_LABEL}(?:\.{_LABEL})+|(?=[a-z0-9-]*[0-9-]){_LABEL})"
                   r"\.(?:local|internal|lan|localdomain|corp|home\.arpa))")
_HOSTNAME = (rf"(?:{_HOST_AFTER_KEYWORD}|{_HOST_START}(?:{_MACHINE_NAME}|{_PRIVATE_DOMAIN}|{_PRIVATE_IPV4}))"
             rf"{_HOST_END}")
GENERIC_PATTERNS: list[tuple[str, str]] = [
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    ("timestamp", r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
    ("git_hash", r"\b[0-9a-f]{40}\b"),
    ("git_hash", r"(?i)\b(?:commit|revision|rev|sha)\b\s*[:=#@]?\s*[`'\"]?(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
    ("hex_id", r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{16,}\b"),
    ("home_dir", r"(?<![\w/.-])(?:~[\w.-]*(?=/)|/home/[\w.-]*\w|/Users/[\w.-]*\w|/root\b)(?:/[\w.-]*\w)*"
                 r"|[A-Za-z]:\\Users\\[\w.\\-]+"),
    ("abs_path", r"(?<![\w:/.~-])(?:/[\w.-]*\w){2,}|(?<![\w:/.~-])/(?:tmp|var|etc|opt|usr|srv|mnt|"
                 r"workspace|data)\b" + (r"|\b[A-Za-z]:\\[\w.\\-]+" if os.name == "nt" else "")),
    ("hostname", _HOSTNAME),
    ("date", rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b|\b{_MONTH} \d{{1,2}},? \d{{4}}\b"
             rf"|\b\d{{1,2}} {_MONTH},? \d{{4}}\b"),
    ("time", r"(?<![\w:.])(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?:\s?[AaPp][Mm])?(?![\w:])"),
    ("git_branch", r"(?i)\b(?:(?:git |current )?branch\s*(?::|=|\bis\b)|on branch)\s*[`'\"]?[\w./-]*\w"),
    ("pid", r"(?i)\b(?:pid|process id)\b\s*(?:[:=#]|is)?\s*\d+"),
]
_COMPILED = [(kind, re.compile(pattern)) for kind, pattern in GENERIC_PATTERNS]
_COMMON_BRANCHES = {"main", "master", "dev", "develop", "trunk", "head", "default"}


@dataclass(frozen=True, slots=True)
class Volatiles:
    cwds: tuple[str, ...]
    home: str
    hostname: str
    branch: str
    commit: str

    @classmethod
    def detect(cls, *folders: Path) -> "Volatiles":
        cwd = Path.cwd()
        cwds = tuple(dict.fromkeys(str(p.resolve()) for p in (cwd, *folders) if str(p.resolve()) != "/"))
        return cls(cwds=cwds, home=str(Path.home()), hostname=socket.gethostname(),
                   branch=git_branch(cwd), commit=_head_commit(cwd))

    def literal_patterns(self) -> list[tuple[str, re.Pattern]]:
        patterns = [("cwd", _literal(path)) for path in sorted(self.cwds, key=len, reverse=True)]
        if self.home not in ("", "/"):
            patterns.append(("home_dir", _literal(self.home)))
        if len(self.hostname) >= 3 and self.hostname.lower() != "localhost":
            patterns.append(("hostname", _literal(self.hostname)))
        if len(self.branch) >= 3 and self.branch.lower() not in _COMMON_BRANCHES:
            patterns.append(("git_branch", _literal(self.branch)))
        if len(self.commit) >= 7:
            patterns.append(("git_hash", re.compile(rf"\b{self.commit[:7]}[0-9a-f]*\b")))
        return patterns


def find_volatile(text: str, volatiles: Volatiles | None = None) -> list[tuple[int, int, str]]:
    """(start, end, kind) of each volatile-looking span, in text order, never overlapping."""
    patterns = _COMPILED[:2] + (volatiles.literal_patterns() if volatiles else []) + _COMPILED[2:]
    spans: list[tuple[int, int, str]] = []
    for kind, pattern in patterns:
        for match in pattern.finditer(text):
            span = (match.start(), match.end(), kind)
            if span[1] > span[0] and not any(_overlap(span, kept) for kept in spans):
                spans.append(span)
    return sorted(spans)


def _literal(value: str) -> re.Pattern:
    return re.compile(rf"(?<![\w.-]){re.escape(value)}(?![\w-])(?:/[\w.-]*\w)*")


def _overlap(a: tuple[int, int, str], b: tuple[int, int, str]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _head_commit(path: Path) -> str:
    for folder in [path, *path.parents]:
        git = folder / ".git"
        if (git / "HEAD").is_file():
            head = (git / "HEAD").read_text().strip()
            if not head.startswith("ref:"):
                return head
            ref = git / head.removeprefix("ref: ").strip()
            return ref.read_text().strip() if ref.is_file() else ""
    return ""
