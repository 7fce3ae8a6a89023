"""Which decode rows read a shared prefix once: worked out from the block tables."""
import torch

from engine.attention.plan import plan_decode

B = 4


def test_rows_sharing_a_trunk_form_one_group_and_keep_private_remainders():
    tables = [[0, 1, 2, 9], [0, 1, 2, 10, 11], [20, 21]]
    plan = plan_decode(tables, [15, 19, 7], B, torch.device("cpu"), min_prefix_tokens=8)
    assert len(plan.prefixes) == 1
    prefix = plan.prefixes[0]
    assert prefix.rows == slice(0, 2) and prefix.num_blocks == 3
    assert prefix.first_block == 0 and prefix.blocks is None
    assert plan.private_lens.tolist() == [3, 7, 7]
    assert plan.private_tables.tolist() == [[9, 0], [10, 11], [20, 21]]


def test_the_block_that_receives_the_new_token_is_never_shared():
    tables = [[5, 7, 3], [5, 7, 3]]
    plan = plan_decode(tables, [9, 12], B, torch.device("cpu"), min_prefix_tokens=4)
    assert plan.prefixes[0].num_blocks == 2
    assert plan.prefixes[0].blocks.tolist() == [5, 7]


def test_short_prefixes_and_lone_rows_use_plain_paged_attention():
    plan = plan_decode([[0, 1, 5], [0, 1, 6], [9]], [10, 10, 3], B, torch.device("cpu"), min_prefix_tokens=64)
    assert plan.prefixes == []
    assert plan.private_lens.tolist() == [10, 10, 3]


def test_rows_apart_in_the_batch_are_listed():
    tables = [[0, 1, 2, 9], [20, 21], [0, 1, 2, 10]]
    plan = plan_decode(tables, [15, 7, 15], B, torch.device("cpu"), min_prefix_tokens=8)
    assert plan.prefixes[0].rows.tolist() == [0, 2]
