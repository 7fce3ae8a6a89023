"""Tokens per second over a sliding window, cheap enough to feed on every token.

`add` is called by the decode loop; `rate` may be called from the dashboard's drawing thread,
so it reads a copy and never changes the window."""
from __future__ import annotations

from collections import deque


class Throughput:
    def __init__(self, window: float = 3.0):
        self.window = window
        self.marks: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, now: float, count: int = 1) -> None:
        self.total += count
        if self.marks and self.marks[-1][0] == now:
            self.marks[-1] = (now, self.marks[-1][1] + count)
        else:
            self.marks.append((now, count))
        while self.marks[0][0] < now - self.window:
            self.marks.popleft()

    def rate(self, now: float) -> float:
        marks = [mark for mark in list(self.marks) if mark[0] >= now - self.window]
        if not marks:
            return 0.0
        span = max(now - marks[0][0], min(self.window, 1.0))
        return sum(count for _, count in marks) / span
