import pytest

from engine.errors import SpecError
from swarm.run.local_backend import first_turns
from swarm.run.setup import TURN_STOP, engine_options, make_agents, prepare_ground
from swarm.spec.schema import load_spec
from swarm.trunk.canonical import build_prompts
from tests.helpers.runs import EXAMPLE_WORKSPACE, tiny_tokenizer, write_run_spec


def spec_in(folder, **changes):
    path = write_run_spec(folder, folder / "no-model-needed", agents=[{"name": "a"}, {"name": "b"}])
    text = path.read_text()
    for old, new in changes.items():
        text = text.replace(old, new)
    path.write_text(text)
    return load_spec(path, check_model=False)


def set_up(spec, run_dir):
    """What a run on swarm's own engine sets up: the ground, the prompts on the trunk, the agents."""
    ground = prepare_ground(spec, run_dir)
    prompts = build_prompts(tiny_tokenizer(), ground.source, spec.agents, ground.environments)
    turns = first_turns(spec, ground, prompts)
    agents = make_agents(spec, ground, {name: turn.prompt_tokens for name, turn in turns.items()}, 2048,
                         usage=False, emit=lambda event: None)
    return ground, prompts, turns, agents


def test_copy_mode_gives_each_agent_its_own_workspace_and_a_prompt_on_the_trunk(tmp_path):
    run_dir = tmp_path / "run"
    ground, prompts, turns, agents = set_up(spec_in(tmp_path), run_dir)
    trunk = prompts.trunk.token_ids
    assert [agent.name for agent in agents] == ["a", "b"]
    for agent, prompt in zip(agents, prompts.agents):
        assert ground.workspaces[agent.name].root == (run_dir / "workspaces" / agent.name).resolve()
        assert (ground.workspaces[agent.name].root / "README.md").exists()
        assert prompt.prompt_ids[:len(trunk)] == trunk
        assert agent.prompt_tokens == agent.context_tokens == len(prompt.prompt_ids)
        assert agent.params.stop == TURN_STOP and agent.limits.max_context == 2048
        assert agent.toolbox.names == ("read_file", "write_file") and not agent.toolbox.allow_commands
    assert [agent.params.seed for agent in agents] == [7, 8]  # equal tasks still diverge
    messages = {name: turn.messages for name, turn in turns.items()}
    assert [m["role"] for m in messages["a"]] == ["system", "user"]
    assert "Working directory: " + str(ground.workspaces["a"].root) in messages["a"][1]["content"]
    assert messages["a"][0]["tokens"] + messages["a"][1]["tokens"] == turns["a"].prompt_tokens


def test_shared_readonly_agents_read_the_source_in_place(tmp_path):
    spec = spec_in(tmp_path, **{"mode: copy": "mode: shared-readonly"})
    ground, _, _, _ = set_up(spec, tmp_path / "run")
    for workspace in ground.workspaces.values():
        assert workspace.root == EXAMPLE_WORKSPACE.resolve() and workspace.read_only
    assert not (tmp_path / "run" / "workspaces").exists()


def test_shared_readonly_with_run_command_is_refused_with_a_fix(tmp_path):
    with pytest.raises(SpecError, match="run_command.enabled: false or workspace.mode: copy"):
        spec_in(tmp_path, **{"mode: copy": "mode: shared-readonly", "harness: tiny-harness.json": "",
                             "enabled: false": "enabled: true"})


def test_the_engine_runs_as_many_sequences_at_once_as_the_run_has_agents_and_a_trunk(tmp_path):
    """What a GPU engine sizes its profile step and a hybrid's state reserve by (engine.kv.sizing)."""
    assert engine_options(spec_in(tmp_path)).max_num_seqs == 2 + 1
