"""swarm/run/memory.py's `by_agent` on a real engine's KV rows, as an external harness run reads them: requests
named by their agents, the trunk's own request pinned, and figures that add up."""
from engine import SamplingParams
from swarm.cli.plain_view import describe_linear_state
from swarm.run.memory import TRUNK_REQUEST_ID, MemorySnapshot, RunMemory, by_agent
from tests.helpers.runs import tiny_model
from tests.helpers.serving import start_engine
from tests.helpers.tiny_models import make_tiny_model

TRUNK = list(range(3, 3 + 40))   # two and a half blocks of 16


def test_requests_named_by_their_agents_give_figures_that_add_up(tmp_path_factory):
    engine = start_engine(tiny_model(tmp_path_factory.getbasetemp()))
    trunk = engine.add_request(TRUNK, SamplingParams(max_tokens=1), request_id=TRUNK_REQUEST_ID, prefill_only=True)
    while trunk.finish_reason is None:
        engine.step()
    pinned = engine.pin(trunk)   # as the runs do: the trunk's request keeps its blocks, pinned
    size = engine.blocks.block_size
    assert len(pinned) == -(-len(TRUNK) // size)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for request_id, own in (("req-1", [61, 62]), ("req-2", [63]), ("req-3", [64, 65, 66])):
        engine.add_request(TRUNK + own, params, request_id=request_id)
    engine.step()   # all three prefilled: each holds the pinned blocks and its own
    stats = engine.kv_stats()
    agent_of = {"req-1": "alpha", "req-2": "beta", "req-3": "alpha"}   # alpha has two requests in flight
    named = by_agent(stats, {**agent_of, TRUNK_REQUEST_ID: TRUNK_REQUEST_ID})
    assert sorted(row.request_id for row in named.requests) == [TRUNK_REQUEST_ID, "alpha", "beta"]
    assert [row.request_id for row in by_agent(stats, agent_of).requests] == ["alpha", "beta"]   # no trunk row
    alpha = next(row for row in named.requests if row.request_id == "alpha")
    rows = {row.request_id: row for row in stats.requests}
    assert alpha.tokens == rows["req-1"].tokens + rows["req-3"].tokens
    assert alpha.shared_bytes == rows["req-1"].shared_bytes + rows["req-3"].shared_bytes

    memory = RunMemory(MemorySnapshot(), ["alpha", "beta", "gamma"])
    full = len(TRUNK) // size   # the trunk's last block is partly filled: each request copied it on write
    memory.set_trunk(len(TRUNK), len(pinned))
    snapshot = memory.observe_engine(named)
    block = stats.block_bytes
    assert snapshot.shared_bytes == full * block   # the trunk's full blocks, held by it and all three requests
    assert snapshot.trunk_private_bytes == block and snapshot.pinned_only_bytes == 0
    assert snapshot.used_bytes == snapshot.shared_bytes + snapshot.private_bytes + snapshot.trunk_private_bytes
    assert snapshot.bytes_saved == 2 * full * block   # three copies of the trunk's full blocks, one held
    assert snapshot.bytes_without_sharing == snapshot.shared_bytes + snapshot.private_bytes + snapshot.bytes_saved
    assert snapshot.agents_sharing == 2 and memory.agents["gamma"].shared_bytes == 0
    assert memory.agents["alpha"].shared_bytes == 2 * full * block


def test_a_hybrid_models_linear_state_is_in_the_readings(tmp_path):
    engine = start_engine(make_tiny_model(tmp_path / "qwen3_5", "qwen3_5"))
    trunk = engine.add_request(TRUNK, SamplingParams(max_tokens=1), request_id=TRUNK_REQUEST_ID, prefill_only=True)
    while trunk.finish_reason is None:
        engine.step()
    engine.pin(trunk)
    for request_id, own in (("req-1", [61, 62]), ("req-2", [63])):
        engine.add_request(TRUNK + own, SamplingParams(max_tokens=4, ignore_eos=True), request_id=request_id)
    engine.step()
    stats = engine.kv_stats()
    memory = RunMemory(MemorySnapshot(), ["alpha", "beta"])
    reading = memory.observe_engine(by_agent(stats, {"req-1": "alpha", "req-2": "beta",
                                                     TRUNK_REQUEST_ID: TRUNK_REQUEST_ID}))
    states = stats.states
    assert reading.state_slots == states.slots_in_use == 3   # the trunk's request and the two agents'
    assert reading.state_slot_bytes == 3 * states.bytes_per_slot > 0
    assert reading.snapshots == states.snapshots_held >= 1   # the trunk's end, at least
    assert reading.snapshot_bytes == reading.snapshots * states.bytes_per_slot
    assert describe_linear_state(reading).startswith("3 slots · ")
    assert describe_linear_state(MemorySnapshot()) is None   # a model without linear layers says nothing
