import pytest

from swarm.kv_budget import KvBudget, format_bytes, parse_kv_budget


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


def test_conversions_and_formatting():
    assert KvBudget(tokens=10).to_bytes(147_456) == 1_474_560
    assert KvBudget(bytes=8_090_000_000).to_tokens(147_456) == 54_863
    assert format_bytes(589_824_000) == "589.82 MB"
    assert format_bytes(4_718_592_000) == "4.72 GB"
