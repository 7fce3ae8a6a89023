"""engine/prompt_matmul.py: prompt rows' bfloat16 products, checked against float64 products of the same
bfloat16-rounded inputs, and the same bits for a row whatever rows come with it, through every linear layer."""
import json

import pytest
import torch

from engine import prompt_matmul
from engine.linear import Linear, PackedLinear
from engine.machine_probe import (
    INT8_KERNEL,
    KERNEL,
    MachineProbe,
    MatmulRate,
    bf16_mode_sums_in_float32,
    cache_path,
    this_machine_key,
)
from engine.quantized_layers import QuantizedLinear
from kernels.cpu import bf16_matmul, code_matmul, code_prompt, onednn_linear, quant_matmul
from kernels.reference.bf16_matmul import bf16_matmul as bf16_pairs_oracle
from kernels.reference.quant_matmul import DequantScratch
from tests.helpers.random_blocks import gguf_values, random_weight

pytestmark = pytest.mark.skipif(not prompt_matmul._fpmath_available(), reason="this torch has no fpmath mode")
CPU = torch.device("cpu")
ROW_COUNTS = (1, 3, 8, 64, 65, 300)
ALL_ROWS = 320
bf16_units = pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
                                reason="oneDNN ignores the bf16 mode without bf16 units")
float32_sums = pytest.mark.skipif(not bf16_mode_sums_in_float32(),
                                  reason="oneDNN's bf16 mode rounds its sums on this CPU: auto keeps prompts float32")


def layers() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    dense = Linear(576, 384, bias=True)
    layers = {"Linear": dense, "QuantizedLinear": QuantizedLinear(random_weight("Q4_1", 384, 576, seed=0), None,
                                                                  DequantScratch())}
    if onednn_linear.available():
        layers["PackedLinear"] = PackedLinear(dense, 256)
    return layers


def weight_of(layer) -> torch.Tensor:
    return gguf_values(layer.quantized) if isinstance(layer, QuantizedLinear) else layer.weight


def in_prompt(layer, x: torch.Tensor, precision: str = "bfloat16") -> torch.Tensor:
    with torch.inference_mode(), prompt_matmul.prompt_rows(precision):
        return layer(x)


@float32_sums
@pytest.mark.parametrize("name", ["Linear", "QuantizedLinear"])
def test_prompt_rows_multiply_bfloat16_inputs_with_float32_sums(name):
    layer = layers()[name]
    x = torch.randn(ROW_COUNTS[-1], 576, generator=torch.Generator().manual_seed(1))
    rounded = x.bfloat16().double() @ weight_of(layer).bfloat16().double().T
    if getattr(layer, "bias", None) is not None:
        rounded += layer.bias.double()
    got = in_prompt(layer, x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), rounded, rtol=1e-5, atol=1e-4)
    exact = in_prompt(layer, x, "float32")
    assert (got - exact).abs().max() > 1e-3   # the rounding is really there, and really off in float32


@bf16_units
@pytest.mark.parametrize("name", ["Linear", "QuantizedLinear", "PackedLinear"])
def test_a_prompt_rows_bits_do_not_depend_on_the_rows_beside_it(name):
    if name not in layers():
        pytest.skip("no oneDNN in this torch")
    layer = layers()[name]
    x = torch.randn(ALL_ROWS, 576, generator=torch.Generator().manual_seed(2))
    together = in_prompt(layer, x)
    for count in ROW_COUNTS:
        assert torch.equal(in_prompt(layer, x[-count:]), together[-count:]), f"{count} rows"


