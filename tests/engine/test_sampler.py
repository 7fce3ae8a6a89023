"""The batch sampler: greedy rows take the argmax, sampled rows follow softmax(logits / T) as top-k and
top-p cut it, a seeded row draws the same tokens whatever else is in the batch, and one `.tolist()`
is the only read of the device."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from engine.sampler import Sampler, splitmix64
from engine.sampling import SamplingParams

VOCAB = 40


def random_logits(rows: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_splitmix64_gives_the_reference_outputs():
    outputs = splitmix64(torch.tensor(1234567), torch.arange(1, 6))   # splitmix64.c seeded with 1234567
    assert [value % 2**64 for value in outputs.tolist()] == [
        6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
        16408922859458223821]


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    logits = random_logits(6)
    rows = [(i, SamplingParams() if i % 2 else SamplingParams(temperature=1.0, top_p=0.9)) for i in range(6)]
    tokens = Sampler().sample(logits, rows)
    assert tokens[1::2] == logits[1::2].argmax(dim=-1).tolist()
    assert Sampler().sample(logits, [(i, SamplingParams()) for i in range(6)]) == logits.argmax(dim=-1).tolist()


SEEDED = [SamplingParams(temperature=1.0, seed=1234),
          SamplingParams(temperature=0.7, top_k=10, top_p=0.9, seed=-5),
          SamplingParams(temperature=1.3, top_p=0.8, seed=2**64 - 1)]
OTHERS = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, seed=77),
          SamplingParams(temperature=2.0, top_k=3), SamplingParams(temperature=1.0, top_p=0.5, seed=1234)]


def seeded_tokens(params: SamplingParams, batch_size: int, position: int, steps: int = 12) -> list[int]:
    """The seeded request's tokens over `steps` steps, at `position` in a batch of the others;
    its logits at each step are the same whatever the batch."""
    sampler, tokens = Sampler(), []
    for step in range(steps):
        logits = random_logits(batch_size, seed=1000 + step * 31 + batch_size)
        logits[position] = random_logits(1, seed=step)[0]
        others = [(100 + i, OTHERS[i % len(OTHERS)]) for i in range(batch_size - 1)]
        rows = others[:position] + [(7, params)] + others[position:]
        tokens.append(sampler.sample(logits, rows)[position])
    return tokens


@pytest.mark.parametrize("params", SEEDED)
def test_a_seeded_row_draws_the_same_alone_and_at_any_place_in_any_batch(params):
    alone = seeded_tokens(params, 1, 0)
    assert len(set(alone)) > 3   # it does sample
    for batch_size, position in [(2, 0), (2, 1), (5, 3), (9, 8)]:
        assert seeded_tokens(params, batch_size, position) == alone, (batch_size, position)


def test_different_seeds_draw_different_tokens():
    flat = torch.zeros(1, 1000)
    first, second = (tokens_over_steps(flat, SamplingParams(temperature=1.0, seed=seed), 10) for seed in (1, 2))
    assert first != second and first == tokens_over_steps(flat, SamplingParams(temperature=1.0, seed=1), 10)


def tokens_over_steps(logits: torch.Tensor, params: SamplingParams, steps: int, sampler=None) -> list[int]:
    sampler = sampler or Sampler()
    return [sampler.sample(logits, [(0, params)])[0] for _ in range(steps)]


def test_the_sample_index_advances_each_step_and_forget_restarts_it():
    flat, params, sampler = torch.zeros(1, 1000), SamplingParams(temperature=1.0, seed=9), Sampler()
    first = tokens_over_steps(flat, params, 8, sampler)
    assert len(set(first)) > 1
    sampler.forget(0)
    assert tokens_over_steps(flat, params, 8, sampler) == first


PROBS = torch.tensor([0.35, 0.25, 0.15, 0.1, 0.08, 0.07])
CASES = [   # params, the tokens that the filters keep (worked out by hand from PROBS)
    (dict(temperature=1.0), range(6)),
    (dict(temperature=0.5), range(6)),
    (dict(temperature=2.0, top_k=3), range(3)),
    (dict(temperature=1.0, top_p=0.7), range(3)),   # the mass above token 2 is 0.6, above token 3 is 0.75
    (dict(temperature=1.5, top_k=4, top_p=0.8), range(3)),   # of the top 4 at T=1.5, 0.64 and 0.85 above 2 and 3
]


def draw_many(params: dict, seeded: bool, rows: int = 2000, steps: int = 6) -> torch.Tensor:
    """Counts per token of rows * steps draws from log(PROBS): seeded rows with seeds 0.., or unseeded."""
    sampler, counts = Sampler(), torch.zeros(len(PROBS))
    logits = PROBS.log().expand(rows, -1)
    batch = [(i, SamplingParams(**params, seed=i if seeded else None)) for i in range(rows)]
    for _ in range(steps):
        counts += torch.bincount(torch.tensor(sampler.sample(logits, batch)), minlength=len(PROBS))
    return counts


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
@pytest.mark.parametrize("params, kept", CASES)
def test_draws_follow_the_softmax_of_the_filtered_scaled_logits(params, kept, seeded):
    counts = draw_many(params, seeded)
    kept = list(kept)
    scaled = PROBS.log() / params["temperature"]
    expected = torch.softmax(scaled[kept], dim=0) * counts.sum()
    assert counts.sum() == counts[kept].sum()   # nothing outside what the filters keep
    chi_square = ((counts[kept] - expected) ** 2 / expected).sum()
    p_value = torch.special.gammaincc(torch.tensor((len(kept) - 1) / 2), chi_square / 2)
    assert p_value > 1e-3, (counts.tolist(), expected.tolist())


@pytest.mark.parametrize("with_top_p", [False, True])
def test_each_row_keeps_its_own_limits_in_a_mixed_batch(with_top_p):
    kinds = [SamplingParams(), SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0)]
    kinds += [SamplingParams(temperature=1.0, top_p=0.5)] if with_top_p else []   # keeps tokens 0 and 1
    rows = [(i, kinds[i % len(kinds)]) for i in range(200 * len(kinds))]
    tokens = Sampler().sample(PROBS.log().expand(len(rows), -1), rows)
    drawn = [{t for t, (_, params) in zip(tokens, rows) if params is kind} for kind in kinds]
    assert drawn[0] == {0} and drawn[1] == {0, 1} and drawn[2] == set(range(len(PROBS)))
    assert not with_top_p or drawn[3] == {0, 1}


def test_draws_over_a_large_flat_vocabulary_are_uniform():
    vocab, rows, steps = 500, 500, 20
    sampler, flat, counts = Sampler(), torch.zeros(rows, vocab), torch.zeros(vocab)
    batch = [(i, SamplingParams(temperature=1.0, seed=i)) for i in range(rows)]
    for _ in range(steps):
        counts += torch.bincount(torch.tensor(sampler.sample(flat, batch)), minlength=vocab)
    expected = rows * steps / vocab
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert torch.special.gammaincc(torch.tensor((vocab - 1) / 2), chi_square / 2) > 1e-3


def test_top_k_one_is_greedy():
    logits = random_logits(8, vocab=100)
    rows = [(i, SamplingParams(temperature=1.3, top_k=1, seed=i if i % 2 else None)) for i in range(8)]
    assert Sampler().sample(logits, rows) == logits.argmax(dim=-1).tolist()


def test_ties_with_the_kth_value_are_kept():
    logits = torch.tensor([[3.0, 3.0, 3.0, 0.0, -1.0]]).expand(300, -1)
    rows = [(i, SamplingParams(temperature=1.0, top_k=1, seed=i)) for i in range(300)]
    assert set(Sampler().sample(logits, rows)) == {0, 1, 2}


def test_a_tiny_top_p_keeps_only_the_argmax():
    logits = random_logits(8, vocab=100)
    rows = [(i, SamplingParams(temperature=1.0, top_p=1e-9, seed=i)) for i in range(8)]
    assert Sampler().sample(logits, rows) == logits.argmax(dim=-1).tolist()


def test_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([[5.0, 4.9, -10.0, -10.0]]).expand(50, -1)   # 0.525 and 0.475: top_p 0.5 keeps token 0
    rows = [(i, SamplingParams(temperature=1.0, top_p=0.5, seed=i)) for i in range(50)]
    assert set(Sampler().sample(logits, rows)) == {0}


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 1e-300])
def test_a_vanishing_temperature_is_greedy(temperature):
    logits = random_logits(4)
    rows = [(i, SamplingParams(temperature=temperature, top_p=0.9 if i % 2 else 1.0, seed=i)) for i in range(4)]
    assert Sampler().sample(logits, rows) == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_sample_as_their_float32_values(dtype):
    logits = random_logits(5).to(dtype)
    rows = [(i, SamplingParams(temperature=1.0 if i else 0.0, top_k=5 * i, seed=i)) for i in range(5)]
    tokens = Sampler().sample(logits, rows)
    assert tokens == Sampler().sample(logits.float(), rows)
    assert tokens[0] == logits[0].float().argmax() and all(type(t) is int for t in tokens)


class DeviceReads(TorchFunctionMode):
    """Records the calls that make the host wait for a tensor's values."""
    READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero",
             "argwhere", "masked_select", "unique"}

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def test_one_tolist_is_the_only_read_of_the_device():
    params = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, seed=3),
              SamplingParams(temperature=1.0, top_k=4), SamplingParams(temperature=1.2, top_p=0.7, seed=5)]
    logits, sampler = random_logits(len(params)), Sampler()
    for _ in range(2):
        with DeviceReads() as recorded:
            tokens = sampler.sample(logits, list(enumerate(params)))
        assert recorded.reads == ["tolist"] and all(type(t) is int for t in tokens)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_nothing_waits_for_the_device_and_seeded_rows_draw_as_on_the_cpu():
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.8, top_k=50,
              seed=2), SamplingParams(temperature=1.2, top_p=0.9, seed=3), SamplingParams(temperature=1.0)]
    rows, logits = list(enumerate(params)), random_logits(len(params), vocab=1000)
    on_cpu, on_gpu = Sampler().sample(logits, rows), logits.cuda()
    Sampler().choose(on_gpu, rows)   # the first call allocates pinned memory and the generator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        chosen = Sampler().choose(on_gpu, rows)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert chosen.tolist()[:4] == on_cpu[:4]
