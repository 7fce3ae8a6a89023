"""Choosing the decode kernels, and the engine on the Triton kernels (interpreted on a CPU)."""
import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before the kernels are defined

from engine import LLM, SamplingParams  # noqa: E402
from kernels import backend  # noqa: E402
from kernels.backend import BACKEND_ENV, AttentionBackendError, attention_ops  # noqa: E402
from tests.helpers.tiny_models import make_tiny_model  # noqa: E402

CPU = torch.device("cpu")
DEVICE = torch.device("cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda")


@pytest.fixture(autouse=True)
def fresh_choice():
    backend._ops_for.cache_clear()
    yield
    backend._ops_for.cache_clear()


def test_the_fused_cpu_kernels_serve_the_cpu_by_default_and_torch_on_request(monkeypatch):
    from kernels.cpu import native_attention

    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert attention_ops(CPU).name == ("native" if native_attention.available() else "sdpa")
    for name in ("sdpa", "torch"):
        monkeypatch.setenv(BACKEND_ENV, name)
        assert attention_ops(CPU).name == name


def test_an_unknown_backend_says_what_to_use(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "cuda")
    with pytest.raises(AttentionBackendError, match="use native, sdpa, torch or triton"):
        attention_ops(CPU)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv(BACKEND_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(AttentionBackendError, match="TRITON_INTERPRET=1"):
        attention_ops(CPU)


def test_engine_on_triton_kernels_gives_the_same_greedy_tokens_and_logits(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 needs a GPU")
    from kernels.triton import attention as triton_attention

    shared_calls = []
    real_prefix_attention = triton_attention.prefix_attention
    monkeypatch.setattr(triton_attention, "prefix_attention",
                        lambda *args, **kw: shared_calls.append(1) or real_prefix_attention(*args, **kw))
    from kernels.cpu import cascade_prefill

    shared_prefills = []
    real_prefill = cascade_prefill.prefill_attention
    monkeypatch.setattr(cascade_prefill, "prefill_attention",
                        lambda *args, **kw: shared_prefills.append(1) or real_prefill(*args, **kw))
    folder = str(make_tiny_model(tmp_path / "llama", "llama"))
    runs = {}
    names = ("torch", "triton", "sdpa", "native") if DEVICE.type == "cpu" else ("torch", "triton")
    for name in names:
        monkeypatch.setenv(BACKEND_ENV, name)
        assert attention_ops(DEVICE).name == name
        runs[name] = greedy_swarm(LLM(folder, device=DEVICE.type, dtype="float32", kv_budget_tokens=512))
    for name in names[1:]:
        assert runs[name][0] == runs["torch"][0]
        torch.testing.assert_close(runs[name][1], runs["torch"][1], atol=1e-5, rtol=1e-5)
    assert shared_calls, "the trunk should go through the Triton shared-prefix kernel"
    assert shared_prefills or DEVICE.type != "cpu", "on sdpa, the suffixes should read the cached trunk together"


def greedy_swarm(llm: LLM, agents: int = 3, steps: int = 4):
    """Three agents on a 70-token trunk (4 full blocks shared: cascade decode); tokens and logits."""
    rng = random.Random(0)
    trunk = [rng.randrange(4, 300) for _ in range(70)]
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    seqs = [llm.engine.add_request(trunk + [10 + i, rng.randrange(4, 300)], params) for i in range(agents)]
    logits = []
    while not all(seq.is_finished for seq in seqs):
        result = llm.engine.step()
        logits += list(result.logits) if result.logits is not None else []
    return [seq.output_token_ids for seq in seqs], torch.stack(logits)