def test_decode_rows_keep_the_float32_kernels_inside_a_prompt_step():
    layer = layers()["QuantizedLinear"]
    x = torch.randn(8, 576, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode(), prompt_matmul.prompt_rows("bfloat16"):
        with prompt_matmul.decode_rows():
            decode = layer(x)
        assert prompt_matmul.bfloat16_now()
    if quant_matmul.available():
        assert torch.equal(decode, quant_matmul.quant_matmul(x, layer.quantized))
    assert torch.equal(decode, in_prompt(layer, x, "float32"))
    assert torch.backends.mkldnn.matmul.fp32_precision != "bf16"   # the process-wide flag is put back


@pytest.fixture(autouse=True, scope="module")
def kernels_from_the_shared_cache():
    """The kernels a probe's cache check asks about, loaded before a test moves SWARM_CACHE_DIR: a library first
    built in a test's folder would stay mapped in the worker beside the shared cache's (its own task pool)."""
    from kernels.cpu import native
    for name in ("quant_matmul", "quant_matmul_bf16", "rows_attention", "bf16_matmul", "paged_decode",
                 "prefix_attention", "code_matmul", "code_prompt"):
        native.load(name)


def write_probe(bf16_flop_s: float, native: bool = True, sums: bool = True, kernel_flop_s: float = 1e10,
                attention: dict[str, float] | None = None, decode: dict[str, dict[str, float]] | None = None,
                int8_flop_s: float = 1e10, int8_speedup: dict[str, float] | None = None) -> None:
    """A cached probe of this machine with these rates; attention: the prompt attention's, per precision; decode:
    the decode matmul's, per precision and rows; int8_speedup: the decode matmul's in integer products over the
    blocks' (the bfloat16 layouts' are 1.0 and 2.0)."""
    probe = MachineProbe("cpu", 1, [], torch.get_num_threads(), torch.__version__,
                         {"float32": MatmulRate(1e11, (2048, 576, 1536), True),
                          "bfloat16": MatmulRate(bf16_flop_s, (2048, 576, 1536), native, sums),
                          KERNEL: MatmulRate(kernel_flop_s, (2048, 576, 1536), True),
                          INT8_KERNEL: MatmulRate(int8_flop_s, (2048, 576, 1536), True)}, 1e10, 1.0,
                         attention or {"float32": 1e11, "bfloat16": 1e11, "int8": 1e11},
                         decode or {precision: {"1": 1e10, "8": 1e11} for precision in ("float32", "bfloat16")},
                         {"1": 1.0, "8": 1.0}, {"1": 2.0, "8": 1.0}, int8_speedup or {"1": 0.5, "8": 0.5})
    key = this_machine_key()
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text(json.dumps({key: {**probe.to_json(), "key": key}}))


@pytest.mark.parametrize(("bf16_flop_s", "native", "sums", "expected"),
                         [(3e11, True, True, "bfloat16"), (1.2e11, True, True, "float32"),
                          (3e11, False, True, "float32"), (3e11, True, False, "float32")])
def test_auto_takes_bfloat16_products_where_the_cached_probe_measured_them_faster_and_summed_in_float32(
        monkeypatch, tmp_path, bf16_flop_s, native, sums, expected):
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    write_probe(bf16_flop_s, native, sums)
    assert prompt_matmul.choose("auto", CPU, torch.float32) == expected
    assert prompt_matmul.choose("float32", CPU, torch.float32) == "float32"
    assert prompt_matmul.choose("auto", CPU, torch.bfloat16) == "float32"


@pytest.mark.parametrize(("float32", "bfloat16", "precision", "expected"),
                         [(1e11, 1.5e11, KERNEL, "bfloat16"), (1e11, 1.5e11, "bfloat16", "bfloat16"),
                          (1e11, 1.1e11, KERNEL, "float32"), (1e11, None, KERNEL, "float32"),
                          (1e11, 1.5e11, "float32", "float32")])
def test_the_prompts_attention_takes_bfloat16_where_the_probe_measured_it_faster(monkeypatch, tmp_path, float32,
                                                                                  bfloat16, precision, expected):
    """In steps whose matmuls take bfloat16, and where it measured at least ATTENTION_BF16_SPEEDUP x float32;
    no bfloat16 rate: the kernel's build has no native bfloat16 products."""
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    rates = {"float32": float32} | ({} if bfloat16 is None else {"bfloat16": bfloat16})
    write_probe(3e11, attention=rates)
    monkeypatch.setattr("engine.machine_probe.attention_precisions", lambda: list(rates))
    assert prompt_matmul.choose_attention(precision) == expected


@pytest.mark.parametrize(("int8", "precision", "expected"),
                         [(1.7e11, INT8_KERNEL, "int8"), (1.6e11, INT8_KERNEL, "bfloat16"),
                          (1.7e11, KERNEL, "bfloat16"), (None, INT8_KERNEL, "bfloat16")])
def test_the_prompts_attention_takes_integers_where_the_matmuls_do_and_the_probe_timed_them_faster(
        monkeypatch, tmp_path, int8, precision, expected):
    """At least ATTENTION_INT8_SPEEDUP (1.1) x bfloat16's 1.5e11; no int8 rate: no native integer products."""
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    rates = {"float32": 1e11, "bfloat16": 1.5e11} | ({} if int8 is None else {"int8": int8})
    write_probe(3e11, attention=rates)
    monkeypatch.setattr("engine.machine_probe.attention_precisions", lambda: list(rates))
    assert prompt_matmul.choose_attention(precision) == expected


def test_integers_in_the_prompts_attention_need_its_bfloat16_products_faster(monkeypatch, tmp_path):
    """The decode rows' attention then stays bfloat16: without fast bfloat16 products, float32 throughout."""
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    rates = {"float32": 1e11, "bfloat16": 1.1e11, "int8": 3e11}
    write_probe(3e11, attention=rates)
    monkeypatch.setattr("engine.machine_probe.attention_precisions", lambda: list(rates))
    assert prompt_matmul.choose_attention(INT8_KERNEL) == "float32"


@pytest.mark.parametrize(("float32", "bfloat16", "precision", "expected"),
                         [(1e11, 1.3e11, KERNEL, "bfloat16"), (1e11, 1.1e11, KERNEL, "float32"),
                          (1e11, None, KERNEL, "float32"), (1e11, 1.3e11, "float32", "float32")])
def test_decode_rows_take_bfloat16_where_the_probe_measured_eight_of_them_faster(monkeypatch, tmp_path, float32,
                                                                                 bfloat16, precision, expected):
    """With prompts in bfloat16, and where 8 rows measured at least DECODE_BF16_SPEEDUP x float32 (a lone row's
    rate does not enter); no bfloat16 rate: the kernel's build has no native bfloat16 products."""
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    rates = {"float32": {"1": 5e10, "8": float32}}
    if bfloat16 is not None:
        rates["bfloat16"] = {"1": 1e9, "8": bfloat16}   # a lone row slower: no matter
    write_probe(3e11, decode=rates)
    monkeypatch.setattr("engine.machine_probe.decode_precisions", lambda: list(rates))
    assert prompt_matmul.choose_decode(precision) == expected


@pytest.mark.parametrize(("precision", "int8_speedup", "expected"),
                         [(INT8_KERNEL, {"1": 2.5, "8": 1.5}, "int8"), (INT8_KERNEL, {"1": 1.9, "8": 1.5}, "bfloat16"),
                          (INT8_KERNEL, {"1": 2.5, "8": 0.9}, "bfloat16"), (KERNEL, {"1": 2.5, "8": 1.5}, "bfloat16")])
def test_decode_rows_take_integer_products_where_prompts_do_and_the_probe_timed_them_fastest(
        monkeypatch, tmp_path, precision, int8_speedup, expected):
    """Against the blocks, the bfloat16 panels (1.0) and code panels (2.0 for a lone row) timed beside them."""
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    rates = {"float32": {"1": 5e10, "8": 1e11}, "bfloat16": {"1": 5e10, "8": 3e11}}
    write_probe(3e11, decode=rates, int8_speedup=int8_speedup)
    monkeypatch.setattr("engine.machine_probe.decode_precisions", lambda: list(rates))
    monkeypatch.setattr("engine.machine_probe.int8_probed", lambda: True)
    assert prompt_matmul.choose_decode(precision) == expected


@pytest.mark.parametrize(("products", "prompt_attention", "expected"),
                         [("bfloat16", "bfloat16", "bfloat16"), ("bfloat16", "float32", "float32"),
                          ("int8", "bfloat16", "bfloat16"), ("int8", "float32", "float32"),
                          ("int8", "int8", "bfloat16"), ("float32", "bfloat16", "float32"),
                          ("float32", "float32", "float32")])
def test_decode_attention_takes_bfloat16_where_decode_rows_and_the_prompts_attention_do(products, prompt_attention,
                                                                                         expected):
    assert prompt_matmul.choose_decode_attention(products, prompt_attention) == expected


@pytest.mark.skipif(not bf16_matmul.native(), reason="swarm's bfloat16 kernel is not native on this CPU")
@pytest.mark.parametrize(("bf16_flop_s", "sums", "kernel_flop_s", "expected"),
                         [(3e11, True, 4e11, KERNEL), (3e11, False, 2e11, KERNEL), (3e11, True, 2e11, "bfloat16"),
                          (3e11, False, 1.2e11, "float32")])
def test_auto_takes_the_fastest_path_that_sums_in_float32(monkeypatch, tmp_path, bf16_flop_s, sums, kernel_flop_s,
                                                          expected):
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    write_probe(bf16_flop_s, True, sums, kernel_flop_s)
    assert prompt_matmul.choose("auto", CPU, torch.float32) == expected


@pytest.mark.skipif(not (bf16_matmul.native() and code_prompt.native()),
                    reason="swarm's bfloat16 and integer kernels are not both native on this CPU")
@pytest.mark.parametrize(("kernel_flop_s", "int8_flop_s", "expected"),
                         [(4e11, 4.7e11, INT8_KERNEL), (4e11, 4.5e11, KERNEL), (1.2e11, 4e11, INT8_KERNEL),
                          (1.2e11, 1.3e11, "float32")])
def test_auto_takes_integer_products_where_the_probe_timed_them_well_ahead_of_bfloat16(
        monkeypatch, tmp_path, kernel_flop_s, int8_flop_s, expected):
    """INT8_SPEEDUP (1.15) over the fastest bfloat16 path, and BF16_SPEEDUP (1.5) over float32 (1e11 here)."""
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    write_probe(1e11, True, True, kernel_flop_s, int8_flop_s=int8_flop_s)
    assert prompt_matmul.choose("auto", CPU, torch.float32) == expected
    monkeypatch.setattr(code_prompt, "native", lambda library=None: False)
    assert prompt_matmul.choose("auto", CPU, torch.float32) != INT8_KERNEL


@pytest.mark.skipif(not code_prompt.available(), reason="no C compiler for the kernels")
def test_in_integer_precision_rows_of_layers_with_code_panels_take_the_integer_kernels_bits():
    """Layers without code panels keep the bfloat16 kernel's bits; decode rows stay float32."""
    quantized = layers()["QuantizedLinear"]
    x = torch.randn(ALL_ROWS, 576, generator=torch.Generator().manual_seed(4))
    in_bf16 = in_prompt(quantized, x, KERNEL)
    assert torch.equal(in_prompt(quantized, x, INT8_KERNEL), in_bf16)
    quantized.use_code_panels(code_matmul.pack(quantized.quantized))
    together = in_prompt(quantized, x, INT8_KERNEL)
    assert torch.equal(together, code_prompt.linear(x, quantized.code_panels, "Q4_1", 384))
    for count in ROW_COUNTS:
        assert torch.equal(in_prompt(quantized, x[-count:], INT8_KERNEL), together[-count:]), f"{count} rows"
    assert (together - in_bf16).abs().max() <= 0.02 * in_bf16.abs().max()
    with torch.inference_mode(), prompt_matmul.prompt_rows(INT8_KERNEL), prompt_matmul.decode_rows():
        assert torch.equal(quantized(x[:8]), in_prompt(quantized, x[:8], "float32"))


@pytest.mark.skipif(not bf16_matmul.available(), reason="no C compiler for the kernels")
def test_in_the_kernels_precision_quantized_rows_take_its_bits_and_float_layers_stay_float32():
    quantized, dense = layers()["QuantizedLinear"], layers()["Linear"]
    x = torch.randn(ALL_ROWS, 576, generator=torch.Generator().manual_seed(4))
    together = in_prompt(quantized, x, KERNEL)
    assert torch.equal(together, bf16_pairs_oracle(x, gguf_values(quantized.quantized)))
    for count in ROW_COUNTS:
        assert torch.equal(in_prompt(quantized, x[-count:], KERNEL), together[-count:]), f"{count} rows"
    assert torch.equal(in_prompt(dense, x, KERNEL), in_prompt(dense, x, "float32"))
    with torch.inference_mode(), prompt_matmul.prompt_rows(KERNEL), prompt_matmul.decode_rows():
        assert torch.equal(quantized(x[:8]), in_prompt(quantized, x[:8], "float32"))


@pytest.mark.skipif(not bf16_matmul.available(), reason="no C compiler for the kernels")
@pytest.mark.parametrize(("trunk_tokens", "precision"),    # inside a block of 16; past a chunk of the prompt attention
                         [(77, KERNEL), (300, KERNEL), (300, INT8_KERNEL)])
def test_sharing_changes_no_output_on_a_quantized_model_in_the_kernels_precision(trunk_tokens, precision,
                                                                                 tiny_model_dir, monkeypatch):
    """On any CPU (the plain builds where there is no AVX512-BF16 or AVX512-VNNI): the engine told to take a
    kernel's precision, as auto does where the probe timed it fastest. Its prompts' attention takes bfloat16
    products too where the probe timed them faster. In integer precision the engine keeps code panels."""
    import random

    from engine import LLM, SamplingParams

    monkeypatch.setattr(prompt_matmul, "choose", lambda dtype_option, device, dtype: precision)
    folder = str(tiny_model_dir("llama"))
    draw = random.Random(0)
    trunk = [draw.randrange(4, 300) for _ in range(trunk_tokens)]
    prompts = [trunk + [10 + i] + [draw.randrange(4, 300) for _ in range(6)] for i in range(8)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    shared = LLM(folder, weights="q4_1", kv_budget_tokens=4096)
    unshared = LLM(folder, weights="q4_1", kv_budget_tokens=4096, enable_prefix_caching=False)
    assert shared.engine.kernels()["prompt_products"] == precision
    assert shared.engine.kernels()["prompt_attention"] == prompt_matmul.choose_attention(precision)
    assert shared.engine.kernels()["code_panels"] or precision != INT8_KERNEL
    together = [o.token_ids for o in shared.generate(prompts, params)]
    assert together == [o.token_ids for o in unshared.generate(prompts, params)]
    assert together == [unshared.generate([p], params)[0].token_ids for p in prompts]
