"""A run on swarm's own engine, in this process: one engine sequence per agent, its history
extended in place turn after turn, so it is never prefilled again.

    open         load the model once
    share_trunk  prefill the canonical trunk once and pin it: every agent's prompt starts with it,
                 so its blocks are shared and only each agent's suffix is computed
    poll         one batched engine step -> what it did for each agent, as TurnEvents
    extend       the tool results in the model's chat format, appended to the agent's sequence

Only the run's thread touches the engine.
"""
from __future__ import annotations

import time
from functools import cached_property
from typing import Callable

from engine import (
    EngineOptions,
    KVFloor,
    LLMEngine,
    SamplingParams,
    Sequence,
    StepResult,
    SwarmError,
)
from swarm.agents.agent import Agent
from swarm.agents.progress import PartialTurn, Reply, ToolJob, TurnEvent
from swarm.agents.tool_response import ToolResponseFormat
from swarm.run.backend import ContextFull, FirstTurn, Note
from swarm.run.facts import LOCAL_FACTS
from swarm.run.memory import TRUNK_REQUEST_ID, MemorySnapshot, RunMemory
from swarm.run.setup import SwarmGround, engine_options
from swarm.run.summary import RunInfo, RunTimings
from swarm.spec.schema import SwarmSpec
from swarm.trunk.canonical import PromptSet, build_prompts
from swarm.trunk.fit import stand_in_prompts
from swarm.trunk.suffix import first_user_message


