"""What a decode step reads, and the datasheet peak found by the name torch gives a card."""
from engine.gpu_check.bandwidth import datasheet_bytes_per_s, decode_traffic

KV_PER_TOKEN = 1000


def test_cascade_reads_the_trunk_once_for_all_rows_and_each_row_its_own_tail():
    traffic = decode_traffic(weight_bytes=10_000, embedding_bytes=3_000, kv_bytes_per_token=KV_PER_TOKEN,
                             agents=8, trunk=4096, private_tokens=144.5, cascade=True)
    assert traffic.weight_bytes == 7_000
    assert traffic.kv_bytes == (4096 + 8 * 144.5) * KV_PER_TOKEN
    assert traffic.total_bytes == traffic.weight_bytes + traffic.kv_bytes


def test_without_cascade_or_with_one_row_every_row_reads_the_whole_trunk():
    plain = decode_traffic(10_000, 0, KV_PER_TOKEN, agents=8, trunk=4096, private_tokens=100, cascade=False)
    alone = decode_traffic(10_000, 0, KV_PER_TOKEN, agents=1, trunk=4096, private_tokens=100, cascade=True)
    assert plain.kv_bytes == 8 * (4096 + 100) * KV_PER_TOKEN
    assert alone.kv_bytes == (4096 + 100) * KV_PER_TOKEN


def test_the_datasheet_figure_is_the_longest_name_fragment_that_matches():
    assert datasheet_bytes_per_s("NVIDIA H200") == 4.8e12
    assert datasheet_bytes_per_s("NVIDIA H100 PCIe") == 2.0e12
    assert datasheet_bytes_per_s("NVIDIA H100 80GB HBM3") == 3.35e12
    assert datasheet_bytes_per_s("AMD Instinct MI300X") == 5.3e12
    assert datasheet_bytes_per_s("AMD Radeon RX 7900 XTX") == 960e9
    assert datasheet_bytes_per_s("Some Future Card") is None
