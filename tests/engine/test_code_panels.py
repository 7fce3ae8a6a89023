"""Quantized weights kept as code panels too (engine.code_panels): when auto keeps them, what they cost in the
engine's own weight count, and that rows get the same bits from them shared or alone, batched or not; logits
stay close to the blocks' (which round each weight to bfloat16: code panels never do)."""
import pytest
import torch

from engine import SamplingParams
from engine.code_panels import faster_from_codes
from engine.errors import OptionError
from engine.machine_probe import KERNEL, MachineProbe, MatmulRate
from kernels.cpu import bf16_matmul, code_matmul
from tests.helpers.engine_runs import run_with_logits
from tests.helpers.shared_trunk import swarm_prompts


def probe(speedups: dict[str, float]) -> MachineProbe:
    return MachineProbe("cpu", 2, [], 2, "torch", {KERNEL: MatmulRate(388e9, (2048, 2048, 2048), True)}, 47.8e9, 1.0,
                        codes_speedup=speedups)


def test_codes_are_kept_where_the_probe_timed_them_faster_for_a_lone_row_and_for_eight():
    assert faster_from_codes(probe({"1": 3.1, "8": 1.4}))
    assert not faster_from_codes(probe({"1": 3.1, "8": 0.9}))
    assert not faster_from_codes(probe({"1": 0.9, "8": 1.4}))
    assert not faster_from_codes(probe({}))   # not timed: no native bfloat16 kernels


@pytest.fixture
def bfloat16_products(monkeypatch):
    """Prompts and decode rows in bfloat16 products on swarm's kernels, as auto takes them where the probe
    measured them faster; skipped where this build cannot multiply bfloat16 natively."""
    from engine import prompt_matmul

    if not (bf16_matmul.available() and bf16_matmul.native() and code_matmul.available()
            and code_matmul.native()):
        pytest.skip("no AVX512-BF16: bfloat16 products are not native here")
    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: prompt_matmul.KERNEL)
    monkeypatch.setattr(prompt_matmul, "choose_attention", lambda precision: "bfloat16")
    monkeypatch.setattr(prompt_matmul, "choose_decode", lambda precision: "bfloat16")


def engine(folder: str, weights: str = "q4_1", **options):
    from engine.llm_engine import EngineOptions, LLMEngine

    return LLMEngine(folder, EngineOptions(kv_budget_tokens=4096, weights=weights, mixed_step_tokens=16,
                                           packed_weights=False, **options))


@pytest.mark.parametrize("variant,weights", [("llama", "q4_1"), ("qwen3", "q4_0"), ("llama", "q8_0")])
def test_decode_rows_get_the_same_bits_shared_or_alone_and_logits_close_to_the_blocks(tiny_model_dir, variant,
                                                                                     weights, bfloat16_products):
    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=300, suffix_len=30, agents=4, seed=11)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    codes = engine(folder, weights, code_panels=True)
    assert codes.kernels()["code_panels"] is True
    together, mixed = run_with_logits(codes, prompts, params)
    assert mixed > 0, "no prompt was computed beside decode rows"
    unshared = engine(folder, weights, code_panels=True, enable_prefix_caching=False)
    alone = [run_with_logits(unshared, [prompt], params)[0][0] for prompt in prompts]
    for run in (run_with_logits(unshared, prompts, params)[0], alone):
        for (tokens, logits), (want_tokens, want_logits) in zip(run, together):
            assert tokens == want_tokens and torch.equal(logits, want_logits)
    blocks = engine(folder, weights, code_panels=False)
    assert blocks.kernels()["code_panels"] is False
    for (_, logits), (_, want_logits) in zip(together, run_with_logits(blocks, prompts, params)[0]):
        scale = want_logits[0].abs().max()   # the prompts' last rows: their lm_head takes few rows, codes here
        torch.testing.assert_close(logits[0], want_logits[0], rtol=0.0, atol=0.02 * scale)


@pytest.mark.parametrize("variant,weights", [("llama", "q4_1"), ("qwen3", "q4_0"), ("llama", "q8_0")])
@pytest.mark.parametrize("attention", ["bfloat16", "int8"])
def test_in_integer_products_rows_get_the_same_bits_shared_or_alone_and_logits_close_to_float32(
        tiny_model_dir, variant, weights, attention, monkeypatch):
    """Prompt and decode rows in integer products, as auto takes them where the probe timed them fastest (on any
    CPU: the plain builds where there is no AVX512-VNNI), the prompts' attention in bfloat16 or integers (where
    this build multiplies integers natively)."""
    from engine import prompt_matmul
    from engine.machine_probe import INT8_KERNEL
    from kernels.cpu import native_attention

    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: INT8_KERNEL)
    monkeypatch.setattr(prompt_matmul, "choose_attention", lambda precision: attention)
    monkeypatch.setattr(prompt_matmul, "choose_decode", lambda precision: "int8")
    native = native_attention.available() and native_attention.int8_products_native() \
        and native_attention.bf16_products_native()
    folder = str(tiny_model_dir(variant))
    _, prompts = swarm_prompts(trunk_len=300, suffix_len=30, agents=4, seed=12)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    int8 = engine(folder, weights)
    assert int8.kernels()["prompt_products"] == INT8_KERNEL and int8.kernels()["decode_products"] == "int8"
    assert int8.kernels()["prompt_attention"] == attention or not native
    together, mixed = run_with_logits(int8, prompts, params)
    assert mixed > 0, "no prompt was computed beside decode rows"
    unshared = engine(folder, weights, enable_prefix_caching=False)
    alone = [run_with_logits(unshared, [prompt], params)[0][0] for prompt in prompts]
    for run in (run_with_logits(unshared, prompts, params)[0], alone):
        for (tokens, logits), (want_tokens, want_logits) in zip(run, together):
            assert tokens == want_tokens and torch.equal(logits, want_logits)
    exact = engine(folder, weights, dtype="float32")
    for (tokens, logits), (_, want_logits) in zip(together, run_with_logits(exact, [p for p in prompts], params)[0]):
        scale = want_logits[0].abs().max()   # the prompts' last rows: before any token could differ
        torch.testing.assert_close(logits[0], want_logits[0], rtol=0.0, atol=0.03 * scale)


