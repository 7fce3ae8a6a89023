"""What changes between agents or runs, as patterns to look for in text that should be static.

`Volatiles.detect` reads this machine's actual values (working directory, home, hostname,
git branch and commit); `find_volatile` matches them and the generic shapes (dates, times,
UUIDs, hex ids, absolute paths, PIDs) and returns non-overlapping spans, the more specific
kind winning where two overlap.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

from swarm.agent_context import git_branch

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
GENERIC_PATTERNS: list[tuple[str, str]] = [
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    ("timestamp", r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"),
    ("git_hash", r"\b[0-9a-f]{40}\b"),
    ("hex_id", r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{16,}\b"),
    ("home_dir", r"(?<![\w/.-])(?:~[\w.-]*(?=/)|/home/[\w.-]*\w|/Users/[\w.-]*\w|/root\b)(?:/[\w.-]*\w)*"
                 r"|[A-Za-z]:\\Users\\[\w.\\-]+"),
    ("abs_path", r"(?<![\w:/.~-])(?:/[\w.-]*\w){2,}|(?<![\w:/.~-])/(?:tmp|var|etc|opt|usr|srv|mnt|"
                 r"workspace|data)\b|\b[A-Za-z]:\\[\w.\\-]+"),
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
