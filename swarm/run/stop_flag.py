"""Ctrl-C (SIGINT) or SIGTERM (`docker stop`, systemd, a CI timeout) during a run: the first
signal asks the run to stop at the next step boundary, so transcripts and the summary are
written from a consistent state; a second one, of either kind, interrupts at once. While the
run writes its results, further signals are ignored.

The exit code then says which signal stopped the run, as a shell does: 128 + its number
(130 for SIGINT, 143 for SIGTERM).
"""
from __future__ import annotations

import signal
from contextlib import ExitStack, contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopFlag:
    def __init__(self):
        self.requested = False
        self.signal: signal.Signals | None = None
        """The first signal that asked to stop; None when none did."""
        self._shielded = False

    def request(self) -> None:
        self.requested = True

    @property
    def exit_code(self) -> int:
        """The exit code of a run this flag stopped: 128 + the signal's number."""
        return 128 + (self.signal or signal.SIGINT)

    @contextmanager
    def installed(self) -> Iterator["StopFlag"]:
        with ExitStack() as restore:
            for signum in STOP_SIGNALS:
                previous = signal.signal(signum, self._on_signal)
                restore.callback(signal.signal, signum, previous)
            yield self

    @contextmanager
    def shielded(self) -> Iterator[None]:
        self._shielded = True
        try:
            yield
        finally:
            self._shielded = False

    def _on_signal(self, signum: int, frame) -> None:
        if self.requested:
            if not self._shielded:
                raise KeyboardInterrupt
            return
        self.signal = signal.Signals(signum)
        self.requested = True
