"""The engine behind an event loop (vLLM's AsyncLLMEngine): one thread owns the LLMEngine and
steps it; asyncio code submits requests and reads each one's tokens from its own queue.

    event loop                                    engine thread (the only one touching LLMEngine)
    generate() ── submit(add) ──────────────────►  drain commands: add, cancel, call
       await queue.get() ◄─ call_soon_threadsafe ─  step(): one delta per request per step
    aclose() / cancelled ── submit(cancel) ─────►  release(seq): its blocks go back to the pool

Every request in the engine decodes in the same batch, whoever sent it. A step that raises
fails the requests it was running (RequestFailed, internal) and the loop goes on.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from engine.kv.stats import KVStats
from engine.llm_engine import LLMEngine, StepResult
from engine.sampling import SamplingParams
from engine.sequence import Sequence, SequenceStatus

log = logging.getLogger("swarm.engine")


@dataclass(slots=True)
class GenerationDelta:
    """What one step added to a request: its new tokens and, on the last one, why it ended."""

    token_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    finish_reason: str | None = None


class RequestFailed(Exception):
    """The engine could not finish a request. `internal`: the server's fault, not the request's."""

    def __init__(self, message: str, internal: bool = True):
        super().__init__(message)
        self.internal = internal


@dataclass(slots=True)
class EngineCounters:
    requests_added: int = 0
    finished: Counter = field(default_factory=Counter)  # by finish reason, "cancelled" included
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    step_errors: int = 0

    def copy(self) -> "EngineCounters":
        return EngineCounters(self.requests_added, Counter(self.finished), self.prompt_tokens,
                              self.cached_tokens, self.generation_tokens, self.step_errors)


@dataclass(slots=True)
class EngineSnapshot:
    """The engine's state at one moment between steps, read in the engine thread."""

    kv: KVStats
    num_running: int
    num_waiting: int
    num_preemptions: int
    counters: EngineCounters


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    seq: Sequence | None = None
    counted_cache: bool = False

    def put(self, item: GenerationDelta | RequestFailed) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.counters = EngineCounters()
        self._commands: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._streams: dict[int, _Stream] = {}
        self._thread = threading.Thread(target=self._run, name="swarm-engine", daemon=True)
        self._stopping = False
        self._step_watchers: list[Callable[[LLMEngine], None]] = []

    def start(self) -> "AsyncEngine":
        self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Fails what is still running; the engine thread ends after its current step."""
        self._stopping = True
        self._commands.put(None)
        self._thread.join(timeout)

    def watch_steps(self, watcher: Callable[[LLMEngine], None]) -> None:
        """`watcher(engine)` after every step, in the engine thread, before the step's tokens go out: it sees
        every request the step ran still holding its blocks. It must return quickly."""
        self._step_watchers.append(watcher)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       request_id: str = "") -> AsyncIterator[GenerationDelta]:
        """Deltas until the request finishes. Closing the iterator early (aclose, cancellation)
        releases the request in the engine, and with it its blocks."""
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._submit(lambda: self._add(stream, list(prompt_ids), params, request_id))
        done = False
        try:
            while not done:
                item = await stream.queue.get()
                if isinstance(item, RequestFailed):
                    done = True
                    raise item
                done = item.finish_reason is not None
                yield item
        finally:
            if not done:  # after a shutdown nobody runs this, and nothing is left to release
                self._commands.put(lambda: self._cancel(stream))

    def call(self, fn: Callable[[LLMEngine], object]) -> Future:
        """Run `fn(engine)` in the engine thread between steps; its result comes back in a Future."""
        future: Future = Future()

        def run() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(self.engine))
                except BaseException as err:  # handed to the caller, who re-raises it
                    future.set_exception(err)
        self._submit(run)
        return future

    async def max_request_tokens(self, prompt_ids: list[int]) -> int:
        """LLMEngine.max_request_tokens, asked in the engine thread: the pool is that thread's alone."""
        return await asyncio.wrap_future(self.call(lambda engine: engine.max_request_tokens(prompt_ids)))

    async def snapshot(self) -> EngineSnapshot:
        return await asyncio.wrap_future(self.call(self._snapshot))

    def snapshot_blocking(self, timeout: float = 30.0) -> EngineSnapshot:
        return self.call(self._snapshot).result(timeout)

    # --- the engine thread -------------------------------------------------------------------

    def _submit(self, command: Callable[[], None]) -> None:
        if self._stopping:
            raise RequestFailed("the server is shutting down")
        self._commands.put(command)

    def _run(self) -> None:
        running = True
        while running:
            try:
                running = self._drain(block=not self.engine.has_work())
                if running and self.engine.has_work():
                    self._step()
            except Exception:  # a bug here must not end the loop every request waits on
                log.exception("engine loop error")
                time.sleep(0.1)
        self._stopping = True
        self._drain_rest()
        for stream in list(self._streams.values()):
            self._end(stream, RequestFailed("the server is shutting down"))

    def _drain(self, block: bool) -> bool:
        """Run the queued commands; False once asked to stop."""
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return True
        while command is not None:
            self._run_command(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
        return False

    def _drain_rest(self) -> None:
        """After the stop: commands that raced it still run, so their callers get an answer."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command is not None:
                self._run_command(command)

    @staticmethod
    def _run_command(command: Callable[[], None]) -> None:
        try:
            command()
        except Exception:  # engine-side code: log it and keep the loop alive
            log.exception("engine command failed")

    def _add(self, stream: _Stream, prompt_ids: list[int], params: SamplingParams, request_id: str) -> None:
        try:
            stream.seq = self.engine.add_request(prompt_ids, params, request_id=request_id)
        except Exception as err:
            stream.put(RequestFailed(str(err), internal=False))
            return
        self._streams[stream.seq.seq_id] = stream
        self.counters.requests_added += 1
        self.counters.prompt_tokens += len(prompt_ids)

    def _cancel(self, stream: _Stream) -> None:
        if stream.seq is None or self._streams.pop(stream.seq.seq_id, None) is None:
            return  # it finished (or never started) before the cancel arrived
        self.engine.release(stream.seq)
        self.counters.finished["cancelled"] += 1

    def _step(self) -> None:
        try:
            result = self.engine.step()
            for watcher in self._step_watchers:
                self._run_command(lambda: watcher(self.engine))
            self._deliver(result)
        except Exception as err:
            log.exception("engine step failed")
            self.counters.step_errors += 1
            self._fail_running(f"the engine step failed: {type(err).__name__}: {err}")

    def _deliver(self, result: StepResult) -> None:
        new_tokens: dict[int, list[int]] = {}
        for seq, token in result.new_tokens:
            new_tokens.setdefault(seq.seq_id, []).append(token)
        self.counters.generation_tokens += len(result.new_tokens)
        finished = {seq.seq_id for seq in result.finished}
        for seq_id, tokens in new_tokens.items():
            stream = self._streams.get(seq_id)
            if stream is not None and seq_id not in finished:
                stream.put(self._delta(stream, tokens))
        for seq in result.finished:
            stream = self._streams.get(seq.seq_id)
            if stream is None:
                continue
            if seq.finish_reason == "error":
                self._end(stream, RequestFailed(seq.error or "the request failed"))
            else:
                self._end(stream, self._delta(stream, new_tokens.get(seq.seq_id, []), seq.finish_reason))

    def _delta(self, stream: _Stream, tokens: list[int], finish_reason: str | None = None) -> GenerationDelta:
        seq = stream.seq
        if not stream.counted_cache:
            stream.counted_cache = True
            self.counters.cached_tokens += seq.num_cached_tokens
        return GenerationDelta(tokens, seq.num_prompt_tokens, seq.num_cached_tokens, finish_reason)

    def _end(self, stream: _Stream, item: GenerationDelta | RequestFailed) -> None:
        """The request's last message: it leaves the engine and the stream table."""
        self._streams.pop(stream.seq.seq_id, None)
        self.engine.release(stream.seq)
        reason = "error" if isinstance(item, RequestFailed) else item.finish_reason
        self.counters.finished[reason] += 1
        stream.put(item)

    def _fail_running(self, message: str) -> None:
        """After a failed step: the requests that were computing fail; waiting ones go on."""
        for stream in list(self._streams.values()):
            if stream.seq.status == SequenceStatus.RUNNING:
                self._end(stream, RequestFailed(message))

    def _snapshot(self, engine: LLMEngine) -> EngineSnapshot:
        scheduler = engine.scheduler
        return EngineSnapshot(kv=engine.kv_stats(), num_running=len(scheduler.running) + len(scheduler.prefilling),
                              num_waiting=len(scheduler.waiting), num_preemptions=scheduler.num_preemptions,
                              counters=self.counters.copy())
