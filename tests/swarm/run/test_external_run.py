"""`swarm run` with an external harness, end to end as a user runs it: the fake harness CLI
(tests/helpers/fake_harness.py) as the agents, on the tiny model served in the run's own process."""
import json
import os
import signal

import pytest

from tests.helpers.external_specs import only_run, write_external_spec
from tests.helpers.processes import HANG_GUARD, is_running, wait_for
from tests.helpers.runs import read_transcript, swarm


# the three APIs' clients are tried in tests/swarm/run/test_fake_harness_protocols.py
@pytest.mark.parametrize("api", ["anthropic"])
def test_each_agent_runs_its_cli_and_the_second_starts_on_the_firsts_cached_trunk(tmp_path, api):
    spec, runs = write_external_spec(tmp_path, api)
    process = swarm("run", spec, "--json")
    out, err = process.communicate(timeout=HANG_GUARD * 6)
    assert process.returncode == 0, err
    summary = json.loads(out)
    assert summary["status"] == "completed" and summary["harness"] == "fake" and summary["api"] == api
    first, second = summary["agents"]
    assert [first["exit_code"], second["exit_code"]] == [0, 0]
    assert first["requests"] >= 1 and second["requests"] >= 1
    # the first request of the second agent starts with the first agent's system text and tools, and
    # where a mount namespace puts both at one path, so does the cwd at the end of it: nearly all of it
    assert second["cached_tokens_per_request"][0] > 0
    if first["confinement"] == "mount-namespace":
        assert second["cached_tokens_per_request"][0] >= 0.9 * second["prompt_tokens"] / second["requests"]
    run_dir = only_run(runs)
    for agent in summary["agents"]:
        events = read_transcript(run_dir / agent["transcript"])
        assert [e["event"] for e in events] == ["started", "finished"] * agent["requests"]
        assert events[0]["request"]["stream"] is True and events[1]["cached_tokens"] == agent[
            "cached_tokens_per_request"][0]
        assert (run_dir / agent["stdout"]).read_text().strip()   # the CLI's own output, one line a turn
        assert agent["workspace"] == str(run_dir / "workspaces" / agent["name"])
        home_file = run_dir / "homes" / agent["name"] / "settings.json"   # the template's files, in its own home
        assert json.loads(home_file.read_text()) == {"workspace": agent["seen_workspace"]}
        # the fake CLI asks for 256 tokens a reply; sampling.max_tokens caps every reply at 8
        assert all(e["generated_tokens"] <= 8 for e in events if e["event"] == "finished")
        assert events[0]["request"]["max_tokens"] == 256
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    # what the first two agents' first requests share is the trunk, pinned, and the engine's figures add up
    trunk, memory = summary["trunk"], summary["memory"]
    assert trunk["pinned"] and trunk["blocks"] == -(-trunk["tokens"] // memory["block_size"]) > 0
    # the trunk is all the two share: the second found no more than it in the cache
    assert trunk["tokens"] >= second["cached_tokens_per_request"][0] and trunk["from_agents"] == ["agent-1", "agent-2"]
    assert memory["trunk_tokens"] == trunk["tokens"] and memory["samples"] > 0
    for reading in (memory["peak"], memory["final"]):
        assert reading["used_bytes"] == (reading["shared_bytes"] + reading["private_bytes"]
                                         + reading["trunk_private_bytes"] + reading["pinned_only_bytes"])
    assert memory["final"]["trunk_private_bytes"] == trunk["bytes"]   # every CLI gone: the trunk is left
    assert sum(agent["peak_shared_bytes"] + agent["peak_private_bytes"] for agent in summary["agents"]) > 0
    for agent in summary["agents"]:   # the plain lines: one per answered request
        assert f"{agent['name']} request {agent['requests']} answered" in err


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_stops_every_cli_process_tree_and_the_summary_says_interrupted(tmp_path, stop_signal):
    spec, runs = write_external_spec(tmp_path, agents=2, extra=", --spawn-child")
    process = swarm("run", spec, start_new_session=True)
    assert wait_for(lambda: runs.exists() and any(runs.iterdir()))
    stdout_log = lambda: only_run(runs) / "agent-agent-1.stdout.log"   # noqa: E731
    # the model loads and the CLI starts first: a busy machine may take a while, so the guard is long
    assert wait_for(lambda: stdout_log().exists() and stdout_log().read_text().strip(), guard=HANG_GUARD * 4)
    pids = [int(word) for word in stdout_log().read_text().split()]
    assert len(pids) == 4 and all(map(is_running, pids))
    if stop_signal == signal.SIGINT:   # as a terminal's Ctrl-C: to the run's whole process group
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGTERM)
    process.communicate(timeout=HANG_GUARD)
    assert process.returncode == 128 + stop_signal
    assert not any(map(is_running, pids))
    summary = json.loads((only_run(runs) / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["agents"][0]["end_reason"] == "interrupted" and summary["agents"][0]["exit_code"] is not None
