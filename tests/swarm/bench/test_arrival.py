"""`swarm bench-arrival` on a tiny random model: the JSON schema, the chunks the newcomer's prompt
rides in under each schedule, and the agents' tokens agreeing between the schedules.
The bench itself is not a test; this checks that it runs and reports what it measured."""
import json

import pytest
from typer.testing import CliRunner

from swarm.cli.main import app
from tests.helpers.tiny_models import make_tiny_model

N, T, S, P, CHUNK = 3, 64, 4, 90, 24
RUN_FIELDS = {"longest_gap_s", "steady_step_s", "newcomer_prefill_s", "alone_prefill_s", "steps_to_prefill",
              "gap_over_alone_prefill"}


@pytest.fixture(scope="module")
def arrival_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_arrival")
    model = make_tiny_model(root / "llama", "llama")
    out = root / "arrival.json"
    args = ["bench-arrival", "--model", str(model), "--agents", str(N), "--trunk", str(T), "--suffix", str(S),
            "--prompt", str(P), "--chunk", str(CHUNK), "--warm-steps", "2", "--repeats", "2", "--dtype", "float32",
            "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def test_arrival_bench_json_follows_the_documented_schema(arrival_run):
    document, table = arrival_run
    assert {"schema_version", "model", "device", "dtype", "threads", "cpu", "versions", "arrival"} <= set(document)
    arrival = document["arrival"]
    assert (arrival["agents"], arrival["trunk"], arrival["prompt"], arrival["chunk"]) == (N, T, P, CHUNK)
    for mode in ("mixed", "whole"):
        runs = arrival["modes"][mode]["runs"]
        assert len(runs) == 2 and all(set(run) == RUN_FIELDS for run in runs)
        assert all(run["longest_gap_s"] > 0 and run["steady_step_s"] > 0 for run in runs)
        assert arrival["modes"][mode]["median"]["gap_share"] > 0
    assert "gap / alone" in table


def test_mixed_steps_carry_the_newcomer_in_chunks_and_the_whole_schedule_in_one(arrival_run):
    modes = arrival_run[0]["arrival"]["modes"]
    chunks = -(-P // (CHUNK - N))   # the decode rows count against the mixed budget
    assert all(run["steps_to_prefill"] == chunks for run in modes["mixed"]["runs"])
    assert all(run["steps_to_prefill"] == 1 for run in modes["whole"]["runs"])


def test_both_schedules_give_the_agents_the_same_greedy_tokens(arrival_run):
    assert arrival_run[0]["arrival"]["matches"] == 1.0


def test_arrival_bench_needs_a_chunk_larger_than_the_decode_rows():
    result = CliRunner().invoke(app, ["bench-arrival", "--agents", "8", "--chunk", "8"])
    assert result.exit_code != 0
    assert "--chunk" in str(result.exception)
