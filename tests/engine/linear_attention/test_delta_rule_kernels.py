"""Which kernels run the gated delta rule, and a tiny Qwen3.5 run end to end on flash-linear-attention's kernels
(interpreted on a CPU) giving the logits and tokens of the PyTorch rule: prompts cut into chunks beside other
sequences' decode rows, so both of fla's kernels and the varlen packing are used."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.linear_attention import delta_rule_kernels as select
from engine.linear_attention.delta_rule_kernels import BACKEND_ENV, DeltaRuleBackendError, delta_rule_kernels
from kernels.triton import interpreted
from tests.helpers.engine_runs import prompts_of, run_with_logits


def test_a_cpu_runs_the_pytorch_rule_unless_asked(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert delta_rule_kernels("cpu").name == "torch"
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert delta_rule_kernels("cuda").name == "torch"


def test_a_backend_that_cannot_run_here_is_one_line_saying_what_to_do(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "flash")
    with pytest.raises(DeltaRuleBackendError, match="not a backend: use torch or fla"):
        delta_rule_kernels("cpu")
    with pytest.raises(DeltaRuleBackendError, match="runs only under TRITON_INTERPRET=1"):
        select._kernels_for("cpu", "fla", False)


@pytest.mark.skipif(not interpreted() and not torch.cuda.is_available(), reason="needs the Triton interpreter")
def test_a_tiny_qwen3_5_on_fla_gives_the_logits_and_tokens_of_the_pytorch_rule(tiny_model_dir, monkeypatch):
    pytest.importorskip("fla")
    folder = str(tiny_model_dir("qwen3_5-odd-tied"))
    prompts = prompts_of([9, 30, 21], seed=5)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    options = dict(dtype="float32", kv_budget_tokens=512, max_num_batched_tokens=24, mixed_step_tokens=24)
    results = {}
    for backend in ("torch", "fla"):
        monkeypatch.setenv(BACKEND_ENV, backend)
        engine = LLM(folder, **options).engine
        assert engine.kernels()["delta_rule"] == backend
        results[backend], mixed_steps = run_with_logits(engine, prompts, params)
        assert mixed_steps >= 1
    for (tokens, logits), (fla_tokens, fla_logits) in zip(results["torch"], results["fla"]):
        assert fla_tokens == tokens
        torch.testing.assert_close(fla_logits, logits, atol=1e-4, rtol=1e-4)
