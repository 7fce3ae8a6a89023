"""swarm/bench/floor.py against a hand computation for a tiny model (the formulas are in its docstring)."""
from dataclasses import replace

import pytest

from engine import MachineProbe, MatmulRate
from swarm.bench.floor import ModelShape, machine_floor

# L=2, d=8, H=2, H_kv=1, h=4, f=16, V=32:
#   P = 2 · (8·2·4 + 2·8·1·4 + 2·4·8 + 3·8·16) = 2 · (64 + 64 + 64 + 384) = 1152;  E = 8·32 = 256
#   attention: 4·2·2·4 = 64 FLOPs per (query, key) pair
TINY = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32,
                  tied_embeddings=True, weight_bytes=1000, kv_bytes_per_token=10)
N, T, S, G = 2, 4, 2, 3


def probe(read_bytes_per_s: float) -> MachineProbe:
    rates = {"float32": MatmulRate(1000.0, (128, 576, 1536), native=True),
             "bfloat16": MatmulRate(4000.0, (128, 576, 1536), native=True)}
    return MachineProbe("test CPU", 2, [], 1, "test", rates, read_bytes_per_s, 0.0)


def test_the_floor_of_a_memory_bound_decode_matches_a_hand_computation():
    floor = machine_floor(TINY, probe(read_bytes_per_s=100.0), N, T, S, G)
    # pairs = 4·5/2 + 2 · (2·4 + 2·3/2) = 10 + 22 = 32
    # prompt FLOPs = 2·1152·(4 + 2·2) + 2·256·2 + 64·32 = 18432 + 1024 + 2048
    assert floor.matmul_dtype == "bfloat16"     # the faster of the two rates
    assert floor.prefill_flops == 21504
    assert floor.prefill_s == pytest.approx(21504 / 4000)
    # step 1: 1000 + 10 · (4 + 2·3) = 1100 bytes -> 11 s; step 2: 1000 + 10 · (4 + 2·4) = 1120 bytes -> 11.2 s
    # (their FLOPs, 6528 and 6656, take under 2 s at 4000 FLOP/s)
    assert floor.decode_steps == G - 1
    assert floor.decode_step_bytes == pytest.approx(1110)
    assert floor.decode_s == pytest.approx(22.2)
    assert floor.decode_step_s == pytest.approx(11.1)
    assert floor.total_s == pytest.approx(21504 / 4000 + 22.2)
    assert floor.over(2 * floor.total_s) == pytest.approx(2.0)


def test_a_compute_bound_decode_step_is_its_flops_at_the_matmul_rate():
    floor = machine_floor(TINY, probe(read_bytes_per_s=1e12), N, T, S, G)
    # step k: N · (2P + 2E + 64 · (T + S + k)) = 2 · (2304 + 512 + 64 · 7) = 6528, then 2 · (2816 + 64 · 8) = 6656
    assert floor.decode_step_flops == pytest.approx((6528 + 6656) / 2)
    assert floor.decode_s == pytest.approx((6528 + 6656) / 4000)


def test_one_new_token_has_no_decode_step():
    floor = machine_floor(TINY, probe(read_bytes_per_s=100.0), N, T, S, 1)
    assert (floor.decode_steps, floor.decode_s, floor.decode_step_s) == (0, 0.0, 0.0)
    assert floor.total_s == floor.prefill_s


def test_an_untied_embedding_table_is_not_read_whole_by_a_decode_step():
    untied = replace(TINY, tied_embeddings=False)
    # stored: P + 2E parameters; read per step: P + E of them
    assert untied.decode_weight_bytes == pytest.approx(1000 * (1152 + 256) / (1152 + 512))
    assert TINY.decode_weight_bytes == 1000
