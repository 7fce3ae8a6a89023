"""The attention bench's smoke run: both plans on the engine's backend, the KV bytes each reads."""
import json
import os

import pytest

from engine.attention import bench_triton


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="--tiny on a CPU runs the Triton interpreter")
def test_the_tiny_run_reads_the_trunk_once_with_cascade_and_gives_plain_attention(capsys):
    pytest.importorskip("triton")
    bench_triton.main(["--tiny"])
    report = json.loads(capsys.readouterr().out)
    assert [r["backend"] for r in report["results"]] == ["triton", "torch"]
    assert [(r["backend"], r["context"], r["new_tokens"]) for r in report["prefill"]] == [("triton", 64, 32),
                                                                                        ("torch", 64, 32)]
    for result in report["results"]:
        # 2 agents at 64 + 8 and 64 + 9 tokens; a token's K and V: 2 x 2 layers x 2 KV heads x 32 x 2 bytes = 512
        assert result["paged_bytes_per_step"] == (72 + 73) * 512
        assert result["cascade_bytes_per_step"] == (64 + 8 + 9) * 512
        assert result["max_abs_diff"] <= 2 ** -8     # bfloat16 outputs near 1: a rounding step or two
