"""4-bit weights kept as nibble panels too (engine.nibble_panels): when auto keeps them, what they cost in the
engine's own weight count, and that rows get the same bits from them shared or alone, batched or not; logits
stay close to the blocks' (which round each weight to bfloat16: nibble panels never do)."""
import pytest
import torch

from engine import SamplingParams
from engine.errors import OptionError
from engine.machine_probe import KERNEL, MachineProbe, MatmulRate
from engine.nibble_panels import faster_from_nibbles
from kernels.cpu import bf16_matmul, nibble_matmul
from tests.helpers.engine_runs import run_with_logits
from tests.helpers.shared_trunk import swarm_prompts


def probe(speedups: dict[str, float]) -> MachineProbe:
    return MachineProbe("cpu", 2, [], 2, "torch", {KERNEL: MatmulRate(388e9, (2048, 2048, 2048), True)}, 47.8e9, 1.0,
                        nibbles_speedup=speedups)


def test_nibbles_are_kept_where_the_probe_timed_them_faster_for_a_lone_row_and_for_eight():
    assert faster_from_nibbles(probe({"1": 3.1, "8": 1.4}))
    assert not faster_from_nibbles(probe({"1": 3.1, "8": 0.9}))
    assert not faster_from_nibbles(probe({"1": 0.9, "8": 1.4}))
    assert not faster_from_nibbles(probe({}))   # not timed: no native bfloat16 kernels


@pytest.fixture
def bfloat16_products(monkeypatch):
    """Prompts and decode rows in bfloat16 products on swarm's kernels, as auto takes them where the probe
    measured them faster; skipped where this build cannot multiply bfloat16 natively."""
    from engine import prompt_matmul

    if not (bf16_matmul.available() and bf16_matmul.native() and nibble_matmul.available()
            and nibble_matmul.native()):
        pytest.skip("no AVX512-BF16: bfloat16 products are not native here")
    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: prompt_matmul.KERNEL)
    monkeypatch.setattr(prompt_matmul, "choose_attention", lambda precision: "bfloat16")
    monkeypatch.setattr(prompt_matmul, "choose_decode", lambda precision: "bfloat16")


def engine(folder: str, weights: str = "q4_1", **options):
    from engine.llm_engine import EngineOptions, LLMEngine

    return LLMEngine(folder, EngineOptions(kv_budget_tokens=4096, weights=weights, mixed_step_tokens=16,
                                           packed_weights=False, **options))


@pytest.mark.parametrize("variant,weights", [("llama", "q4_1"), ("qwen3", "q4_0")])
def test_decode_rows_get_the_same_bits_shared_or_alone_and_logits_close_to_the_blocks(tiny_model_dir, variant,
                                                                                     weights, bfloat16_products):
    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=300, suffix_len=30, agents=4, seed=11)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    nibbles = engine(folder, weights, nibble_panels=True)
    assert nibbles.kernels()["nibble_panels"] is True
    together, mixed = run_with_logits(nibbles, prompts, params)
    assert mixed > 0, "no prompt was computed beside decode rows"
    unshared = engine(folder, weights, nibble_panels=True, enable_prefix_caching=False)
    alone = [run_with_logits(unshared, [prompt], params)[0][0] for prompt in prompts]
    for run in (run_with_logits(unshared, prompts, params)[0], alone):
        for (tokens, logits), (want_tokens, want_logits) in zip(run, together):
            assert tokens == want_tokens and torch.equal(logits, want_logits)
    blocks = engine(folder, weights, nibble_panels=False)
    assert blocks.kernels()["nibble_panels"] is False
    for (_, logits), (_, want_logits) in zip(together, run_with_logits(blocks, prompts, params)[0]):
        scale = want_logits[0].abs().max()   # the prompts' last rows: their lm_head takes few rows, nibbles here
        torch.testing.assert_close(logits[0], want_logits[0], rtol=0.0, atol=0.02 * scale)


def test_the_engine_counts_the_nibble_panels_beside_the_blocks(tiny_model_dir, bfloat16_products):
    from engine.nibble_panels import nibble_layers, nibbles_bytes
    from engine.packed_weights import quantized_layers

    folder = str(tiny_model_dir("llama"))
    nibbles, blocks = engine(folder, nibble_panels=True), engine(folder, nibble_panels=False)
    layers = nibble_layers(nibbles.runner.model)
    want = sum(layer.nibbles.numel() for layer in layers)
    assert want == nibbles_bytes(layers) > 0
    assert nibbles.weights.by_format["nibble panels"] == want
    assert nibbles.weights.total_bytes == blocks.weights.total_bytes + want
    assert "nibble panels" not in blocks.weights.by_format
    assert all(layer.nibbles is None for layer in quantized_layers(blocks.runner.model))


def test_layers_in_other_formats_keep_their_blocks(tiny_model_dir, bfloat16_products):
    from engine.nibble_panels import nibble_layers

    q8 = engine(str(tiny_model_dir("llama")), "q8_0", nibble_panels=True)
    assert nibble_layers(q8.runner.model) == [] and q8.kernels()["nibble_panels"] is False
    assert "nibble panels" not in q8.weights.by_format


def test_auto_keeps_nibbles_where_the_probe_says_and_the_memory_allows(tiny_model_dir, bfloat16_products,
                                                                      monkeypatch):
    import engine.nibble_panels as nibble_panels

    folder = str(tiny_model_dir("llama"))
    monkeypatch.setattr(nibble_panels, "faster_from_nibbles", lambda *args: True)
    assert engine(folder).nibble_panels is True
    monkeypatch.setattr(nibble_panels, "available_host_bytes", lambda: 1000)
    assert engine(folder).nibble_panels is False
    assert engine(folder, nibble_panels=True).nibble_panels is True
    monkeypatch.setattr(nibble_panels, "available_host_bytes", lambda: 1 << 40)
    monkeypatch.setattr(nibble_panels, "faster_from_nibbles", lambda *args: False)
    assert engine(folder).nibble_panels is False


def test_auto_panels_stay_off_beside_nibbles(tiny_model_dir, bfloat16_products, monkeypatch):
    import engine.nibble_panels as nibble_panels
    import engine.packed_weights as packed_weights
    from engine.llm_engine import EngineOptions, LLMEngine

    monkeypatch.setattr(nibble_panels, "faster_from_nibbles", lambda *args: True)
    monkeypatch.setattr(packed_weights, "faster_from_panels", lambda *args: True)
    auto = LLMEngine(str(tiny_model_dir("llama")), EngineOptions(kv_budget_tokens=512, weights="q4_1"))
    assert auto.nibble_panels is True and auto.packed_weights is False


def test_asking_for_nibbles_without_bfloat16_products_is_a_clear_error(tiny_model_dir):
    from engine.llm_engine import EngineOptions, LLMEngine

    with pytest.raises(OptionError, match="nibble_panels needs bfloat16 decode products on swarm's CPU kernels"):
        LLMEngine(str(tiny_model_dir("llama")), EngineOptions(kv_budget_tokens=512, weights="q4_1", dtype="float32",
                                                               nibble_panels=True))