def test_the_engine_counts_the_code_panels_beside_the_blocks(tiny_model_dir, bfloat16_products):
    from engine.code_panels import code_layers, code_panels_bytes
    from engine.packed_weights import quantized_layers

    folder = str(tiny_model_dir("llama"))
    codes, blocks = engine(folder, code_panels=True), engine(folder, code_panels=False)
    layers = code_layers(codes.runner.model)
    want = sum(layer.code_panels.numel() for layer in layers)
    assert want == code_panels_bytes(layers) > 0
    assert codes.weights.by_format["code panels"] == want
    assert codes.weights.total_bytes == blocks.weights.total_bytes + want
    assert codes.weights.model_bytes == blocks.weights.total_bytes   # what the bench's floor reads
    assert "code panels" not in blocks.weights.by_format
    assert all(layer.code_panels is None for layer in quantized_layers(blocks.runner.model))


def test_layers_in_other_formats_keep_their_blocks(tiny_model_dir, bfloat16_products):
    from engine.code_panels import code_layers

    q5 = engine(str(tiny_model_dir("llama")), "q5_1", code_panels=True)
    assert code_layers(q5.runner.model) == [] and q5.kernels()["code_panels"] is False
    assert "code panels" not in q5.weights.by_format


def test_auto_keeps_codes_where_the_probe_says_and_the_memory_allows(tiny_model_dir, bfloat16_products,
                                                                      monkeypatch):
    import engine.code_panels as code_panels
    import engine.packed_weights as packed_weights

    folder = str(tiny_model_dir("llama"))
    monkeypatch.setattr(code_panels, "faster_from_codes", lambda *args: True)
    assert engine(folder).code_panels is True
    monkeypatch.setattr(packed_weights, "available_host_bytes", lambda: 1000)   # the layouts' shared choice
    assert engine(folder).code_panels is False
    assert engine(folder, code_panels=True).code_panels is True
    monkeypatch.setattr(packed_weights, "available_host_bytes", lambda: 1 << 40)
    monkeypatch.setattr(code_panels, "faster_from_codes", lambda *args: False)
    assert engine(folder).code_panels is False


def test_integer_prompts_keep_codes_where_the_memory_allows_else_take_the_bfloat16_kernel(tiny_model_dir,
                                                                                           monkeypatch):
    """Prompt rows in integer products read the code panels: auto keeps them whatever the decode probe says, where
    they fit; where they are not kept (asked off, or too large), prompts take the bfloat16 kernel."""
    import engine.code_panels as code_panels
    import engine.packed_weights as packed_weights
    from engine import prompt_matmul
    from engine.machine_probe import INT8_KERNEL

    folder = str(tiny_model_dir("llama"))
    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: INT8_KERNEL)
    monkeypatch.setattr(code_panels, "faster_from_codes", lambda *args: False)
    auto = engine(folder)
    assert auto.code_panels is True and auto.kernels()["prompt_products"] == INT8_KERNEL
    off = engine(folder, code_panels=False)
    assert off.code_panels is False and off.kernels()["prompt_products"] == KERNEL
    monkeypatch.setattr(packed_weights, "available_host_bytes", lambda: 1000)
    assert engine(folder).kernels()["prompt_products"] == KERNEL
    assert engine(folder, code_panels=True).kernels()["prompt_products"] == INT8_KERNEL


def test_auto_panels_stay_off_beside_codes(tiny_model_dir, bfloat16_products, monkeypatch):
    import engine.code_panels as code_panels
    import engine.packed_weights as packed_weights
    from engine.llm_engine import EngineOptions, LLMEngine

    monkeypatch.setattr(code_panels, "faster_from_codes", lambda *args: True)
    monkeypatch.setattr(packed_weights, "faster_from_panels", lambda *args: True)
    auto = LLMEngine(str(tiny_model_dir("llama")), EngineOptions(kv_budget_tokens=512, weights="q4_1"))
    assert auto.code_panels is True and auto.packed_weights is False


def test_asking_for_codes_without_bfloat16_products_is_a_clear_error(tiny_model_dir):
    from engine.llm_engine import EngineOptions, LLMEngine

    with pytest.raises(OptionError, match="code_panels needs bfloat16 decode products on swarm's CPU kernels"):
        LLMEngine(str(tiny_model_dir("llama")), EngineOptions(kv_budget_tokens=512, weights="q4_1", dtype="float32",
                                                               code_panels=True))