class LocalBackend:
    facts = LOCAL_FACTS

    def __init__(self, spec: SwarmSpec, engine: LLMEngine | None = None):
        """`engine`: one already loaded (tests, a harness); else `open` loads the spec's model."""
        self.spec = spec
        self.engine = engine
        self.memory = RunMemory(MemorySnapshot(), [agent.name for agent in spec.agents])
        self.timings = RunTimings()
        self.prompts: PromptSet | None = None
        self.prompt_ids: dict[str, list[int]] = {}
        self.seqs: dict[str, Sequence] = {}
        """Each agent's sequence, kept for reading once it has ended."""
        self.holding: dict[str, Sequence] = {}
        """The sequences that still hold KV: their agents have not ended."""
        self.names: dict[int, str] = {}
        """seq_id -> agent."""
        self.queued: dict[str, bool] = {}
        """What each agent was last told: its turn waits for the scheduler to admit it."""

    @cached_property
    def responses(self) -> ToolResponseFormat:
        """How tool results are appended, in the model's chat format."""
        return ToolResponseFormat(self.engine.tokenizer)

    @property
    def max_context(self) -> int:
        return self.engine.config.max_position_embeddings

    def describe(self, info: RunInfo) -> None:
        pass  # known once the model is loaded

    def open(self, info: RunInfo, timings: RunTimings, note: Note) -> None:
        note(f"loading {self.spec.model}")
        if self.engine is None:
            self.engine = LLMEngine(self.spec.model, self._engine_options())
        engine = self.engine
        info.model = engine.source.display_name
        info.device, info.dtype = str(engine.device), str(engine.dtype).removeprefix("torch.")
        info.weights = engine.weights
        info.weight_bytes = engine.weights.total_bytes
        self.timings = timings

    def set_up(self, spec: SwarmSpec, ground: SwarmGround, info: RunInfo, note: Note) -> dict[str, FirstTurn]:
        self.prompts = build_prompts(self.engine.tokenizer, ground.source, spec.agents, ground.environments)
        info.trunk_sha256 = self.prompts.trunk.sha256
        for agent, prompt in zip(spec.agents, self.prompts.agents):
            self.add_agent(agent.name, prompt.prompt_ids)
        return first_turns(spec, ground, self.prompts)

    def add_agent(self, name: str, prompt_ids: list[int]) -> None:
        """An agent whose first turn is `prompt_ids`."""
        self.prompt_ids[name] = list(prompt_ids)

    def share_trunk(self, before_step: Callable[[], None], after_step: Callable[[], None]) -> int:
        trunk_ids = self.prompts.trunk.token_ids
        if len(trunk_ids) >= self.max_context:
            raise SwarmError(f"the trunk has {len(trunk_ids)} tokens, the model's context is {self.max_context}; "
                             "use fewer rules or tools, or a model with a longer context")
        if trunk_ids:
            seq = self.engine.add_request(trunk_ids, SamplingParams(max_tokens=1), request_id=TRUNK_REQUEST_ID,
                                          prefill_only=True)
            while seq.finish_reason is None:
                before_step()
                self._step()
                after_step()
            if seq.finish_reason == "error":
                raise SwarmError(f"the trunk does not fit in the KV pool: {seq.error}")
            self.engine.pin(seq)
            self.memory.set_trunk(len(trunk_ids), len(seq.block_table))
        return len(trunk_ids)

    def begin(self, agent: Agent) -> list[TurnEvent]:
        ids = self.prompt_ids[agent.name]
        max_context = agent.limits.max_context
        if len(ids) >= max_context:
            return [TurnEvent(agent.name, "failed", reason="context_full",
                              error=f"the prompt has {len(ids)} tokens, the model's context is {max_context}; "
                                    "shorten the rules, tools or task")]
        seq = self.engine.add_request(ids, agent.turn_params(len(ids)), request_id=agent.name, keep_kv=True)
        self.seqs[agent.name], self.names[seq.seq_id] = seq, agent.name
        self.holding[agent.name] = seq
        self.queued[agent.name] = not seq.num_computed_tokens
        return [TurnEvent(agent.name, "queued", queued=self.queued[agent.name])]

    def has_work(self) -> bool:
        return self.engine.has_work()

    def poll(self, timeout: float) -> list[TurnEvent]:
        result = self._step()
        events = self._queue_changes()
        events += [TurnEvent(self.names[seq.seq_id], "prefilled", context_tokens=seq.num_computed_tokens)
                   for seq in result.prefilled]
        events += [TurnEvent(self.names[seq.seq_id], "tokens", tokens=1) for seq, _ in result.new_tokens]
        if result.finished or result.prefilled:
            self.sample_memory()  # before turn ends release anything: the peaks are here
        return events + [self._turn_end(seq) for seq in result.finished]

    def extend(self, agent: Agent, job: ToolJob) -> int:
        seq = self.seqs[agent.name]
        ids = self.responses.continuation_ids(job.outputs, job.end_token)
        context = len(seq) + len(ids)
        if context >= agent.limits.max_context - 1:
            raise ContextFull()
        self.engine.extend(seq, ids, agent.turn_params(context))
        return len(ids)

    def stop_turns(self) -> list[TurnEvent]:
        return []  # the engine only steps when polled

    def partial(self, agent: Agent) -> PartialTurn | None:
        seq = self.seqs.get(agent.name)
        if seq is None or not seq.num_output_tokens:
            return None
        return PartialTurn(self.engine.tokenizer.decode(seq.output_token_ids), seq.num_output_tokens)

    def release(self, agent: Agent) -> None:
        seq = self.holding.pop(agent.name, None)
        if seq is not None:
            self.engine.release(seq)

    def sample_memory(self) -> None:
        self.memory.observe_engine(self.engine.kv_stats())

    def agents_ended(self) -> None:
        pass  # the engine's figures are read as the run settles

    def close(self) -> None:
        pass  # the engine lives as long as the process

    def sequence(self, agent: str) -> Sequence | None:
        """The agent's engine sequence: its whole conversation, token by token."""
        return self.seqs.get(agent)

    # --- inside -----------------------------------------------------------------------------

    def _step(self) -> StepResult:
        started = time.perf_counter()
        result = self.engine.step()
        seconds = time.perf_counter() - started
        timings = self.timings
        timings.steps += 1
        timings.step_seconds += seconds
        if result.decode_only:
            timings.decode_steps += 1
            timings.decode_seconds += seconds
            timings.decode_tokens += len(result.new_tokens)
        return result

    def _queue_changes(self) -> list[TurnEvent]:
        changes = []
        for name, seq in self.holding.items():
            queued = not seq.num_computed_tokens
            if queued != self.queued[name]:
                self.queued[name] = queued
                changes.append(TurnEvent(name, "queued", queued=queued))
        return changes

    def _turn_end(self, seq: Sequence) -> TurnEvent:
        name = self.names[seq.seq_id]
        if seq.finish_reason == "error":
            return TurnEvent(name, "failed", reason="error", error=seq.error or "the engine failed this request")
        last = seq.token_ids[-1]
        end_token = last if last in self.engine.eos_token_ids or last in seq.params.stop_token_ids else None
        reply = Reply(self.engine.tokenizer.decode(seq.output_token_ids), seq.finish_reason, seq.num_output_tokens,
                      context_tokens=len(seq), end_token=end_token)
        return TurnEvent(name, "turn_end", reply=reply)

    def _engine_options(self) -> EngineOptions:
        return engine_options(self.spec, run_kv_floor(self.spec))


def run_kv_floor(spec: SwarmSpec) -> KVFloor:
    """The KV the run cannot start without (the engine fails at start below it): its trunk, as the
    run will build it, and the longest agent's first prompt after it and its first new token, as
    swarm.trunk.fit asks of a kv_budget. Later turns that outgrow the pool fail that agent alone."""
    prompts = stand_in_prompts(spec, spec.out or spec.path.parent)
    trunk = len(prompts.trunk.token_ids)
    longest = max(len(agent.prompt_ids) for agent in prompts.agents)
    return KVFloor(trunk, longest + 1 - trunk)


def first_turns(spec: SwarmSpec, ground: SwarmGround, prompts: PromptSet) -> dict[str, FirstTurn]:
    """Each agent's system and first user message, as its transcript records them, with the
    prompt's tokens: the trunk's and the agent's suffix."""
    turns = {}
    for agent, prompt in zip(spec.agents, prompts.agents):
        user = first_user_message(agent, ground.environments[agent.name])
        turns[agent.name] = FirstTurn(
            [{"role": "system", "rendered": prompt.system_text, "tokens": len(prompt.system_ids)},
             {"role": "user", "content": user, "rendered": prompt.suffix_text, "tokens": len(prompt.suffix_ids)}],
            prompt_tokens=len(prompt.prompt_ids))
    return turns
