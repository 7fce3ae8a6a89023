"""The rules of --canonicalize on text: what each family finds and moves, and what it leaves."""
from swarm.trunk.canonicalize import canonical_text, moved_spans


def test_prefix_lint_findings_move_their_lines_but_shared_paths_stay():
    text = ("Session 3f2a9c1d-7b4e-4c1a-9d2f-0e8b7a6c5d4f.\nUse /bin/bash for commands.\n"
            "Started at 14:03.\nKeep notes in /srv/agents/notes.\nBe brief.")
    kept, moves = canonical_text(text)
    assert kept == "Use /bin/bash for commands.\nBe brief."
    assert [(m.rule, m.text) for m in moves] == [
        ("lint:uuid", "Session 3f2a9c1d-7b4e-4c1a-9d2f-0e8b7a6c5d4f."), ("lint:time", "Started at 14:03."),
        ("lint:abs_path", "Keep notes in /srv/agents/notes.")]
    assert canonical_text("Be brief.\n\nRead ~/.config/tool first; dates look like YYYY-MM-DD.") == (
        "Be brief.\n\nRead ~/.config/tool first; dates look like YYYY-MM-DD.", [])


def test_a_known_block_wins_over_the_lines_and_lint_findings_inside_it():
    text = "Be brief.\n<env>\n  Working directory: /srv/a\n  Today's date: 2025-06-01\n</env>\nDone."
    assert [rule for _, _, rule in moved_spans(text)] == ["env_block"]
    assert canonical_text(text)[0] == "Be brief.\nDone."
