import pytest

from engine.errors import SpecError
from swarm.run.setup import TURN_STOP, first_messages, set_up_agents
from swarm.spec.schema import load_spec
from tests.helpers.runs import EXAMPLE_WORKSPACE, tiny_tokenizer, write_run_spec


def spec_in(folder, **changes):
    path = write_run_spec(folder, folder / "no-model-needed", agents=[{"name": "a"}, {"name": "b"}])
    text = path.read_text()
    for old, new in changes.items():
        text = text.replace(old, new)
    path.write_text(text)
    return load_spec(path, check_model=False)


def test_copy_mode_gives_each_agent_its_own_workspace_and_a_prompt_on_the_trunk(tmp_path):
    run_dir = tmp_path / "run"
    setup = set_up_agents(spec_in(tmp_path), tiny_tokenizer(), 2048, run_dir, lambda event: None)
    trunk = setup.prompts.trunk.token_ids
    assert [agent.name for agent in setup.agents] == ["a", "b"]
    for agent in setup.agents:
        assert setup.workspaces[agent.name].root == (run_dir / "workspaces" / agent.name).resolve()
        assert (setup.workspaces[agent.name].root / "README.md").exists()
        assert agent.prompt_ids[:len(trunk)] == trunk
        assert agent.params.stop == TURN_STOP
        assert agent.toolbox.names == ("read_file", "write_file") and not agent.toolbox.allow_commands
    assert [agent.params.seed for agent in setup.agents] == [7, 8]  # equal tasks still diverge
    messages = first_messages(setup, spec_in(tmp_path / "again"))
    assert [m["role"] for m in messages["a"]] == ["system", "user"]
    assert "Working directory: " + str(setup.workspaces["a"].root) in messages["a"][1]["content"]


def test_shared_readonly_agents_read_the_source_in_place(tmp_path):
    spec = spec_in(tmp_path, **{"mode: copy": "mode: shared-readonly"})
    setup = set_up_agents(spec, tiny_tokenizer(), 2048, tmp_path / "run", lambda event: None)
    for workspace in setup.workspaces.values():
        assert workspace.root == EXAMPLE_WORKSPACE.resolve() and workspace.read_only
    assert not (tmp_path / "run" / "workspaces").exists()


def test_shared_readonly_with_run_command_is_refused_with_a_fix(tmp_path):
    with pytest.raises(SpecError, match="run_command.enabled: false or workspace.mode: copy"):
        spec_in(tmp_path, **{"mode: copy": "mode: shared-readonly", "harness: tiny-harness.json": "",
                             "enabled: false": "enabled: true"})
