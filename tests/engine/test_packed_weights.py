"""Quantized weights kept as bfloat16 panels too (engine.packed_weights): when auto keeps them, what they cost in
the engine's own weight count, and that every row, prompt or decode, shared or alone, gets the same bits from
them; logits stay close to the blocks' (the same rounded operands, summed in another order)."""
import pytest
import torch

from engine import SamplingParams
from engine.errors import OptionError
from engine.machine_probe import KERNEL, MachineProbe, MatmulRate
from engine.packed_weights import faster_from_panels
from kernels.cpu import bf16_matmul
from tests.helpers.engine_runs import run_with_logits
from tests.helpers.shared_trunk import swarm_prompts


def probe(speedups: dict[str, float]) -> MachineProbe:
    return MachineProbe("cpu", 2, [], 2, "torch", {KERNEL: MatmulRate(388e9, (2048, 2048, 2048), True)}, 47.8e9, 1.0,
                        panels_speedup=speedups)


def test_panels_are_kept_where_the_probe_timed_them_faster_for_a_lone_row_and_for_eight():
    assert faster_from_panels(probe({"1": 1.3, "8": 1.9}))
    assert not faster_from_panels(probe({"1": 0.8, "8": 1.9}))   # a lone agent would lose
    assert not faster_from_panels(probe({"1": 1.3, "8": 0.97}))
    assert not faster_from_panels(probe({}))                      # not timed: no native bfloat16 kernels


@pytest.fixture
def bfloat16_products(monkeypatch):
    """Prompts and decode rows in bfloat16 products on swarm's kernels, as auto takes them where the probe
    measured them faster; skipped where this build cannot multiply bfloat16 natively."""
    from engine import prompt_matmul

    if not (bf16_matmul.available() and bf16_matmul.native()):
        pytest.skip("no AVX512-BF16: bfloat16 products are not native here")
    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: prompt_matmul.KERNEL)
    monkeypatch.setattr(prompt_matmul, "choose_attention", lambda precision: "bfloat16")
    monkeypatch.setattr(prompt_matmul, "choose_decode", lambda precision: "bfloat16")


def engine(folder: str, **options):
    from engine.llm_engine import EngineOptions, LLMEngine

    options = {"code_panels": False, **options}   # auto panels stay off beside code panels
    return LLMEngine(folder, EngineOptions(kv_budget_tokens=4096, weights="q4_1", mixed_step_tokens=16, **options))


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_packed_rows_get_the_same_bits_shared_or_alone_and_logits_close_to_the_blocks(tiny_model_dir, variant,
                                                                                      bfloat16_products):
    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=300, suffix_len=30, agents=4, seed=11)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    packed = engine(folder, packed_weights=True)
    assert packed.kernels()["packed_weights"] is True
    together, mixed = run_with_logits(packed, prompts, params)
    assert mixed > 0, "no prompt was computed beside decode rows"
    unshared = engine(folder, packed_weights=True, enable_prefix_caching=False)
    alone = [run_with_logits(unshared, [prompt], params)[0][0] for prompt in prompts]
    for run in (run_with_logits(unshared, prompts, params)[0], alone):
        for (tokens, logits), (want_tokens, want_logits) in zip(run, together):
            assert tokens == want_tokens and torch.equal(logits, want_logits)
    blocks = engine(folder, packed_weights=False)
    assert blocks.kernels()["packed_weights"] is False
    for (_, logits), (_, want_logits) in zip(together, run_with_logits(blocks, prompts, params)[0]):
        torch.testing.assert_close(logits[0], want_logits[0], rtol=1e-4, atol=1e-5)   # the prompts' last rows


def test_the_engine_counts_the_panels_beside_the_blocks(tiny_model_dir, bfloat16_products):
    from engine.packed_weights import panels_bytes, quantized_layers

    folder = str(tiny_model_dir("llama"))
    packed, blocks = engine(folder, packed_weights=True), engine(folder, packed_weights=False)
    layers = quantized_layers(packed.runner.model)
    want = sum(layer.panels.numel() * layer.panels.element_size() for layer in layers)
    assert want == panels_bytes(layers) > 0
    assert packed.weights.by_format["BF16 panels"] == want
    assert packed.weights.total_bytes == blocks.weights.total_bytes + want
    assert packed.weights.model_bytes == blocks.weights.total_bytes   # what the bench's floor reads
    assert "BF16 panels" not in blocks.weights.by_format
    assert all(layer.panels is None for layer in quantized_layers(blocks.runner.model))


def test_auto_keeps_the_blocks_where_the_panels_would_take_too_much_memory(tiny_model_dir, bfloat16_products,
                                                                          monkeypatch):
    import engine.packed_weights as packed_weights

    monkeypatch.setattr(packed_weights, "faster_from_panels", lambda *args: True)
    folder = str(tiny_model_dir("llama"))
    assert engine(folder).packed_weights is True
    monkeypatch.setattr(packed_weights, "available_host_bytes", lambda: 1000)
    assert engine(folder).packed_weights is False
    assert engine(folder, packed_weights=True).packed_weights is True


def test_asking_for_panels_without_bfloat16_products_is_a_clear_error(tiny_model_dir):
    from engine.llm_engine import EngineOptions, LLMEngine

    with pytest.raises(OptionError, match="packed_weights needs bfloat16 products on swarm's CPU kernels"):
        LLMEngine(str(tiny_model_dir("llama")), EngineOptions(kv_budget_tokens=512, weights="q4_1", dtype="float32",
                                                               packed_weights=True))
