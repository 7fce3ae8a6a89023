"""Listening, and serving an app in a background thread: what `swarm serve` binds before the model
loads, and what `swarm run` serves its harness agents from, on a port the OS picks.

    bind(host, port) -> socket      taken first, so a busy port fails at once, with one line
    BackgroundServer(app, socket)   uvicorn in a daemon thread: start() returns once it accepts
"""
from __future__ import annotations

import socket
import threading
import time

from engine import SwarmError

START_SECONDS = 20


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, taken before the model loads so a busy port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except (OSError, OverflowError) as err:
        sock.close()
        reason = getattr(err, "strerror", None) or str(err)
        raise SwarmError(f"cannot listen on {host}:{port}: {reason}; pass another --port "
                         "(0 picks a free one) or --host") from None
    return sock


class BackgroundServer:
    """`app` on `listener` in a daemon thread."""

    def __init__(self, app, listener: socket.socket, log_level: str = "warning"):
        import uvicorn

        self.listener = listener
        self.port = listener.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [listener]}, daemon=True,
                                       name="swarm-server")

    @property
    def url(self) -> str:
        """The server's root, http://127.0.0.1:PORT (OpenAI clients add /v1)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + START_SECONDS
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SwarmError(f"the loopback server did not start within {START_SECONDS} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.listener.close()
