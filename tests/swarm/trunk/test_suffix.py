from datetime import datetime, timezone

from swarm.spec.schema import AgentSpec
from swarm.trunk.suffix import Environment, agent_variables, fill, first_user_message, git_branch

AGENT = AgentSpec(name="tester", task="Add a test.", context={"focus": "tests/"})
ENV = Environment(date="2025-06-01 14:03 UTC", platform="Linux x86_64", git_branch="main", cwd="/runs/tester")


def test_first_message_goes_from_shared_to_private():
    text = first_user_message(AGENT, ENV)
    order = ["Date: 2025-06-01", "Platform: Linux", "Git branch: main", "Name: tester",
             "Working directory: /runs/tester", "focus: tests/", "# Task\nAdd a test."]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)
    assert text.endswith("Add a test.")


def test_no_git_branch_line_outside_git():
    assert "Git branch" not in first_user_message(AGENT, Environment("d", "p", "", "/x"))


def test_fill_replaces_known_variables_only():
    variables = agent_variables(AGENT, ENV)
    assert fill("I am {{ name }}, {{focus}}, {{ unknown }}", variables) == "I am tester, tests/, {{ unknown }}"


def test_detect_reads_the_clock_the_platform_and_git(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/feature/x\n")
    (tmp_path / "sub").mkdir()
    env = Environment.detect(tmp_path / "sub", datetime(2025, 6, 1, 14, 3, tzinfo=timezone.utc))
    assert (env.date, env.git_branch, env.cwd) == ("2025-06-01 14:03 UTC", "feature/x", str(tmp_path / "sub"))
    assert env.platform
    (tmp_path / ".git" / "HEAD").write_text("0123456789abcdef0123456789abcdef01234567\n")
    assert git_branch(tmp_path) == "0123456789ab"
