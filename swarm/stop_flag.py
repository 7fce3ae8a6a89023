"""Ctrl-C during a run: the first press asks the run to stop at the next step boundary, so
transcripts and the summary are written from a consistent state; a second press interrupts
at once. While the run writes its results, further presses are ignored."""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator


class StopFlag:
    def __init__(self):
        self.requested = False
        self._shielded = False

    def request(self) -> None:
        self.requested = True

    @contextmanager
    def installed(self) -> Iterator["StopFlag"]:
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        self._shielded = True
        try:
            yield
        finally:
            self._shielded = False

    def _on_sigint(self, signum, frame) -> None:
        if self.requested and not self._shielded:
            raise KeyboardInterrupt
        self.requested = True
