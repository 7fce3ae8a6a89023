import io
import re
from pathlib import Path

import pytest
import torch

from engine.errors import SpecError
from engine.kv.cache import blocks_for_budget
from engine.loading.loader import load_model_config
from engine.loading.named_models import DEFAULT_MODEL
from swarm.cli.plain_view import PlainView
from swarm.cli.run import new_run_dir
from swarm.run.phases import SwarmRun
from swarm.spec.kv_budget import KvBudget, format_bytes, min_pool_tokens, parse_card_size, parse_kv_budget
from swarm.spec.schema import SwarmSpec, load_spec
from swarm.trunk.fit import check_trunk_fits
from tests.helpers.runs import tiny_model, write_run_spec


@pytest.mark.parametrize("raw, expected", [
    ("8.09GB", KvBudget(bytes=8_090_000_000)),
    ("8GiB", KvBudget(bytes=8 * 2**30)),
    ("512 MB", KvBudget(bytes=512_000_000)),
    (20000, KvBudget(tokens=20000)),
    ("20000", KvBudget(tokens=20000)),
    ("20000 tokens", KvBudget(tokens=20000)),
])
def test_sizes_and_token_counts(raw, expected):
    assert parse_kv_budget(raw) == expected


@pytest.mark.parametrize("raw", ["8 parsecs", "lots", "0GB", 0, True, "-3GB"])
def test_bad_budgets_say_what_is_expected(raw):
    with pytest.raises(ValueError):
        parse_kv_budget(raw)


def test_a_card_is_a_size_in_decimal_or_binary_units_never_a_token_count():
    assert parse_card_size("16GB") == 16 * 10**9
    assert parse_card_size("16GiB") == 16 * 2**30 == 17_179_869_184
    assert parse_card_size("24 GB") == 24 * 10**9
    for raw in ("16", "16 tokens", "16 parsecs", "0GB"):
        with pytest.raises(ValueError):
            parse_card_size(raw)


def test_conversions_and_formatting():
    assert KvBudget(tokens=10).to_bytes(147_456) == 1_474_560
    assert format_bytes(589_824_000) == "589.82 MB"
    assert format_bytes(4_718_592_000) == "4.72 GB"


def test_a_budget_keeps_the_unit_it_was_written_in():
    assert parse_kv_budget("1.5GiB").unit == "GiB" and parse_kv_budget("1.5GiB") == KvBudget(bytes=1_610_612_736)
    assert KvBudget(bytes=1, unit="MB").in_my_unit(1616, 147_456) == "238.29MB"  # 238,288,896 B, rounded up
    assert KvBudget(bytes=1, unit="GiB").in_my_unit(1616, 147_456) == "0.23GiB"
    assert KvBudget(tokens=5).in_my_unit(1616, 147_456) == "1,616 tokens"


def test_the_pool_of_a_budget_is_the_one_the_engine_makes():
    config = load_model_config(DEFAULT_MODEL)
    per_token = config.kv_bytes_per_token("float32")
    for budget in (KvBudget(tokens=1), KvBudget(tokens=16), KvBudget(tokens=17), KvBudget(bytes=1),
                   KvBudget(bytes=10**6), KvBudget(bytes=16 * per_token * 3 - 1)):
        blocks = blocks_for_budget(config, 16, torch.float32, budget.tokens, budget.bytes)
        assert budget.pool_tokens(per_token, 16) == blocks * 16, budget


def test_the_least_pool_holds_the_trunk_once_and_one_agent_after_it():
    assert min_pool_tokens(40, 50, 16) == 96  # trunk: 2 full + 1 part; the agent's 51: 2 shared + 2 own; 1 spare
    assert min_pool_tokens(32, 40, 16) == 64  # trunk: 2 full; the agent's 41: 2 shared + 1 own; 1 spare
    assert min_pool_tokens(0, 15, 16) == 32


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.getbasetemp())


def spec_with_budget(folder: Path, model: Path, budget) -> SwarmSpec:
    path = write_run_spec(folder, model, agents=2, max_tokens=1, max_turns=1)
    path.write_text(path.read_text().replace("kv_budget: 16000", f"kv_budget: {budget}"))
    return load_spec(path)


def stated(pattern: str, message: str) -> str:
    found = re.search(pattern, message)
    assert found, message
    return found[1]


def test_a_budget_too_small_for_the_trunk_is_a_spec_error_that_names_the_least(tmp_path, model):
    with pytest.raises(SpecError) as caught:
        check_trunk_fits(spec_with_budget(tmp_path, model, 64), tmp_path / "runs")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'swarm.yaml'}:4: kv_budget: 64 tokens holds 64 tokens of KV, "
                              "too few for the trunk (")
    least = int(stated(r"give at least ([\d,]+) tokens$", message).replace(",", ""))
    assert least > int(stated(r"the trunk \(([\d,]+) tokens\)", message).replace(",", ""))
    # the same folder each time: the agents' prompts name their paths, and a longer path is a longer prompt
    check_trunk_fits(spec_with_budget(tmp_path, model, least), tmp_path / "runs")
    with pytest.raises(SpecError):
        check_trunk_fits(spec_with_budget(tmp_path, model, least - 16), tmp_path / "runs")


def test_a_size_too_small_names_the_least_in_its_own_unit_too(tmp_path, model):
    with pytest.raises(SpecError) as caught:
        check_trunk_fits(spec_with_budget(tmp_path, model, "1KB"), tmp_path / "runs")
    size = stated(r"give at least [\d,]+ tokens \(([\d.,]+KB)\)$", str(caught.value))
    check_trunk_fits(spec_with_budget(tmp_path, model, size), tmp_path / "runs")


def test_the_least_budget_runs_every_agent(tmp_path, model):
    """The check's arithmetic against the engine's: at the least budget each agent gets its turn."""
    small = spec_with_budget(tmp_path, model, 64)   # the run's own folders: its suffixes name their paths
    with pytest.raises(SpecError) as caught:
        check_trunk_fits(small, small.out)
    least = stated(r"give at least ([\d,]+) tokens$", str(caught.value)).replace(",", "")
    spec = spec_with_budget(tmp_path, model, least)
    summary = SwarmRun(spec, new_run_dir(spec.out, spec.path), PlainView(io.StringIO())).run()
    assert [agent["status"] for agent in summary["agents"]] == ["done", "done"], summary["agents"]
